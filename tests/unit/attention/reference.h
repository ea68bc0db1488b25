// A naive attention in double precision, written from the definitions
// (every logit of a row, then the softmax), with its own mask code: what the
// blocked kernels are checked against. And a random test case generator.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "dew/attention.h"

namespace dew::attention::testing {

// A test problem: shapes, mask and the tensors, held in double.
struct Case {
  Dims dims;
  bool causal = false;
  std::optional<Window> window;
  std::vector<std::int32_t> query_segments, key_segments;    // batch x length, or empty
  std::vector<std::int64_t> query_positions, key_positions;  // or empty: 0..n-1
  std::int64_t whole_query_length = -1, whole_key_length = -1;
  bool bias = false;  // dense bias batch x heads x lq x lk
  bool sinks = false;
  double scale = 0;
  int query_block = 16;
  int key_block = 16;
  std::vector<double> q, k, v, b, s, d_out;
};

inline std::int64_t count(const Dims& d, int heads, std::int64_t length) {
  return static_cast<std::int64_t>(d.batch) * heads * length * d.head_dim;
}

// Fills the tensors with uniform values in [-range, range); the seed fixes them.
inline void fill(Case& c, unsigned seed, double range = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-range, range);
  auto make = [&](std::int64_t n) {
    std::vector<double> x(static_cast<std::size_t>(n));
    for (double& e : x) e = static_cast<double>(static_cast<float>(u(gen)));  // exact in float too
    return x;
  };
  const Dims& d = c.dims;
  c.q = make(count(d, d.heads, d.query_length));
  c.k = make(count(d, d.kv_heads, d.key_length));
  c.v = make(count(d, d.kv_heads, d.key_length));
  c.d_out = make(count(d, d.heads, d.query_length));
  c.b = c.bias ? make(static_cast<std::int64_t>(d.batch) * d.heads * d.query_length * d.key_length)
               : std::vector<double>{};
  c.s = c.sinks ? make(d.heads) : std::vector<double>{};
}

inline double scale_of(const Case& c) { return c.scale == 0 ? 1.0 / std::sqrt(double(c.dims.head_dim)) : c.scale; }

// The mask rule, written again from its definition.
inline bool ref_allowed(const Case& c, int batch, std::int64_t i, std::int64_t j) {
  const std::int64_t wq = c.whole_query_length < 0 ? c.dims.query_length : c.whole_query_length;
  const std::int64_t wk = c.whole_key_length < 0 ? c.dims.key_length : c.whole_key_length;
  const std::int64_t qp = c.query_positions.empty() ? i : c.query_positions[std::size_t(i)];
  const std::int64_t kp = c.key_positions.empty() ? j : c.key_positions[std::size_t(j)];
  const std::int64_t aligned = qp + wk - wq;
  if (c.causal && kp > aligned) return false;
  if (c.window && (kp < aligned - c.window->left || kp > aligned + c.window->right)) return false;
  if (!c.query_segments.empty() && c.query_segments[std::size_t(batch * c.dims.query_length + i)] !=
                                       c.key_segments[std::size_t(batch * c.dims.key_length + j)])
    return false;
  return true;
}

struct Outputs {
  std::vector<double> out, lse;
};
struct Grads {
  std::vector<double> dq, dk, dv, ds;
};

// Per row: logits of the allowed keys, softmax with the sink, output.
inline Outputs reference_forward(const Case& c) {
  const Dims& d = c.dims;
  const std::int64_t lq = d.query_length, lk = d.key_length, hd = d.head_dim;
  const double scale = scale_of(c);
  const int group = d.heads / d.kv_heads;
  Outputs r;
  r.out.assign(std::size_t(count(d, d.heads, lq)), 0.0);
  r.lse.assign(std::size_t(static_cast<std::int64_t>(d.batch) * d.heads * lq), 0.0);
  std::vector<double> x(static_cast<std::size_t>(lk));
  std::vector<bool> ok(static_cast<std::size_t>(lk));
  for (int b = 0; b < d.batch; ++b)
    for (int h = 0; h < d.heads; ++h) {
      const int g = h / group;
      for (std::int64_t i = 0; i < lq; ++i) {
        const double* q = &c.q[std::size_t(((std::int64_t(b) * d.heads + h) * lq + i) * hd)];
        double m = c.sinks ? c.s[std::size_t(h)] : -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < lk; ++j) {
          ok[std::size_t(j)] = ref_allowed(c, b, i, j);
          if (!ok[std::size_t(j)]) continue;
          const double* k = &c.k[std::size_t(((std::int64_t(b) * d.kv_heads + g) * lk + j) * hd)];
          double dot = 0;
          for (std::int64_t e = 0; e < hd; ++e) dot += q[e] * k[e];
          x[std::size_t(j)] =
              scale * dot + (c.bias ? c.b[std::size_t(((std::int64_t(b) * d.heads + h) * lq + i) * lk + j)] : 0.0);
          m = std::max(m, x[std::size_t(j)]);
        }
        double* o = &r.out[std::size_t(((std::int64_t(b) * d.heads + h) * lq + i) * hd)];
        double& lse = r.lse[std::size_t((std::int64_t(b) * d.heads + h) * lq + i)];
        if (m == -std::numeric_limits<double>::infinity()) {
          lse = m;
          continue;
        }
        double l = c.sinks ? std::exp(c.s[std::size_t(h)] - m) : 0.0;
        for (std::int64_t j = 0; j < lk; ++j)
          if (ok[std::size_t(j)]) l += std::exp(x[std::size_t(j)] - m);
        for (std::int64_t j = 0; j < lk; ++j) {
          if (!ok[std::size_t(j)]) continue;
          const double p = std::exp(x[std::size_t(j)] - m) / l;
          const double* v = &c.v[std::size_t(((std::int64_t(b) * d.kv_heads + g) * lk + j) * hd)];
          for (std::int64_t e = 0; e < hd; ++e) o[e] += p * v[e];
        }
        lse = m + std::log(l);
      }
    }
  return r;
}

