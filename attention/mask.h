// Validation and the mask's block classification, shared by the forward and
// backward kernels. Internal to the attention library.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "dew/attention.h"

namespace dew::attention::detail {

// One-line errors for dimensions, block sizes and the mask's arrays.
std::optional<Error> check_dims(const Dims& dims);

enum class BlockKind { kSkip, kPartial, kFull };

// The mask of one call over query blocks x key blocks: positions aligned,
// per-block bounds, and the segment bounds of the batch entry in use.
class MaskPlan {
 public:
  static Result<MaskPlan> make(const Mask& mask, const Dims& dims, int query_block, int key_block);

  std::int64_t query_blocks() const { return static_cast<std::int64_t>(q_lo_.size()); }
  std::int64_t key_blocks() const { return static_cast<std::int64_t>(k_lo_.size()); }
  int query_block() const { return query_block_; }
  int key_block() const { return key_block_; }

  // Segment bounds per block for batch entry b (documents only).
  void set_batch(int b);
  BlockKind classify(std::int64_t query_block_index, std::int64_t key_block_index) const;
  // Row and column are local indices of the batch entry set last.
  bool allowed(std::int64_t row, std::int64_t column) const;
  // Sets s[j] to -infinity for every column k0 + j (j < n) that row may not
  // attend: allowed() over a block row, in loops the compiler can vectorize.
  template <typename T>
  void mask_row(std::int64_t row, std::int64_t k0, std::int64_t n, T* s) const {
    constexpr T minus_inf = -std::numeric_limits<T>::infinity();
    const std::int64_t a = aligned_[static_cast<std::size_t>(row)];
    const std::int64_t* k = key_pos_.data() + k0;
    if (causal_) {
      for (std::int64_t j = 0; j < n; ++j) s[j] = k[j] > a ? minus_inf : s[j];
    }
    if (windowed_) {
      const std::int64_t lo = a - left_, hi = a + right_;
      for (std::int64_t j = 0; j < n; ++j) s[j] = (k[j] < lo || k[j] > hi) ? minus_inf : s[j];
    }
    if (documents_) {
      const std::int32_t q = q_seg_[row];
      const std::int32_t* ks = k_seg_ + k0;
      for (std::int64_t j = 0; j < n; ++j) s[j] = ks[j] != q ? minus_inf : s[j];
    }
  }

 private:
  MaskPlan() = default;
  bool causal_ = false;
  bool windowed_ = false;
  std::int64_t left_ = 0;
  std::int64_t right_ = 0;
  bool documents_ = false;
  int query_block_ = 1;
  int key_block_ = 1;
  std::int64_t query_length_ = 0;
  std::int64_t key_length_ = 0;
  std::vector<std::int64_t> aligned_;  // per query row: its position + whole key length - whole query length
  std::vector<std::int64_t> key_pos_;  // per key column
  std::vector<std::int64_t> q_lo_, q_hi_, k_lo_, k_hi_;
  const std::int32_t* q_seg_all_ = nullptr;
  const std::int32_t* k_seg_all_ = nullptr;
  const std::int32_t* q_seg_ = nullptr;  // of the batch entry set last
  const std::int32_t* k_seg_ = nullptr;
  std::vector<std::int32_t> qs_lo_, qs_hi_, ks_lo_, ks_hi_;
};

}  // namespace dew::attention::detail
