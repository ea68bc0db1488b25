#include "ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

namespace dew::train {

template <>
void gemm<float>(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a, const float* b,
                 float beta, float* c) {
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, m, n, k,
              alpha, a, transpose_a ? m : k, b, transpose_b ? k : n, beta, c, n);
}

template <>
void gemm<double>(bool transpose_a, bool transpose_b, int m, int n, int k, double alpha, const double* a,
                  const double* b, double beta, double* c) {
  cblas_dgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, m, n, k,
              alpha, a, transpose_a ? m : k, b, transpose_b ? k : n, beta, c, n);
}

namespace {
constexpr double kNormEpsilon = 1e-6;
}

template <typename T>
void rmsnorm_forward(std::span<const T> x, std::span<const T> gain, int rows, int width, std::span<T> y,
                     std::span<T> inverse_rms) {
  for (int r = 0; r < rows; ++r) {
    const T* row = x.data() + std::size_t(r) * width;
    double squares = 0;
    for (int i = 0; i < width; ++i) squares += double(row[i]) * row[i];
    const T inv = T(1.0 / std::sqrt(squares / width + kNormEpsilon));
    inverse_rms[r] = inv;
    for (int i = 0; i < width; ++i) y[std::size_t(r) * width + i] = row[i] * inv * gain[i];
  }
}

// With n = x * inv (the normalized row): dx = inv * (g*dy - n * mean(n * g*dy)).
template <typename T>
void rmsnorm_backward(std::span<const T> x, std::span<const T> gain, std::span<const T> inverse_rms,
                      std::span<const T> dy, int rows, int width, std::span<T> dx, std::span<T> d_gain) {
  for (int r = 0; r < rows; ++r) {
    const std::size_t at = std::size_t(r) * width;
    const T inv = inverse_rms[r];
    double dot = 0;
    for (int i = 0; i < width; ++i) {
      const T n = x[at + i] * inv;
      d_gain[i] += dy[at + i] * n;
      dot += double(n) * gain[i] * dy[at + i];
    }
    const T mean = T(dot / width);
    for (int i = 0; i < width; ++i) {
      const T n = x[at + i] * inv;
      dx[at + i] = inv * (gain[i] * dy[at + i] - n * mean);
    }
  }
}

template <typename T>
void silu_forward(std::span<const T> u, std::span<T> out) {
  for (std::size_t i = 0; i < u.size(); ++i) out[i] = u[i] / (T(1) + std::exp(-u[i]));
}

template <typename T>
void silu_backward(std::span<const T> u, std::span<const T> dout, std::span<T> du) {
  for (std::size_t i = 0; i < u.size(); ++i) {
    const T s = T(1) / (T(1) + std::exp(-u[i]));
    du[i] = dout[i] * s * (T(1) + u[i] * (T(1) - s));
  }
}

template <typename T>
double cross_entropy(std::span<const T> logits, std::span<const int> targets, int rows, int classes, T scale,
                     std::span<T> d_logits) {
  double total = 0;
  for (int r = 0; r < rows; ++r) {
    const T* row = logits.data() + std::size_t(r) * classes;
    T* grad = d_logits.data() + std::size_t(r) * classes;
    const T top = *std::max_element(row, row + classes);
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(double(row[c] - top));
    const double log_sum = std::log(sum) + top;
    total += log_sum - row[targets[r]];
    for (int c = 0; c < classes; ++c) grad[c] = T(std::exp(double(row[c]) - log_sum)) * scale;
    grad[targets[r]] -= scale;
  }
  return total;
}

#define DEW_TRAIN_OPS(T)                                                                                            \
  template void rmsnorm_forward<T>(std::span<const T>, std::span<const T>, int, int, std::span<T>, std::span<T>);   \
  template void rmsnorm_backward<T>(std::span<const T>, std::span<const T>, std::span<const T>, std::span<const T>, \
                                    int, int, std::span<T>, std::span<T>);                                          \
  template void silu_forward<T>(std::span<const T>, std::span<T>);                                                  \
  template void silu_backward<T>(std::span<const T>, std::span<const T>, std::span<T>);                             \
  template double cross_entropy<T>(std::span<const T>, std::span<const int>, int, int, T, std::span<T>);
DEW_TRAIN_OPS(float)
DEW_TRAIN_OPS(double)
#undef DEW_TRAIN_OPS

}  // namespace dew::train