// The gradient of sum(out o d_out), from P = exp(logit - lse).
inline Grads reference_backward(const Case& c, const Outputs& fwd) {
  const Dims& d = c.dims;
  const std::int64_t lq = d.query_length, lk = d.key_length, hd = d.head_dim;
  const double scale = scale_of(c);
  const int group = d.heads / d.kv_heads;
  Grads g;
  g.dq.assign(c.q.size(), 0.0);
  g.dk.assign(c.k.size(), 0.0);
  g.dv.assign(c.v.size(), 0.0);
  g.ds.assign(std::size_t(d.heads), 0.0);
  for (int b = 0; b < d.batch; ++b)
    for (int h = 0; h < d.heads; ++h) {
      const int kh = h / group;
      for (std::int64_t i = 0; i < lq; ++i) {
        const std::size_t row = std::size_t((std::int64_t(b) * d.heads + h) * lq + i);
        const double lse = fwd.lse[row];
        if (lse == -std::numeric_limits<double>::infinity()) continue;
        const double* q = &c.q[row * std::size_t(hd)];
        const double* o = &fwd.out[row * std::size_t(hd)];
        const double* dout = &c.d_out[row * std::size_t(hd)];
        double delta = 0;
        for (std::int64_t e = 0; e < hd; ++e) delta += o[e] * dout[e];
        if (c.sinks) g.ds[std::size_t(h)] -= std::exp(c.s[std::size_t(h)] - lse) * delta;
        for (std::int64_t j = 0; j < lk; ++j) {
          if (!ref_allowed(c, b, i, j)) continue;
          const std::size_t col = std::size_t(((std::int64_t(b) * d.kv_heads + kh) * lk + j) * hd);
          const double* k = &c.k[col];
          const double* v = &c.v[col];
          double dot = 0, dp = 0;
          for (std::int64_t e = 0; e < hd; ++e) {
            dot += q[e] * k[e];
            dp += dout[e] * v[e];
          }
          const double x = scale * dot + (c.bias ? c.b[row * std::size_t(lk) + std::size_t(j)] : 0.0);
          const double p = std::exp(x - lse);
          const double ds = p * (dp - delta);
          for (std::int64_t e = 0; e < hd; ++e) {
            g.dq[row * std::size_t(hd) + std::size_t(e)] += scale * ds * k[e];
            g.dk[col + std::size_t(e)] += scale * ds * q[e];
            g.dv[col + std::size_t(e)] += p * dout[e];
          }
        }
      }
    }
  return g;
}

template <typename T>
std::vector<T> as(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

// The case's tensors in T, and the kernel's inputs pointing into them.
template <typename T>
struct Bound {
  std::vector<T> q, k, v, b, s, d_out;
  Inputs<T> inputs;
  explicit Bound(const Case& c)
      : q(as<T>(c.q)), k(as<T>(c.k)), v(as<T>(c.v)), b(as<T>(c.b)), s(as<T>(c.s)), d_out(as<T>(c.d_out)) {
    inputs.dims = c.dims;
    inputs.query = q.data();
    inputs.key = k.data();
    inputs.value = v.data();
    inputs.mask.causal = c.causal;
    inputs.mask.window = c.window;
    inputs.mask.query_segments = c.query_segments;
    inputs.mask.key_segments = c.key_segments;
    inputs.mask.positions = {c.query_positions, c.key_positions, c.whole_query_length, c.whole_key_length};
    if (c.bias) inputs.bias.data = b.data();
    if (c.sinks) inputs.sinks = s.data();
    inputs.scale = c.scale;
    inputs.query_block = c.query_block;
    inputs.key_block = c.key_block;
  }
  Bound(const Bound&) = delete;  // inputs point into this object
  Bound& operator=(const Bound&) = delete;
};

// max |a - b| / max |b| (normwise), 0 when both are zero; infinity on any
// non-finite mismatch.
template <typename T>
double relative_error(const std::vector<T>& a, const std::vector<double>& b) {
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    const double x = static_cast<double>(a[i]);
    if (std::isinf(b[i]) || std::isinf(x)) {
      if (x != b[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (std::isnan(x)) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::abs(x - b[i]));
    norm = std::max(norm, std::abs(b[i]));
  }
  return norm == 0 ? err : err / norm;
}

// Segment ids: documents of the given lengths, repeated to cover n, one
// layout per batch entry (shifted by the entry's index).
inline std::vector<std::int32_t> documents(int batch, std::int64_t n, const std::vector<int>& lengths) {
  std::vector<std::int32_t> ids;
  for (int b = 0; b < batch; ++b) {
    std::int32_t id = 0;
    std::size_t which = std::size_t(b) % lengths.size();
    int left = lengths[which];
    for (std::int64_t i = 0; i < n; ++i) {
      if (left == 0) {
        ++id;
        which = (which + 1) % lengths.size();
        left = lengths[which];
      }
      ids.push_back(id);
      --left;
    }
  }
  return ids;
}

}  // namespace dew::attention::testing
