// exp over a block row: a degree-7 Taylor polynomial on the reduced argument
// r = x - n ln 2 (|r| <= ln2 / 2, truncation below 1e-8 relative), scaled by
// 2^n through the exponent bits. Arguments below -87 give 0, which also
// covers -inf (masked logits).
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dew::attention::detail {
namespace {

float row_max_plain(const float* row, std::int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < n; ++j) m = std::max(m, row[j]);
  return m;
}

float exp_shift_sum_plain(float* row, std::int64_t n, float shift) {
  float sum = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    row[j] = std::exp(row[j] - shift);
    sum += row[j];
  }
  return sum;
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) float row_max_avx2(const float* row, std::int64_t n) {
  __m256 m8 = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(row + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m8);
  float m = lanes[0];
  for (int k = 1; k < 8; ++k) m = std::max(m, lanes[k]);
  for (; j < n; ++j) m = std::max(m, row[j]);
  return m;
}

__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.0f);
  const __m256 keep = _mm256_cmp_ps(x, lowest, _CMP_GE_OQ);  // false for -inf and below
  x = _mm256_min_ps(_mm256_max_ps(x, lowest), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n ln2, ln2 in two parts so n * ln2_hi is exact.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606820309417232e-6f), r);
  // 1 + r + r^2/2! + ... + r^7/7!, Horner.
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), keep);
}

__attribute__((target("avx2,fma"))) float exp_shift_sum_avx2(float* row, std::int64_t n, float shift) {
  const __m256 s8 = _mm256_set1_ps(shift);
  __m256 sum8 = _mm256_setzero_ps();
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), s8));
    _mm256_storeu_ps(row + j, e);
    sum8 = _mm256_add_ps(sum8, e);
  }
  if (j < n) {
    alignas(32) float tail[8];
    const std::int64_t rest = n - j;
    for (std::int64_t k = 0; k < 8; ++k) tail[k] = k < rest ? row[j + k] : -std::numeric_limits<float>::infinity();
    const __m256 e = exp8(_mm256_sub_ps(_mm256_load_ps(tail), s8));
    _mm256_store_ps(tail, e);
    sum8 = _mm256_add_ps(sum8, e);
    for (std::int64_t k = 0; k < rest; ++k) row[j + k] = tail[k];
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum8);
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

bool cpu_has_avx2() {
  __builtin_cpu_init();  // this may run before libgcc's own constructor
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#else
bool cpu_has_avx2() { return false; }
#endif

const bool kAvx2 = cpu_has_avx2();

}  // namespace

float row_max(const float* row, std::int64_t n) {
#if defined(__x86_64__)
  if (kAvx2) return row_max_avx2(row, n);
#endif
  return row_max_plain(row, n);
}

float exp_shift_sum(float* row, std::int64_t n, float shift) {
#if defined(__x86_64__)
  if (kAvx2) return exp_shift_sum_avx2(row, n, shift);
#endif
  return exp_shift_sum_plain(row, n, shift);
}

bool vectorized() { return kAvx2; }

}  // namespace dew::attention::detail
