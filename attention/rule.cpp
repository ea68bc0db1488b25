// The rule that picks a sequence-parallel exchange, as the design page's
// sequence_parallel_attention holds it, and the mask parser (`dew attention-plan --mask`).
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

#include "dew/attention.h"

namespace dew::attention {
namespace {

constexpr std::int64_t kMaxLength = std::int64_t{1} << 40;
constexpr int kMaxCount = 1 << 20;  // heads, sequence, tensor, head width

std::string str(std::int64_t v) { return std::to_string(v); }

std::string num(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", v);
  return buffer;
}

const char* kMaskAllowed =
    "none, causal, documents, window=W (W positions back) or window=LEFT,RIGHT (whole numbers up to 2^40)";

// Digits only, at most 13 of them, value <= 2^40.
bool parse_extent(std::string_view text, std::int64_t& out) {
  if (text.empty() || text.size() > 13) return false;
  std::int64_t v = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > kMaxLength) return false;
  out = v;
  return true;
}

Error value_error(const std::string& option, std::int64_t value, const std::string& allowed) {
  return not_allowed(option, str(value), allowed);
}

// Key heads a contiguous run of query heads [first, first + count) reads.
int kv_heads_of(int first, int count, int group) { return (first + count - 1) / group - first / group + 1; }

}  // namespace

Result<MaskSpec> parse_mask_kind(std::string_view text) {
  const auto fail = [&] { return not_allowed("mask", text, kMaskAllowed); };
  if (text == "none") return MaskSpec{MaskKind::kNone, {}};
  if (text == "causal") return MaskSpec{MaskKind::kCausal, {}};
  if (text == "documents") return MaskSpec{MaskKind::kDocuments, {}};
  constexpr std::string_view prefix = "window=";
  if (text.substr(0, prefix.size()) != prefix) return fail();
  const std::string_view rest = text.substr(prefix.size());
  const std::size_t comma = rest.find(',');
  MaskSpec spec{MaskKind::kWindow, {}};
  if (!parse_extent(rest.substr(0, comma), spec.window.left)) return fail();
  if (comma != std::string_view::npos && !parse_extent(rest.substr(comma + 1), spec.window.right)) return fail();
  return spec;
}

std::string format_mask_kind(const MaskSpec& mask) {
  switch (mask.kind) {
    case MaskKind::kNone:
      return "none";
    case MaskKind::kCausal:
      return "causal";
    case MaskKind::kDocuments:
      return "documents";
    case MaskKind::kWindow:
      return "window=" + str(mask.window.left) + (mask.window.right == 0 ? "" : "," + str(mask.window.right));
  }
  return "none";
}

Result<GatherKernel> parse_gather_kernel(std::string_view text) {
  if (text == "dense-bias") return GatherKernel::kDenseBias;
  if (text == "skips-masked-blocks") return GatherKernel::kSkipsMaskedBlocks;
  return not_allowed("gather kernel", text,
                     "dense-bias (cuDNN-like, the design page's rule) or skips-masked-blocks (Dew's CPU kernel)");
}

std::string_view gather_kernel_name(GatherKernel kernel) {
  return kernel == GatherKernel::kDenseBias ? "dense-bias" : "skips-masked-blocks";
}

std::string_view exchange_name(Exchange exchange) { return exchange == Exchange::kAllToAll ? "all-to-all" : "gather"; }

