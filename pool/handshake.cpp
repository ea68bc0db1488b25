#include "handshake.h"

#include "auth.h"
#include "dew/text.h"
#include "wire.h"

namespace dew::runtime::handshake {
namespace {

Reading not_dew(std::string_view bytes, const std::string& why) {
  return Reading{Heard::kNotDew, describe_heard(bytes) + ", " + why, 0, ""};
}

// Decodes the first frame of `bytes` with the handshake's limit, or says
// what else the bytes are.
Reading first_frame(std::string_view bytes, wire::Frame& frame) {
  auto decoded = wire::decode(bytes, wire::kMaxHandshakeFrameBytes);
  if (decoded.status == wire::DecodeStatus::kNeedMore) return Reading{};
  if (decoded.status == wire::DecodeStatus::kBad) return not_dew(bytes, "not a Dew frame (" + decoded.error + ")");
  frame = std::move(decoded.frame);
  return Reading{Heard::kChallenge, "", decoded.consumed, ""};  // the caller sets what it is
}

}  // namespace

std::string describe_heard(std::string_view bytes) {
  if (bytes.empty()) return "nothing";
  return quoted(bytes, 40) + " (" + std::to_string(bytes.size()) + (bytes.size() == 1 ? " byte)" : " bytes)");
}

Reading read_challenge(std::string_view bytes) {
  wire::Frame frame;
  Reading reading = first_frame(bytes, frame);
  if (reading.consumed == 0) return reading;
  if (frame.type == wire::Type::kRefused)
    return Reading{Heard::kRefused, printable(frame.items[0]), reading.consumed, ""};
  if (frame.type == wire::Type::kBusy) return Reading{Heard::kBusy, printable(frame.items[0]), reading.consumed, ""};
  if (frame.type != wire::Type::kChallenge || frame.items[0].size() != auth::kNonceBytes) {
    return not_dew(bytes, "a " + std::string(wire::type_name(frame.type)) + " frame where a challenge belongs");
  }
  reading.value = frame.items[0];
  if (frame.items.size() > 1) reading.credential = frame.items[1];
  return reading;
}

Reading read_welcome(std::string_view bytes, std::string_view secret, std::string_view client_nonce) {
  wire::Frame frame;
  Reading reading = first_frame(bytes, frame);
  if (reading.consumed == 0) return reading;
  if (frame.type == wire::Type::kRefused)
    return Reading{Heard::kRefused, printable(frame.items[0]), reading.consumed, ""};
  if (frame.type != wire::Type::kWelcome) {
    return not_dew(bytes, "a " + std::string(wire::type_name(frame.type)) + " frame where a welcome belongs");
  }
  if (!auth::same_mac(frame.items[0], auth::welcome_mac(secret, client_nonce))) {
    return Reading{Heard::kWrongSecret, "", reading.consumed, ""};
  }
  return Reading{Heard::kWelcome, "", reading.consumed, ""};
}

}  // namespace dew::runtime::handshake
