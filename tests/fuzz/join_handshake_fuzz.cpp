// Any bytes as what a joining process hears from the coordinator: the
// service's challenge, then its answer to the hello. Never a crash or an
// over-read; every conclusion but a welcome carries a one-line description;
// a welcome needs the right MAC, which random bytes never carry.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "auth.h"
#include "fuzz_check.h"
#include "handshake.h"

namespace {

void check_reading(const dew::runtime::handshake::Reading& reading, std::string_view bytes) {
  using dew::runtime::handshake::Heard;
  FUZZ_CHECK(reading.consumed <= bytes.size());
  // What is shown to a user is one line (a challenge's value is its nonce).
  if (reading.heard == Heard::kNotDew || reading.heard == Heard::kRefused) {
    FUZZ_CHECK(reading.value.find('\n') == std::string::npos);
  }
  if (reading.heard == Heard::kNotDew) FUZZ_CHECK(!reading.value.empty());
  if (reading.heard == Heard::kNeedMore || reading.heard == Heard::kNotDew) FUZZ_CHECK(reading.consumed == 0);
  if (reading.heard == Heard::kChallenge || reading.heard == Heard::kWelcome || reading.heard == Heard::kRefused ||
      reading.heard == Heard::kWrongSecret) {
    FUZZ_CHECK(reading.consumed > 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace handshake = dew::runtime::handshake;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const auto challenge = handshake::read_challenge(bytes);
  check_reading(challenge, bytes);
  if (challenge.heard == handshake::Heard::kChallenge) {
    FUZZ_CHECK(challenge.value.size() == dew::runtime::auth::kNonceBytes);
  } else {
    FUZZ_CHECK(challenge.credential.empty());  // a credential only ever comes with a challenge
  }
  // What follows a challenge is read as the answer to our hello.
  const std::string_view rest = bytes.substr(challenge.consumed);
  const auto welcome = handshake::read_welcome(rest, "the pool secret", std::string(32, 'n'));
  check_reading(welcome, rest);
  FUZZ_CHECK(welcome.heard != handshake::Heard::kWelcome);
  const std::string described = handshake::describe_heard(bytes);
  FUZZ_CHECK(!described.empty() && described.find('\n') == std::string::npos);
  return 0;
}
