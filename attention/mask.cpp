// Validation of a call's dimensions and mask, and the mask per block: a block
// is skipped when no pair in it can be allowed, evaluated per element when
// some can, and taken whole when every pair is.
#include "mask.h"

#include <algorithm>
#include <limits>
#include <string>

namespace dew::attention::detail {
namespace {

// Lengths and window extents beyond this are refused, so position arithmetic
// (a - left, a + right) cannot overflow.
constexpr std::int64_t kMaxLength = std::int64_t{1} << 40;

std::string str(std::int64_t value) { return std::to_string(value); }

Error bad(const std::string& what, std::int64_t value, const std::string& allowed) {
  return invalid_argument("attention: " + what + " " + str(value) + " is not allowed; allowed: " + allowed);
}

}  // namespace

std::optional<Error> check_dims(const Dims& dims) {
  if (dims.batch < 1) return bad("batch", dims.batch, "a whole number >= 1");
  if (dims.heads < 1) return bad("heads", dims.heads, "a whole number >= 1");
  if (dims.kv_heads < 1) return bad("kv_heads", dims.kv_heads, "a whole number >= 1");
  if (dims.heads % dims.kv_heads != 0) {
    return invalid_argument("attention: heads " + str(dims.heads) + " is not a multiple of kv_heads " +
                            str(dims.kv_heads) + "; allowed: kv_heads dividing heads (grouped-query attention)");
  }
  if (dims.query_length < 0 || dims.query_length > kMaxLength)
    return bad("query_length", dims.query_length, "0 to 2^40");
  if (dims.key_length < 0 || dims.key_length > kMaxLength) return bad("key_length", dims.key_length, "0 to 2^40");
  if (dims.head_dim < 1) return bad("head_dim", dims.head_dim, "a whole number >= 1");
  return std::nullopt;
}

namespace {

// The mask's positions, segments and window against the call's dims.
std::optional<Error> check_mask(const Mask& mask, const Dims& dims) {
  const Positions& pos = mask.positions;
  const std::int64_t whole_q = pos.whole_query_length < 0 ? dims.query_length : pos.whole_query_length;
  const std::int64_t whole_k = pos.whole_key_length < 0 ? dims.key_length : pos.whole_key_length;
  if (pos.whole_query_length < -1 || whole_q > kMaxLength)
    return bad("whole_query_length", pos.whole_query_length, "-1 (the local length) or 0 to 2^40");
  if (pos.whole_key_length < -1 || whole_k > kMaxLength)
    return bad("whole_key_length", pos.whole_key_length, "-1 (the local length) or 0 to 2^40");
  if (!pos.query.empty() && static_cast<std::int64_t>(pos.query.size()) != dims.query_length) {
    return bad("positions.query with size", static_cast<std::int64_t>(pos.query.size()),
               "empty or query_length = " + str(dims.query_length) + " entries");
  }
  if (!pos.key.empty() && static_cast<std::int64_t>(pos.key.size()) != dims.key_length) {
    return bad("positions.key with size", static_cast<std::int64_t>(pos.key.size()),
               "empty or key_length = " + str(dims.key_length) + " entries");
  }
  if (mask.query_segments.empty() != mask.key_segments.empty()) {
    return invalid_argument("attention: segments given for " +
                            std::string(mask.query_segments.empty() ? "keys" : "queries") +
                            " only; allowed: query_segments and key_segments both given or both empty");
  }
  const std::int64_t q_seg_size = static_cast<std::int64_t>(dims.batch) * dims.query_length;
  const std::int64_t k_seg_size = static_cast<std::int64_t>(dims.batch) * dims.key_length;
  if (!mask.query_segments.empty() && static_cast<std::int64_t>(mask.query_segments.size()) != q_seg_size) {
    return bad("query_segments with size", static_cast<std::int64_t>(mask.query_segments.size()),
               "batch x query_length = " + str(q_seg_size) + " entries");
  }
  if (!mask.key_segments.empty() && static_cast<std::int64_t>(mask.key_segments.size()) != k_seg_size) {
    return bad("key_segments with size", static_cast<std::int64_t>(mask.key_segments.size()),
               "batch x key_length = " + str(k_seg_size) + " entries");
  }
  if (mask.window) {
    if (mask.window->left < 0 || mask.window->left > kMaxLength)
      return bad("window left", mask.window->left, "0 to 2^40");
    if (mask.window->right < 0 || mask.window->right > kMaxLength)
      return bad("window right", mask.window->right, "0 to 2^40");
  }

  return std::nullopt;
}

// Per block of `block` values, the smallest and the largest.
void block_bounds(const std::vector<std::int64_t>& values, std::int64_t block, std::vector<std::int64_t>& lo,
                  std::vector<std::int64_t>& hi) {
  const std::int64_t n = static_cast<std::int64_t>(values.size());
  for (std::int64_t start = 0; start < n; start += block) {
    const auto first = values.begin() + start;
    const auto last = values.begin() + std::min(n, start + block);
    const auto [min_it, max_it] = std::minmax_element(first, last);
    lo.push_back(*min_it);
    hi.push_back(*max_it);
  }
}

}  // namespace

Result<MaskPlan> MaskPlan::make(const Mask& mask, const Dims& dims, int query_block, int key_block) {
  if (auto error = check_dims(dims)) return *error;
  if (query_block < 1) return bad("query_block", query_block, "a whole number >= 1");
  if (key_block < 1) return bad("key_block", key_block, "a whole number >= 1");
  if (auto error = check_mask(mask, dims)) return *error;
  const Positions& pos = mask.positions;
  const std::int64_t whole_q = pos.whole_query_length < 0 ? dims.query_length : pos.whole_query_length;
  const std::int64_t whole_k = pos.whole_key_length < 0 ? dims.key_length : pos.whole_key_length;
  MaskPlan plan;
  plan.causal_ = mask.causal;
  plan.windowed_ = mask.window.has_value();
  if (plan.windowed_) {
    plan.left_ = mask.window->left;
    plan.right_ = mask.window->right;
  }
  plan.documents_ = !mask.query_segments.empty();
  plan.q_seg_all_ = mask.query_segments.data();
  plan.k_seg_all_ = mask.key_segments.data();
  plan.query_length_ = dims.query_length;
  plan.key_length_ = dims.key_length;
  plan.query_block_ = query_block;
  plan.key_block_ = key_block;

  const std::int64_t offset = whole_k - whole_q;
  plan.aligned_.resize(static_cast<std::size_t>(dims.query_length));
  for (std::int64_t i = 0; i < dims.query_length; ++i) {
    const std::int64_t p = pos.query.empty() ? i : pos.query[static_cast<std::size_t>(i)];
    if (p < 0 || p >= whole_q) {
      return bad("query position", p, "0 to whole_query_length - 1 = " + str(whole_q - 1) + " (row " + str(i) + ")");
    }
    plan.aligned_[static_cast<std::size_t>(i)] = p + offset;
  }
  plan.key_pos_.resize(static_cast<std::size_t>(dims.key_length));
  for (std::int64_t j = 0; j < dims.key_length; ++j) {
    const std::int64_t p = pos.key.empty() ? j : pos.key[static_cast<std::size_t>(j)];
    if (p < 0 || p >= whole_k) {
      return bad("key position", p, "0 to whole_key_length - 1 = " + str(whole_k - 1) + " (column " + str(j) + ")");
    }
    plan.key_pos_[static_cast<std::size_t>(j)] = p;
  }
  block_bounds(plan.aligned_, query_block, plan.q_lo_, plan.q_hi_);
  block_bounds(plan.key_pos_, key_block, plan.k_lo_, plan.k_hi_);
  if (plan.documents_) plan.set_batch(0);
  return plan;
}

void MaskPlan::set_batch(int b) {
  if (!documents_) return;
  q_seg_ = q_seg_all_ + static_cast<std::int64_t>(b) * query_length_;
  k_seg_ = k_seg_all_ + static_cast<std::int64_t>(b) * key_length_;
  auto bounds = [](const std::int32_t* values, std::int64_t n, std::int64_t block, std::vector<std::int32_t>& lo,
                   std::vector<std::int32_t>& hi) {
    lo.clear();
    hi.clear();
    for (std::int64_t start = 0; start < n; start += block) {
      const auto [min_it, max_it] = std::minmax_element(values + start, values + std::min(n, start + block));
      lo.push_back(*min_it);
      hi.push_back(*max_it);
    }
  };
  bounds(q_seg_, query_length_, query_block_, qs_lo_, qs_hi_);
  bounds(k_seg_, key_length_, key_block_, ks_lo_, ks_hi_);
}

BlockKind MaskPlan::classify(std::int64_t qb, std::int64_t kb) const {
  const auto qi = static_cast<std::size_t>(qb);
  const auto ki = static_cast<std::size_t>(kb);
  const std::int64_t a_lo = q_lo_[qi], a_hi = q_hi_[qi], k_lo = k_lo_[ki], k_hi = k_hi_[ki];
  bool full = true;
  if (causal_) {
    if (k_lo > a_hi) return BlockKind::kSkip;
    full = full && k_hi <= a_lo;
  }
  if (windowed_) {
    if (k_lo > a_hi + right_ || k_hi < a_lo - left_) return BlockKind::kSkip;
    full = full && k_lo >= a_hi - left_ && k_hi <= a_lo + right_;
  }
  if (documents_) {
    if (qs_hi_[qi] < ks_lo_[ki] || ks_hi_[ki] < qs_lo_[qi]) return BlockKind::kSkip;
    full = full && qs_lo_[qi] == qs_hi_[qi] && ks_lo_[ki] == ks_hi_[ki] && qs_lo_[qi] == ks_lo_[ki];
  }
  return full ? BlockKind::kFull : BlockKind::kPartial;
}

bool MaskPlan::allowed(std::int64_t row, std::int64_t column) const {
  const std::int64_t a = aligned_[static_cast<std::size_t>(row)];
  const std::int64_t k = key_pos_[static_cast<std::size_t>(column)];
  if (causal_ && k > a) return false;
  if (windowed_ && (k < a - left_ || k > a + right_)) return false;
  if (documents_ && q_seg_[row] != k_seg_[column]) return false;
  return true;
}

}  // namespace dew::attention::detail

namespace dew::attention {

std::int64_t allowed_pairs(const Mask& mask, const Dims& dims) {
  auto made = detail::MaskPlan::make(mask, dims, 1, 1);
  if (!made.ok()) return 0;
  const detail::MaskPlan& plan = made.value();
  std::int64_t count = 0;
  for (int b = 0; b < dims.batch; ++b) {
    made.value().set_batch(b);
    for (std::int64_t i = 0; i < dims.query_length; ++i)
      for (std::int64_t j = 0; j < dims.key_length; ++j) count += plan.allowed(i, j) ? 1 : 0;
  }
  return count;
}

}  // namespace dew::attention
