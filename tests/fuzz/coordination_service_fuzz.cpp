// Any bytes as what a connection sends a real coordination service: one
// service (a pool of two, this process hosting it) on a loopback port, and
// each input on a fresh connection, first as a stranger (input byte 0 even)
// or as process 1 after a real handshake (odd), then the rest of the input:
// as it comes (bit 1 of byte 0 clear), or (set) each whole frame the input
// starts with followed by its right tag, so the requests behind the tag
// check are fuzzed too, and the bytes after them as they come. The service
// must answer the challenge, survive every input, and close each connection
// once its client is done; ASan and UBSan watch its thread the whole time.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "auth.h"
#include "coordination.h"
#include "frame_reader.h"
#include "fuzz_check.h"
#include "wire.h"

namespace {

namespace wire = dew::runtime::wire;
const std::string kSecret(64, 'f');

std::string& last_log() {
  static std::string line;
  return line;
}

std::uint16_t service_port() {
  static std::unique_ptr<dew::runtime::CoordinationService> service = [] {
    dew::runtime::ServiceConfig config;
    config.size = 2;
    config.secret = kSecret;
    config.heartbeat_timeout = std::chrono::hours(1);  // no heartbeats needed from the fuzzer
    config.log = [](const std::string& line) { last_log() = line; };
    auto started = dew::runtime::CoordinationService::start(config);
    FUZZ_CHECK(started.ok());
    return std::move(started.value());
  }();
  return service->port();
}

// libFuzzer's -timeout alarm is a SIGALRM whose handler has no SA_RESTART,
// so it can interrupt a blocking connect (EINTR; seen in CI about 3 s, the
// first alarm, into a run). The connection still completes in the kernel:
// wait for it and read its outcome, rather than call it refused.
int connect_to_service() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) std::fprintf(stderr, "socket: %s\n", std::strerror(errno));
  FUZZ_CHECK(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(service_port());
  int error = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 ? 0 : errno;
  if (error == EINTR) {
    pollfd done{fd, POLLOUT, 0};
    while (::poll(&done, 1, 5000) < 0 && errno == EINTR) {
    }
    socklen_t length = sizeof error;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
  }
  if (error != 0)
    std::fprintf(stderr, "connect: %s; the service's last line: %s\n", std::strerror(error), last_log().c_str());
  FUZZ_CHECK(error == 0);
  timeval limit{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  return fd;
}

void send_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the service closed it: allowed
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

// Process 1's half of the handshake; its key towards the service, or
// nothing if the service refused it.
std::optional<std::string> authenticate(int fd, dew::runtime::FrameReader& frames, std::string_view nonce) {
  const std::string client_nonce = dew::runtime::auth::random_nonce();
  send_all(fd, wire::encode(wire::Frame{wire::Type::kHello,
                                        {wire::encode_u64(1), wire::encode_u64(2), client_nonce,
                                         dew::runtime::auth::hello_mac(kSecret, nonce, 1, 2)}}));
  std::string error;
  auto welcome = frames.next(error);
  FUZZ_CHECK(welcome.has_value());
  if (welcome->type != wire::Type::kWelcome) return std::nullopt;
  return dew::runtime::auth::frame_keys(kSecret, nonce, client_nonce, 1).to_service;
}

// The input's leading whole frames, each with its tag; then the rest as is.
std::string tagged(std::string_view input, const std::string& key) {
  std::string out;
  for (std::uint64_t sequence = 0;; ++sequence) {
    const auto decoded = wire::decode_views(input, wire::kMaxFrameBytes);
    if (decoded.status != wire::DecodeStatus::kFrame) break;
    const std::string_view frame = input.substr(0, decoded.consumed);
    const auto tag = dew::runtime::auth::frame_tag(key, sequence, frame);
    out += frame;
    out.append(reinterpret_cast<const char*>(tag.data()), tag.size());
    input.remove_prefix(decoded.consumed);
  }
  return out += input;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  FUZZ_CHECK(dew::runtime::auth::ready());
  const int fd = connect_to_service();
  dew::runtime::FrameReader frames(fd, std::size_t{1} << 30);
  std::string error;
  auto challenge = frames.next(error);
  FUZZ_CHECK(challenge.has_value() && challenge->type == wire::Type::kChallenge);
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  std::optional<std::string> key;
  if ((data[0] & 1) != 0) key = authenticate(fd, frames, challenge->items[0]);
  send_all(fd, key && (data[0] & 2) != 0 ? tagged(input, *key) : std::string(input));
  // Done sending: the service must close the connection (at once, or after
  // a refusal's 100 ms), whatever it was sent.
  ::shutdown(fd, SHUT_WR);
  char sink[4096];
  ssize_t n = 0;
  while ((n = ::recv(fd, sink, sizeof sink, 0)) > 0 || (n < 0 && errno == EINTR)) {
  }
  if (!(n == 0 || errno == ECONNRESET)) {
    std::fprintf(stderr, "recv: %s; the service's last line: %s\n", std::strerror(errno), last_log().c_str());
  }
  FUZZ_CHECK(n == 0 || errno == ECONNRESET);
  // Reset rather than linger in TIME_WAIT: thousands of inputs a second
  // would use up the ephemeral ports.
  linger reset{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  ::close(fd);
  return 0;
}
