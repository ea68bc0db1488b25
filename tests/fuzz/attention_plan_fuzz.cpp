// The --mask parser and the exchange rule on any bytes: the first 16 bytes
// pick a call's numbers (small ranges and edges), the rest is the --mask
// text. Invariants: a parsed mask formats back to a text that parses to the
// same mask; a plan names an exchange that can run, with its bytes; errors
// are one line.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "dew/attention.h"
#include "fuzz_check.h"

namespace {

using namespace dew::attention;

int pick(const std::uint8_t* data, int index, int high) {
  // Mostly small values, sometimes 0 or negative, sometimes large.
  const int byte = data[index];
  if (byte == 255) return -1;
  if (byte == 254) return 1 << 20;
  if (byte == 253) return (1 << 20) + 1;
  return byte % (high + 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 16) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 16, size - 16);
  auto mask = parse_mask_kind(text);
  if (!mask.ok()) {
    FUZZ_CHECK(mask.error().message.find('\n') == std::string::npos || text.find('\n') != std::string_view::npos);
    return 0;
  }
  const std::string formatted = format_mask_kind(mask.value());
  auto again = parse_mask_kind(formatted);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again.value().kind == mask.value().kind);
  FUZZ_CHECK(again.value().window.left == mask.value().window.left);
  FUZZ_CHECK(again.value().window.right == mask.value().window.right);

  Call call;
  call.heads = pick(data, 0, 64);
  call.kv_heads = pick(data, 1, 16);
  std::int64_t length = 0;
  std::memcpy(&length, data + 2, 4);
  call.query_length = length % 70000;
  call.key_length = data[6] < 128 ? call.query_length : pick(data, 7, 200);
  call.sequence = pick(data, 8, 16);
  call.tensor = pick(data, 9, 8);
  call.head_dim = pick(data, 10, 256);
  call.bytes_per_value = pick(data, 11, 8);
  call.mask = mask.value();
  call.gather_kernel = data[12] % 2 == 0 ? GatherKernel::kDenseBias : GatherKernel::kSkipsMaskedBlocks;
  auto plan = choose_exchange(call);
  if (!plan.ok()) {
    FUZZ_CHECK(!plan.error().message.empty());
    FUZZ_CHECK(plan.error().message.find('\n') == std::string::npos);
    return 0;
  }
  const Plan& p = plan.value();
  const ExchangeCost& chosen = p.exchange == Exchange::kAllToAll ? p.all_to_all : p.gather;
  FUZZ_CHECK(chosen.can_run);
  FUZZ_CHECK(chosen.bytes >= 0);
  FUZZ_CHECK(!p.reason.empty());
  FUZZ_CHECK(call.heads % call.tensor == 0);
  if (p.all_to_all.can_run) {
    FUZZ_CHECK(p.shard_heads % call.sequence == 0);
    FUZZ_CHECK(call.query_length % call.sequence == 0 && call.key_length % call.sequence == 0);
    FUZZ_CHECK(p.repeated_kv_heads >= 1 && p.repeated_kv_heads <= p.shard_heads);
  }
  // Unmasked calls where both run, and masked ones on a gather kernel that
  // skips masked blocks, take the one sending fewer bytes.
  if (call.sequence > 1 && p.all_to_all.can_run && p.gather.can_run &&
      (call.mask.kind == MaskKind::kNone || call.gather_kernel == GatherKernel::kSkipsMaskedBlocks)) {
    FUZZ_CHECK(chosen.bytes <= (p.exchange == Exchange::kAllToAll ? p.gather.bytes : p.all_to_all.bytes));
  }
  return 0;
}