namespace {

// Every value of the call in range, and the heads splitting over tensor.
std::optional<Error> check_call(const Call& call) {
  const std::string counts = "a whole number from 1 to " + str(kMaxCount);
  const std::string lengths = "a whole number from 1 to 2^40";
  if (call.heads < 1 || call.heads > kMaxCount) return value_error("heads", call.heads, counts);
  if (call.kv_heads < 1 || call.kv_heads > kMaxCount) return value_error("kv_heads", call.kv_heads, counts);
  if (call.heads % call.kv_heads != 0) {
    return invalid_argument("kv_heads: " + str(call.kv_heads) + " does not divide heads " + str(call.heads) +
                            "; allowed: a divisor of the query heads (grouped-query attention)");
  }
  if (call.query_length < 1 || call.query_length > kMaxLength)
    return value_error("query length", call.query_length, lengths);
  if (call.key_length < 1 || call.key_length > kMaxLength) return value_error("key length", call.key_length, lengths);
  if (call.sequence < 1 || call.sequence > kMaxCount) return value_error("sequence", call.sequence, counts);
  if (call.tensor < 1 || call.tensor > kMaxCount) return value_error("tensor", call.tensor, counts);
  if (call.head_dim < 1 || call.head_dim > kMaxCount) return value_error("head width", call.head_dim, counts);
  if (call.bytes_per_value < 1 || call.bytes_per_value > 16)
    return value_error("bytes per value", call.bytes_per_value, "a whole number from 1 to 16");
  if (call.mask.kind == MaskKind::kWindow && (call.mask.window.left < 0 || call.mask.window.left > kMaxLength ||
                                              call.mask.window.right < 0 || call.mask.window.right > kMaxLength)) {
    return not_allowed("mask", "window=" + str(call.mask.window.left) + "," + str(call.mask.window.right),
                       kMaskAllowed);
  }
  if (call.heads % call.tensor != 0) {
    return unsupported("neither exchange can run: heads " + str(call.heads) + " do not divide by tensor " +
                       str(call.tensor) + " (every tensor shard needs whole query heads)");
  }
  return std::nullopt;
}

// The all-to-all: whole query heads per device, lengths split evenly.
void cost_all_to_all(const Call& call, int group, Plan& plan) {
  const int h_all = call.heads, t = call.tensor, n = call.sequence, h = plan.shard_heads;
  const std::int64_t lq = call.query_length, lk = call.key_length;
  ExchangeCost& a2a = plan.all_to_all;
  if (h % n != 0) {
    a2a.why_not = "the query heads per tensor shard, heads " + str(h_all) + " / tensor " + str(t) + " = " + str(h) +
                  ", do not divide by sequence " + str(n);
    return;
  }
  if (lq % n != 0) {
    a2a.why_not = "the query length " + str(lq) + " does not divide by sequence " + str(n);
    return;
  }
  if (lk % n != 0) {
    a2a.why_not = "the key length " + str(lk) + " does not divide by sequence " + str(n);
    return;
  }
  a2a.can_run = true;
  int most = 0;  // key heads the busiest device of a sequence group needs
  for (int shard = 0; shard < t; ++shard)
    for (int device = 0; device < n; ++device)
      most = std::max(most, kv_heads_of(shard * h + device * (h / n), h / n, group));
  plan.repeated_kv_heads = most * n;
  a2a.units = 2.0 * (h + plan.repeated_kv_heads) / n;
  const double values = static_cast<double>(n - 1) * (2.0 * (h / n) * (lq / n) + 2.0 * most * (lk / n));
  const double per_value = static_cast<double>(call.head_dim) * call.bytes_per_value;
  a2a.bytes = values * per_value;
}

// The gather: any head count and key length; masked calls balance their
// work over 2N chunks, which needs the query length to divide by 2N.
void cost_gather(const Call& call, Plan& plan) {
  const int n = call.sequence, k = plan.shard_kv_heads;
  const std::int64_t lq = call.query_length, lk = call.key_length;
  ExchangeCost& gather = plan.gather;
  if (call.mask.kind != MaskKind::kNone && n > 1 && lq % (2 * n) != 0) {
    gather.why_not = "a " + format_mask_kind(call.mask) +
                     " call cuts the query length into 2 x sequence = " + str(2 * n) + " chunks, and " + str(lq) +
                     " does not divide by " + str(2 * n);
    return;
  }
  gather.can_run = true;
  gather.units = 2.0 * k;
  const std::int64_t shard = (lk + n - 1) / n;
  const double per_value = static_cast<double>(call.head_dim) * call.bytes_per_value;
  gather.bytes = static_cast<double>(n - 1) * 2.0 * k * static_cast<double>(shard) * per_value;
}

// Which of the two, and why, once both are costed.
void decide(const Call& call, Plan& plan) {
  const int n = call.sequence;
  const bool masked = call.mask.kind != MaskKind::kNone;
  const ExchangeCost& a2a = plan.all_to_all;
  const ExchangeCost& gather = plan.gather;
  const std::string units_text = " units of length x head width x (N-1)/N per device";
  if (n == 1) {
    plan.exchange = Exchange::kAllToAll;
    plan.reason = "sequence 1: nothing is exchanged; the local kernel runs on the whole sequence";
  } else if (!gather.can_run) {
    plan.exchange = Exchange::kAllToAll;
    plan.reason = "the gather cannot run: " + gather.why_not;
  } else if (!a2a.can_run) {
    plan.exchange = Exchange::kGather;
    plan.reason = "the all-to-all cannot run: " + a2a.why_not;
  } else if (masked && call.gather_kernel == GatherKernel::kDenseBias) {
    plan.exchange = Exchange::kAllToAll;
    plan.reason = "a " + format_mask_kind(call.mask) +
                  " call where both can run: the all-to-all's kernel sees whole sequences and skips masked "
                  "blocks, while the gather would run the mask as a dense bias";
  } else {
    // The same work either way: the bytes decide.
    const std::string why = masked ? "a " + format_mask_kind(call.mask) +
                                         " call on a gather kernel that skips masked blocks (the same work either "
                                         "way), and "
                                   : "unmasked, and ";
    if (gather.bytes < a2a.bytes) {
      plan.exchange = Exchange::kGather;
      plan.reason =
          why + "the gather sends fewer bytes: " + num(gather.units) + " against " + num(a2a.units) + units_text;
    } else if (gather.bytes == a2a.bytes) {
      // Equal bytes (multi-head attention over two devices, for one): every
      // collective call costs a latency, and the gather makes fewer, one
      // all-gather forward against the all-to-all's two trades. Narrower
      // values than fp32 tip it back: the gather's backward reduce-scatters
      // dK and dV in fp32, more bytes than its forward counts.
      const std::string both = why + "both send " + num(a2a.units) + units_text;
      if (call.bytes_per_value >= 4) {
        plan.exchange = Exchange::kGather;
        plan.reason = both + ", and the gather makes fewer collective calls: 3 against 4 per forward and backward";
      } else {
        plan.exchange = Exchange::kAllToAll;
        plan.reason = both +
                      " forward, and the gather's backward would reduce-scatter dK and dV in fp32, more "
                      "than " +
                      str(call.bytes_per_value) + " bytes per value";
      }
    } else {
      plan.exchange = Exchange::kAllToAll;
      plan.reason =
          why + "the all-to-all sends fewer bytes: " + num(a2a.units) + " against " + num(gather.units) + units_text;
    }
  }
}

}  // namespace

Result<Plan> choose_exchange(const Call& call) {
  if (auto bad = check_call(call)) return *bad;
  Plan plan;
  const int group = call.heads / call.kv_heads;
  plan.shard_heads = call.heads / call.tensor;
  for (int shard = 0; shard < call.tensor; ++shard)
    plan.shard_kv_heads = std::max(plan.shard_kv_heads, kv_heads_of(shard * plan.shard_heads, plan.shard_heads, group));
  cost_all_to_all(call, group, plan);
  cost_gather(call, plan);
  if (!plan.all_to_all.can_run && !plan.gather.can_run) {
    return unsupported("neither exchange can run: all-to-all: " + plan.all_to_all.why_not +
                       "; gather: " + plan.gather.why_not);
  }
  decide(call, plan);
  return plan;
}

}  // namespace dew::attention
