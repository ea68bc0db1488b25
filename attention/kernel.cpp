// The blocked attention kernel (FlashAttention's schedule on the CPU).
//
// Forward, per (batch, query head, query block): logits S = scale Q K^T for
// one key block at a time (sgemm), bias added, the mask applied where the
// block is cut, then the online softmax: the running row maximum m, the
// running denominator l and the unnormalized output acc, rescaled by
// exp(m_old - m_new) whenever the maximum grows; acc += P V (sgemm). The sink
// joins the denominator at the end. Blocks the mask removes are never
// computed.
//
// Backward, per (batch, key head, key block), over the query heads of its
// group and their query blocks: P = exp(S - lse) recomputed, dV += P^T dO,
// dP = dO V^T, dS = P (dP - rowsum(dO o O)), dK += scale dS^T Q,
// dQ += scale dS K; the sink's gradient is -sum exp(sink - lse) rowsum(dO o O).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "dew/attention.h"
#include "mask.h"
#include "simd.h"

namespace dew::attention {
namespace {

using detail::BlockKind;
using detail::MaskPlan;

template <typename T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
          std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  const auto i = [](std::int64_t v) { return static_cast<blasint>(v); };
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
  }
}

template <typename T>
constexpr T kMinusInf = -std::numeric_limits<T>::infinity();

template <typename T>
T row_max(const T* row, std::int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return detail::row_max(row, n);
  } else {
    T m = kMinusInf<T>;
    for (std::int64_t j = 0; j < n; ++j) m = std::max(m, row[j]);
    return m;
  }
}

// row = exp(row - shift), returning the sum; -inf entries give 0.
template <typename T>
T exp_shift_sum(T* row, std::int64_t n, T shift) {
  if constexpr (std::is_same_v<T, float>) {
    return detail::exp_shift_sum(row, n, shift);
  } else {
    T sum = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      row[j] = std::exp(row[j] - shift);
      sum += row[j];
    }
    return sum;
  }
}

// Everything forward and backward share after validation.
template <typename T>
struct Prepared {
  const Inputs<T>& in;
  MaskPlan plan;
  std::int64_t lq, lk, d;
  int group;
  T scale;
  const T* bias = nullptr;
  std::int64_t bias_batch = 0, bias_head = 0, bias_row = 0;

  std::int64_t q_offset(int b, int h) const { return ((static_cast<std::int64_t>(b) * in.dims.heads + h) * lq) * d; }
  std::int64_t kv_offset(int b, int g) const {
    return ((static_cast<std::int64_t>(b) * in.dims.kv_heads + g) * lk) * d;
  }
  std::int64_t row_offset(int b, int h) const { return (static_cast<std::int64_t>(b) * in.dims.heads + h) * lq; }

  // S (nq x nk, leading dimension nk) = scale Q_blk K_blk^T + bias, masked.
  void logits(int b, int h, int g, std::int64_t q0, std::int64_t nq, std::int64_t k0, std::int64_t nk, BlockKind kind,
              T* s) const {
    gemm<T>(false, true, nq, nk, d, scale, in.query + q_offset(b, h) + q0 * d, d, in.key + kv_offset(b, g) + k0 * d, d,
            T(0), s, nk);
    if (bias != nullptr) {
      const T* base = bias + b * bias_batch + h * bias_head + q0 * bias_row + k0;
      for (std::int64_t i = 0; i < nq; ++i) {
        const T* brow = base + i * bias_row;
        T* srow = s + i * nk;
        for (std::int64_t j = 0; j < nk; ++j) srow[j] += brow[j];
      }
    }
    if (kind == BlockKind::kPartial) {
      for (std::int64_t i = 0; i < nq; ++i) plan.mask_row(q0 + i, k0, nk, s + i * nk);
    }
  }
};

std::string size_text(std::int64_t v) { return std::to_string(v); }

