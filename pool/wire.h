// The coordination service's wire format: pure encode/decode, no sockets.
// Private to pool/ (the service, its client and the fuzz target use it).
//
// A frame is a 4-byte big-endian length L, then L bytes: one type byte and
// zero or more items, each a 4-byte big-endian length and that many bytes.
// Every type has a fixed number of items, so a frame either decodes whole or
// is refused; numbers travel as 8-byte big-endian items.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dew::runtime::wire {

// The kind item of kFail and kFailure frames.
inline constexpr std::string_view kFailedKind = "failed";
inline constexpr std::string_view kStoppedKind = "stopped";

enum class Type : std::uint8_t {
  kChallenge = 1,      // service -> client: nonce (and, for a pool under MUNGE, a credential)
  kHello = 2,          // client -> service: rank, size, client nonce, MAC
  kWelcome = 3,        // service -> client: MAC over the client's nonce
  kRefused = 4,        // service -> client: reason (then the service closes)
  kPut = 5,            // key, value
  kGet = 6,            // request id, key, timeout ms
  kValue = 7,          // request id, value
  kNotFound = 8,       // request id
  kAgree = 9,          // request id, name, patience ms
  kAgreed = 10,        // request id
  kAgreeTimeout = 11,  // request id, missing ranks ("2,3")
  kGather = 12,        // request id, round name, bytes, patience ms
  kGathered = 13,      // request id, then one item per rank
  kFail = 14,          // client -> service: rank, message, kind (kFailedKind or kStoppedKind)
  kFailure = 15,       // service -> clients: rank, message, kind
  kHeartbeat = 16,     // either way, no items
  kBye = 17,           // client -> service: leaving normally
  kBusy = 18,          // service -> client instead of a challenge: too many strangers now; reason (try again)
};

struct Frame {
  Type type = Type::kHeartbeat;
  std::vector<std::string> items;
};

// Largest frame a service accepts from an authenticated client, and from one
// that has not yet proven it knows the secret (a hello is ~100 bytes).
inline constexpr std::size_t kMaxFrameBytes = std::size_t{64} << 20;
inline constexpr std::size_t kMaxHandshakeFrameBytes = 4096;
// Largest reply a gather round may make (every process's part together):
// well inside the 4-byte length, and what process 0 holds twice at most.
inline constexpr std::size_t kMaxGatheredBytes = std::size_t{1} << 30;
// The length prefix.
inline constexpr std::size_t kHeaderBytes = 4;

std::string encode(const Frame& frame);
// The same bytes from items the caller holds: a large value is copied once.
std::string encode(Type type, const std::vector<std::string_view>& items);
// A frame in two parts, for items several frames share (a gather's parts,
// sent to every process): the shared items encoded once by encode_items(),
// and for each frame a head with its own leading items.
//   encode_head(t, a, encode_items(b).size()) + encode_items(b) == encode({t, a + b})
std::string encode_items(const std::vector<std::string>& items);
void append_item(std::string& out, std::string_view item);  // one item of encode_items()
std::string encode_length(std::size_t bytes);               // the 4 bytes before an item
std::string encode_head(Type type, const std::vector<std::string>& leading, std::size_t tail_bytes);
// The bytes encode() makes of a frame with items of these sizes.
std::size_t encoded_size(const std::vector<std::size_t>& item_sizes);
std::string encode_u64(std::uint64_t value);
// A kFail (client) or kFailure (service) frame: rank, message, and its kind
// (kStoppedKind for a stop from outside, else kFailedKind).
Frame failure_frame(Type type, std::uint64_t rank, std::string message, bool stopped);
// Where a frame's head ends (auth.h's tags hash the rest apart): after its
// first item, or after the type byte when it has none. `frame` is a whole
// frame that decoded; the answer never exceeds its size.
std::size_t head_bytes(std::string_view frame) noexcept;
// The 4-byte big-endian number `bytes` starts with (at least 4 bytes).
std::uint32_t decode_u32(std::string_view bytes);
// nullopt unless the item is exactly 8 bytes.
std::optional<std::uint64_t> decode_u64(std::string_view item);

enum class DecodeStatus { kNeedMore, kFrame, kBad };

struct Decoded {
  DecodeStatus status = DecodeStatus::kNeedMore;
  Frame frame;               // when kFrame
  std::size_t consumed = 0;  // bytes of `buffer` the frame took, when kFrame
  std::string error;         // when kBad: one line naming what is wrong
};

// What decode() finds, with the items left in place: views into the buffer,
// valid while it is. For a reader that keeps a large item where it arrived.
struct DecodedViews {
  DecodeStatus status = DecodeStatus::kNeedMore;
  Type type = Type::kHeartbeat;
  std::vector<std::string_view> items;  // when kFrame
  std::size_t consumed = 0;
  std::string error;
};
DecodedViews decode_views(std::string_view buffer, std::size_t max_frame_bytes);

// A frame as read from a socket: its items view into one buffer, held by
// `owner`, that a gather's reply hands on whole to its caller (dew/pool.h
// Gathered).
struct ReceivedFrame {
  Type type = Type::kHeartbeat;
  std::shared_ptr<const void> owner;
  std::vector<std::string_view> items;
};

// Decodes the first frame of `buffer`. kNeedMore: the frame is not all there
// yet; kBad: the bytes can never become a valid frame (unknown type, wrong
// item count, lengths that overrun, a length above max_frame_bytes), and the
// connection must be closed. Never reads past buffer.size().
Decoded decode(std::string_view buffer, std::size_t max_frame_bytes);
// The whole size (header included) of the frame `buffer` starts with, once
// its header is there: for a reader that sizes its buffer in one step.
std::optional<std::size_t> announced_size(std::string_view buffer);

// Item counts each type must carry ("kGathered" carries 1 + pool size: at
// least one). Exposed for the tests.
bool item_count_allowed(Type type, std::size_t count);
std::string_view type_name(Type type);

}  // namespace dew::runtime::wire
