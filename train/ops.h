// The model's arithmetic on one device, pure: matrix products (OpenBLAS),
// RMSNorm, SiLU and cross-entropy, each forward and backward, over row-major
// matrices. Private to train/.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace dew::train {

// C (m x n) = alpha * op(A) * op(B) + beta * C, row-major; op transposes
// when asked. A is m x k (k x m transposed), B is k x n (n x k transposed).
template <typename T>
void gemm(bool transpose_a, bool transpose_b, int m, int n, int k, T alpha, const T* a, const T* b, T beta, T* c);

// y = x / sqrt(mean(x^2) + eps) * gain, row by row over `rows` rows of
// `width`; keeps each row's 1 / rms for the backward.
template <typename T>
void rmsnorm_forward(std::span<const T> x, std::span<const T> gain, int rows, int width, std::span<T> y,
                     std::span<T> inverse_rms);
// dx (overwritten) and d_gain (added to) from dy.
template <typename T>
void rmsnorm_backward(std::span<const T> x, std::span<const T> gain, std::span<const T> inverse_rms,
                      std::span<const T> dy, int rows, int width, std::span<T> dx, std::span<T> d_gain);

template <typename T>
void silu_forward(std::span<const T> u, std::span<T> out);
// du = dout * silu'(u).
template <typename T>
void silu_backward(std::span<const T> u, std::span<const T> dout, std::span<T> du);

// Cross-entropy of `rows` rows of logits against targets, each row's
// gradient (softmax - one hot) scaled by `scale` into d_logits; returns the
// sum of the rows' losses (natural log), accumulated in double.
template <typename T>
double cross_entropy(std::span<const T> logits, std::span<const int> targets, int rows, int classes, T scale,
                     std::span<T> d_logits);

}  // namespace dew::train