template <typename T>
Result<Prepared<T>> prepare(const Inputs<T>& in) {
  auto plan = MaskPlan::make(in.mask, in.dims, in.query_block, in.key_block);
  if (!plan.ok()) return plan.error();
  const bool no_queries = in.dims.query_length == 0, no_keys = in.dims.key_length == 0;
  if ((in.query == nullptr && !no_queries) || ((in.key == nullptr || in.value == nullptr) && !no_keys)) {
    return invalid_argument("attention: query, key and value must all be given (a null pointer was passed)");
  }
  if (!(in.scale >= 0) || !std::isfinite(in.scale)) {
    return invalid_argument("attention: scale " + std::to_string(in.scale) +
                            " is not allowed; allowed: a finite number > 0, or 0 for 1/sqrt(head_dim)");
  }
  const Dims& dims = in.dims;
  const std::int64_t lq = dims.query_length, lk = dims.key_length;
  Prepared<T> call{in,
                   std::move(plan.value()),
                   lq,
                   lk,
                   dims.head_dim,
                   dims.heads / dims.kv_heads,
                   static_cast<T>(in.scale == 0 ? 1.0 / std::sqrt(static_cast<double>(dims.head_dim)) : in.scale)};
  if (in.bias.data != nullptr) {
    const auto& bias = in.bias;
    if (bias.batch_stride < -1 || bias.head_stride < -1 || bias.row_stride < -1) {
      return invalid_argument("attention: bias strides " + size_text(bias.batch_stride) + ", " +
                              size_text(bias.head_stride) + ", " + size_text(bias.row_stride) +
                              " are not allowed; allowed: >= 0, or -1 for the dense layout");
    }
    call.bias = bias.data;
    call.bias_row = bias.row_stride == -1 ? lk : bias.row_stride;
    call.bias_head = bias.head_stride == -1 ? lq * lk : bias.head_stride;
    call.bias_batch = bias.batch_stride == -1 ? dims.heads * lq * lk : bias.batch_stride;
  }
  return call;
}

}  // namespace

template <typename T>
Result<Stats> forward(const Inputs<T>& in, T* out, T* lse) {
  auto prepared = prepare(in);
  if (!prepared.ok()) return prepared.error();
  if (out == nullptr && in.dims.query_length > 0) {
    return invalid_argument("attention: forward needs an output (a null pointer was passed)");
  }
  Prepared<T>& call = prepared.value();
  MaskPlan& plan = call.plan;
  const Dims& dims = in.dims;
  const std::int64_t d = call.d;
  const std::int64_t bq = plan.query_block(), bk = plan.key_block();
  std::vector<T> s(static_cast<std::size_t>(std::min(bq, std::max<std::int64_t>(call.lq, 1)) *
                                            std::min(bk, std::max<std::int64_t>(call.lk, 1))));
  std::vector<T> acc(static_cast<std::size_t>(std::min(bq, std::max<std::int64_t>(call.lq, 1)) * d));
  std::vector<T> m(static_cast<std::size_t>(bq)), l(static_cast<std::size_t>(bq));
  Stats stats;

  for (int b = 0; b < dims.batch; ++b) {
    plan.set_batch(b);
    for (int h = 0; h < dims.heads; ++h) {
      const int g = h / call.group;
      const T* v = in.value + call.kv_offset(b, g);
      for (std::int64_t qb = 0; qb < plan.query_blocks(); ++qb) {
        const std::int64_t q0 = qb * bq, nq = std::min(bq, call.lq - q0);
        std::fill(m.begin(), m.end(), kMinusInf<T>);
        std::fill(l.begin(), l.end(), T(0));
        std::fill(acc.begin(), acc.end(), T(0));
        for (std::int64_t kb = 0; kb < plan.key_blocks(); ++kb) {
          const BlockKind kind = plan.classify(qb, kb);
          if (kind == BlockKind::kSkip) {
            ++stats.skipped;
            continue;
          }
          ++(kind == BlockKind::kPartial ? stats.partial : stats.full);
          const std::int64_t k0 = kb * bk, nk = std::min(bk, call.lk - k0);
          call.logits(b, h, g, q0, nq, k0, nk, kind, s.data());
          for (std::int64_t i = 0; i < nq; ++i) {
            T* srow = s.data() + i * nk;
            const T m_new = std::max(m[i], row_max(srow, nk));
            if (m_new == kMinusInf<T>) {  // nothing allowed yet in this row
              std::fill(srow, srow + nk, T(0));
              continue;
            }
            const T alpha = std::exp(m[i] - m_new);  // 0 when m[i] is -inf
            l[i] = l[i] * alpha + exp_shift_sum(srow, nk, m_new);
            m[i] = m_new;
            if (alpha != T(1)) {
              T* arow = acc.data() + i * d;
              for (std::int64_t e = 0; e < d; ++e) arow[e] *= alpha;
            }
          }
          gemm<T>(false, false, nq, d, nk, T(1), s.data(), nk, v + k0 * d, d, T(1), acc.data(), d);
        }
        // Finish the rows: the sink joins the denominator.
        T* o = out + call.q_offset(b, h) + q0 * d;
        for (std::int64_t i = 0; i < nq; ++i) {
          T mi = m[i], li = l[i], ratio = T(1);
          if (in.sinks != nullptr) {
            const T sink = in.sinks[h];
            const T m_f = std::max(mi, sink);
            ratio = std::exp(mi - m_f);  // 0 when no key was allowed
            li = li * ratio + std::exp(sink - m_f);
            mi = m_f;
          }
          const T* arow = acc.data() + i * d;
          T* orow = o + i * d;
          if (mi == kMinusInf<T>) {  // no key and no sink
            std::fill(orow, orow + d, T(0));
            if (lse != nullptr) lse[call.row_offset(b, h) + q0 + i] = kMinusInf<T>;
            continue;
          }
          const T factor = ratio / li;
          for (std::int64_t e = 0; e < d; ++e) orow[e] = arow[e] * factor;
          if (lse != nullptr) lse[call.row_offset(b, h) + q0 + i] = mi + std::log(li);
        }
      }
    }
  }
  return stats;
}

