// The softmax's elementwise passes over one block row, vectorized with AVX2
// where the CPU has it (chosen once at run time), plain loops elsewhere.
// Internal to the attention library.
#pragma once

#include <cstdint>

namespace dew::attention::detail {

// The largest entry of row[0, n); -infinity for n == 0 or an all -inf row.
float row_max(const float* row, std::int64_t n);

// row[j] = exp(row[j] - shift) in place; returns their sum. Entries of -inf
// become 0. shift must be finite.
float exp_shift_sum(float* row, std::int64_t n, float shift);

// Whether the AVX2 path is in use (for the benchmark's report).
bool vectorized();

}  // namespace dew::attention::detail
