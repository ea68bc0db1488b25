// Any bytes as a stream of coordination-service frames, decoded the way the
// service reads a connection: never a crash or an over-read; a frame that
// decodes re-encodes to exactly the bytes it came from (whole, from views in
// place, and split into a head and shared items); an error is one line.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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
      FUZZ_CHECK(wire::decode_views(rest, limit).status == wire::DecodeStatus::kBad);
      FUZZ_CHECK(!decoded.error.empty());
      FUZZ_CHECK(decoded.error.find('\n') == std::string::npos);
      break;
    }
    FUZZ_CHECK(decoded.consumed >= wire::kHeaderBytes + 1 && decoded.consumed <= rest.size());
    FUZZ_CHECK(decoded.consumed <= limit + wire::kHeaderBytes);
    FUZZ_CHECK(wire::item_count_allowed(decoded.frame.type, decoded.frame.items.size()));
    FUZZ_CHECK(wire::encode(decoded.frame) == rest.substr(0, decoded.consumed));
    // The reader that keeps items in place sees the same frame...
    const auto views = wire::decode_views(rest, limit);
    FUZZ_CHECK(views.status == wire::DecodeStatus::kFrame && views.consumed == decoded.consumed);
    FUZZ_CHECK(wire::encode(views.type, views.items) == rest.substr(0, decoded.consumed));
    // ...and a reply split into a head and shared items is the same bytes.
    const auto& items = decoded.frame.items;
    const std::size_t lead = items.empty() ? 0 : rest[decoded.consumed - 1] % (items.size() + 1);
    const std::vector<std::string> leading(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(lead));
    const std::vector<std::string> shared(items.begin() + static_cast<std::ptrdiff_t>(lead), items.end());
    const std::string tail = wire::encode_items(shared);
    FUZZ_CHECK(wire::encode_head(decoded.frame.type, leading, tail.size()) + tail == rest.substr(0, decoded.consumed));
    rest.remove_prefix(decoded.consumed);
  }
  return 0;
}