template <typename T>
Result<Stats> backward(const Inputs<T>& in, const T* out, const T* lse, const T* d_out, const Gradients<T>& grads) {
  auto prepared = prepare(in);
  if (!prepared.ok()) return prepared.error();
  const bool no_queries = in.dims.query_length == 0, no_keys = in.dims.key_length == 0;
  if (((out == nullptr || lse == nullptr || d_out == nullptr || grads.query == nullptr) && !no_queries) ||
      ((grads.key == nullptr || grads.value == nullptr) && !no_keys)) {
    return invalid_argument(
        "attention: backward needs out, lse, d_out and the query, key and value gradients (a null "
        "pointer was passed)");
  }
  if (grads.sinks != nullptr && in.sinks == nullptr) {
    return invalid_argument(
        "attention: a sinks gradient was asked for a call without sinks; allowed: d_sinks only with sinks");
  }
  Prepared<T>& call = prepared.value();
  MaskPlan& plan = call.plan;
  const Dims& dims = in.dims;
  const std::int64_t d = call.d, lq = call.lq, lk = call.lk;
  const std::int64_t bq = plan.query_block(), bk = plan.key_block();
  const std::int64_t nq_max = std::min(bq, std::max<std::int64_t>(lq, 1));
  const std::int64_t nk_max = std::min(bk, std::max<std::int64_t>(lk, 1));
  std::vector<T> p(static_cast<std::size_t>(nq_max * nk_max)), dp(p.size());
  std::vector<T> dk(static_cast<std::size_t>(nk_max * d)), dv(dk.size());
  std::vector<T> delta(static_cast<std::size_t>(call.group * lq));  // rowsum(dO o O) per head of the group
  Stats stats;

  std::fill(grads.query, grads.query + static_cast<std::int64_t>(dims.batch) * dims.heads * lq * d, T(0));
  if (grads.sinks != nullptr) std::fill(grads.sinks, grads.sinks + dims.heads, T(0));

  for (int b = 0; b < dims.batch; ++b) {
    plan.set_batch(b);
    for (int g = 0; g < dims.kv_heads; ++g) {
      const int h0 = g * call.group;
      for (int hh = 0; hh < call.group; ++hh) {
        const int h = h0 + hh;
        const T* o = out + call.q_offset(b, h);
        const T* dout = d_out + call.q_offset(b, h);
        const T* row_lse = lse + call.row_offset(b, h);
        for (std::int64_t i = 0; i < lq; ++i) {
          T sum = 0;
          for (std::int64_t e = 0; e < d; ++e) sum += o[i * d + e] * dout[i * d + e];
          delta[static_cast<std::size_t>(hh * lq + i)] = sum;
          if (grads.sinks != nullptr && row_lse[i] != kMinusInf<T>)
            grads.sinks[h] -= std::exp(in.sinks[h] - row_lse[i]) * sum;
        }
      }
      const T* k = in.key + call.kv_offset(b, g);
      const T* v = in.value + call.kv_offset(b, g);
      for (std::int64_t kb = 0; kb < plan.key_blocks(); ++kb) {
        const std::int64_t k0 = kb * bk, nk = std::min(bk, lk - k0);
        std::fill(dk.begin(), dk.end(), T(0));
        std::fill(dv.begin(), dv.end(), T(0));
        for (int hh = 0; hh < call.group; ++hh) {
          const int h = h0 + hh;
          const T* q = in.query + call.q_offset(b, h);
          const T* dout = d_out + call.q_offset(b, h);
          T* dq = grads.query + call.q_offset(b, h);
          const T* row_lse = lse + call.row_offset(b, h);
          for (std::int64_t qb = 0; qb < plan.query_blocks(); ++qb) {
            const BlockKind kind = plan.classify(qb, kb);
            if (kind == BlockKind::kSkip) {
              ++stats.skipped;
              continue;
            }
            ++(kind == BlockKind::kPartial ? stats.partial : stats.full);
            const std::int64_t q0 = qb * bq, nq = std::min(bq, lq - q0);
            call.logits(b, h, g, q0, nq, k0, nk, kind, p.data());
            for (std::int64_t i = 0; i < nq; ++i) {
              T* prow = p.data() + i * nk;
              const T row = row_lse[q0 + i];
              if (row == kMinusInf<T>) {
                std::fill(prow, prow + nk, T(0));
              } else {
                exp_shift_sum(prow, nk, row);
              }
            }
            gemm<T>(true, false, nk, d, nq, T(1), p.data(), nk, dout + q0 * d, d, T(1), dv.data(), d);
            gemm<T>(false, true, nq, nk, d, T(1), dout + q0 * d, d, v + k0 * d, d, T(0), dp.data(), nk);
            for (std::int64_t i = 0; i < nq; ++i) {
              const T di = delta[static_cast<std::size_t>(hh * lq + q0 + i)];
              const T* prow = p.data() + i * nk;
              T* dsrow = dp.data() + i * nk;
              for (std::int64_t j = 0; j < nk; ++j) dsrow[j] = prow[j] * (dsrow[j] - di);
            }
            gemm<T>(true, false, nk, d, nq, call.scale, dp.data(), nk, q + q0 * d, d, T(1), dk.data(), d);
            gemm<T>(false, false, nq, d, nk, call.scale, dp.data(), nk, k + k0 * d, d, T(1), dq + q0 * d, d);
          }
        }
        std::copy(dk.begin(), dk.begin() + nk * d, grads.key + call.kv_offset(b, g) + k0 * d);
        std::copy(dv.begin(), dv.begin() + nk * d, grads.value + call.kv_offset(b, g) + k0 * d);
      }
    }
  }
  // Key blocks of a call with no keys write nothing; zero-length keys mean
  // no gradients to write at all.
  return stats;
}

template Result<Stats> forward<float>(const Inputs<float>&, float*, float*);
template Result<Stats> forward<double>(const Inputs<double>&, double*, double*);
template Result<Stats> backward<float>(const Inputs<float>&, const float*, const float*, const float*,
                                       const Gradients<float>&);
template Result<Stats> backward<double>(const Inputs<double>&, const double*, const double*, const double*,
                                        const Gradients<double>&);

}  // namespace dew::attention
