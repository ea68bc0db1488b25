// Any bytes as a stream of coordination-service frames, decoded the way the
// service reads a connection: never a crash or an over-read; a frame that
// decodes re-encodes to exactly the bytes it came from; an error is one line.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.h"
#include "wire.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace wire = dew::runtime::wire;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  // Both limits the service uses: before and after the handshake.
  const std::size_t limit = size % 2 ? wire::kMaxHandshakeFrameBytes : wire::kMaxFrameBytes;
  while (!rest.empty()) {
    const auto decoded = wire::decode(rest, limit);
    if (decoded.status == wire::DecodeStatus::kNeedMore) break;
    if (decoded.status == wire::DecodeStatus::kBad) {
      FUZZ_CHECK(!decoded.error.empty());
      FUZZ_CHECK(decoded.error.find('\n') == std::string::npos);
      break;
    }
    FUZZ_CHECK(decoded.consumed >= wire::kHeaderBytes + 1 && decoded.consumed <= rest.size());
    FUZZ_CHECK(decoded.consumed <= limit + wire::kHeaderBytes);
    FUZZ_CHECK(wire::item_count_allowed(decoded.frame.type, decoded.frame.items.size()));
    FUZZ_CHECK(wire::encode(decoded.frame) == rest.substr(0, decoded.consumed));
    rest.remove_prefix(decoded.consumed);
  }
  return 0;
}
