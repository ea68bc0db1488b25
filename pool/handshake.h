// What a joining process makes of the bytes the coordinator sends it during
// the join: pure, so the join's every answer (a Dew service, a refusal, a
// stranger on the port, another pool's service) is tested and fuzzed without
// sockets. Private to pool/.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dew::runtime::handshake {

enum class Heard {
  kNeedMore,     // nothing conclusive yet: read more
  kChallenge,    // a Dew service's challenge: `value` is its nonce
  kWelcome,      // the service proved it knows the secret
  kRefused,      // the service refused us: `value` is its reason
  kBusy,         // the service has too many unauthenticated connections now: connect again
  kWrongSecret,  // a Dew service that does not know this pool's secret
  kNotDew,       // bytes no Dew service sends: `value` describes them
};

struct Reading {
  Heard heard = Heard::kNeedMore;
  std::string value;
  std::size_t consumed = 0;  // bytes of the input the answer took
  std::string credential;    // kChallenge: process 0's MUNGE credential, when it sent one
};

// The service's first frame.
Reading read_challenge(std::string_view bytes);
// The service's answer to our hello, which carried `client_nonce`.
Reading read_welcome(std::string_view bytes, std::string_view secret, std::string_view client_nonce);

// One printable line saying what `bytes` are: "nothing", or the first bytes
// quoted with the count ("'HTTP/1.1 400 Bad Request' (147 bytes)").
std::string describe_heard(std::string_view bytes);

}  // namespace dew::runtime::handshake
