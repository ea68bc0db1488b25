#include "coordination_connect.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "auth.h"
#include "dew/log.h"
#include "dew/text.h"
#include "handshake.h"
#include "silence_verdict.h"
#include "wait_reporter.h"
#include "wire.h"

namespace dew::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using asio::ip::tcp;

// One connection attempt, given up at `deadline`.
std::error_code connect_before(asio::io_context& io, tcp::socket& socket, const tcp::resolver::results_type& endpoints,
                               Clock::time_point deadline) {
  std::error_code result = asio::error::would_block;
  asio::async_connect(socket, endpoints, [&](std::error_code ec, const tcp::endpoint&) { result = ec; });
  io.restart();
  io.run_until(deadline);
  if (result == asio::error::would_block) {
    std::error_code ignored;
    socket.close(ignored);
    io.run();  // the aborted handler
    return asio::error::timed_out;
  }
  return result;
}

// Connects, retrying while nothing listens (process 0 may start later).
Result<tcp::socket> connect_with_retries(asio::io_context& io, const ClientConfig& config, const std::string& where) {
  tcp::resolver resolver(io);
  WaitReporter reporter("the coordinator at " + where, config.join_deadline - config.join_timeout, config.join_timeout);
  std::string last_error;
  for (auto pause = std::chrono::milliseconds(10);; pause = std::min(pause * 2, std::chrono::milliseconds(250))) {
    std::error_code ec;
    auto endpoints = resolver.resolve(config.host, std::to_string(config.port), ec);
    if (ec == asio::error::host_not_found || ec == asio::error::service_not_found) {
      return not_found("cannot resolve the coordinator's host " + quoted(config.host) + " (" + where +
                       "): " + ec.message());
    }
    const bool resolved = !ec;
    if (resolved) {
      tcp::socket socket(io);
      ec = connect_before(io, socket, endpoints, config.join_deadline);
      if (!ec) return socket;
    }
    last_error = ec.message();
    log_debug("join: " + where + ": " + last_error + "; trying again in " + std::to_string(pause.count()) + " ms");
    if (Clock::now() + pause >= config.join_deadline) {
      const std::string within = " within " + seconds_text(config.join_timeout) + " (DEW_JOIN_TIMEOUT_SECONDS): ";
      if (!resolved) {
        return timeout_error("cannot resolve the coordinator's host " + quoted(config.host) + within + last_error);
      }
      return timeout_error("cannot reach the coordinator at " + where + within + "connecting: " + last_error);
    }
    reporter.tick(last_error);
    std::this_thread::sleep_for(pause);
  }
}

// Reads what the service sends until `read` concludes or the deadline passes.
// A service that accepted the connection (its kernel did) and then says
// nothing for the heartbeat timeout is stopped or frozen: "silent", at once,
// not at the join's deadline.
template <typename Read>
handshake::Reading read_until_conclusive(int fd, std::string& buffer, const ClientConfig& config,
                                         WaitReporter& reporter, std::string& error, Read read) {
  constexpr auto kLook = std::chrono::seconds(1);
  const auto bound = handshake_silence_bound(config.heartbeat_timeout, config.size);
  auto heard = Clock::now();
  auto last_look = heard;
  for (;;) {
    auto reading = read(std::string_view(buffer));
    if (reading.heard != handshake::Heard::kNeedMore) return reading;
    const auto now = Clock::now();
    const auto left = config.join_deadline - now;
    if (left <= Clock::duration::zero()) {
      error = "timed out";
      return reading;
    }
    // Bytes are read as soon as they come (nothing waits unread here).
    if (lost_for_silence(SilenceFacts{now - heard, now - last_look, kLook, bound, 0})) {
      error = "silent";
      return reading;
    }
    last_look = now;
    pollfd ready{fd, POLLIN, 0};
    const auto wait = std::min<Clock::duration>(left, kLook);
    const int polled = ::poll(&ready, 1, static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(wait).count()));
    if (polled < 0 && errno != EINTR) {
      error = std::string("poll failed: ") + std::strerror(errno);
      return reading;
    }
    if (polled <= 0) {
      reporter.tick("");
      continue;
    }
    char chunk[4096];
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      error = n == 0 ? "the connection was closed" : std::string("receive failed: ") + std::strerror(errno);
      return reading;
    }
    buffer.append(chunk, static_cast<std::size_t>(n));
    heard = Clock::now();
  }
}

Error handshake_error(const handshake::Reading& reading, const std::string& buffer, const std::string& error,
                      const ClientConfig& config, const std::string& where) {
  using handshake::Heard;
  switch (reading.heard) {
    case Heard::kNotDew:
      return unavailable("the coordinator at " + where + " is not a Dew coordination service: handshake: heard " +
                         reading.value + " (another program on that port?)");
    case Heard::kRefused:
      return permission_denied("the coordination service at " + where + " refused process " +
                               std::to_string(config.rank) + ": " + reading.value);
    case Heard::kBusy:
      return unavailable("the coordination service at " + where +
                         " was still busy with unauthenticated connections when the join's time was up (" +
                         reading.value + "); something floods its port");
    case Heard::kWrongSecret:
      return permission_denied("the coordination service at " + where +
                               " does not know this pool's secret (another pool's coordinator on that port?)");
    default:
      break;
  }
  const std::string heard = handshake::describe_heard(buffer);
  if (error == "silent") {
    return unavailable("process 0 stopped answering during the join: the coordination service at " + where +
                       " accepted the connection, then said nothing for " +
                       seconds_text(handshake_silence_bound(config.heartbeat_timeout, config.size)) +
                       " (DEW_HEARTBEAT_TIMEOUT_SECONDS and 10 ms a process of the pool; process 0 stopped or "
                       "frozen); heard " +
                       heard);
  }
  if (error == "timed out") {
    return timeout_error("the coordinator at " + where +
                         " accepted the connection but the handshake did not end within " +
                         seconds_text(config.join_timeout) + " (DEW_JOIN_TIMEOUT_SECONDS): heard " + heard +
                         (buffer.empty() ? " (a silent listener on that port, or process 0 is stopped)" : ""));
  }
  return unavailable("the coordinator at " + where + " ended the handshake: " + error + " after sending " + heard);
}

void send_all(int fd, const std::string& bytes) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the next read says the connection is gone
    sent += static_cast<std::size_t>(n);
  }
}

// Connects and reads the service's challenge; a service busy with strangers
// (a flood of connections that never authenticate) says so instead, and the
// process connects again after a pause, until the join's deadline.
Result<ServiceConnection> connect_for_challenge(asio::io_context& io, const ClientConfig& config,
                                                const std::string& where, handshake::Reading& challenge) {
  WaitReporter reporter("the coordination service at " + where + " to answer",
                        config.join_deadline - config.join_timeout, config.join_timeout);
  for (auto pause = std::chrono::milliseconds(10);; pause = std::min(pause * 2, std::chrono::milliseconds(100))) {
    auto socket = connect_with_retries(io, config, where);
    if (!socket.ok()) return socket.error();
    std::error_code ignored;
    socket.value().set_option(tcp::no_delay(true), ignored);
    const int fd = socket.value().native_handle();
    // The asynchronous connect left the descriptor non-blocking; from here on
    // the client reads and writes it with blocking calls (poll bounds the
    // handshake's waits).
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    std::string buffer;
    std::string error;
    challenge = read_until_conclusive(fd, buffer, config, reporter, error, handshake::read_challenge);
    if (challenge.heard == handshake::Heard::kChallenge) {
      buffer.erase(0, challenge.consumed);
      return ServiceConnection{std::move(socket.value()), std::move(buffer), {}};
    }
    if (challenge.heard != handshake::Heard::kBusy || Clock::now() + pause >= config.join_deadline) {
      return handshake_error(challenge, buffer, error, config, where);
    }
    log_debug("join: " + where + " is busy (" + challenge.value + "); connecting again in " +
              std::to_string(pause.count()) + " ms");
    reporter.tick("it is busy: " + challenge.value);
    std::this_thread::sleep_for(pause);
  }
}

}  // namespace

Result<ServiceConnection> connect_to_service(asio::io_context& io, const ClientConfig& config) {
  const std::string where = host_port(config.host, std::to_string(config.port));
  // The service's challenge, our proof, its proof back.
  handshake::Reading challenge;
  auto connection = connect_for_challenge(io, config, where, challenge);
  if (!connection.ok()) return connection.error();
  const int fd = connection.value().socket.native_handle();
  WaitReporter reporter("the coordination service at " + where + " to answer",
                        config.join_deadline - config.join_timeout, config.join_timeout);
  std::string buffer = std::move(connection.value().leftover);
  std::string error;
  std::string secret = config.secret;
  if (secret.empty() && config.secret_from_credential) {
    if (challenge.credential.empty()) {
      return unavailable("the coordination service at " + where +
                         " sent no MUNGE credential (its process 0 has a DEW_POOL_SECRET this process lacks); set "
                         "the same DEW_POOL_SECRET for every process");
    }
    auto opened = config.secret_from_credential(challenge.credential);
    if (!opened.ok()) return opened.error();
    secret = opened.value();
  }

  const std::string client_nonce = auth::random_nonce();
  const auto rank = static_cast<std::uint64_t>(config.rank);
  const auto size = static_cast<std::uint64_t>(config.size);
  send_all(fd, wire::encode(wire::Frame{wire::Type::kHello,
                                        {wire::encode_u64(rank), wire::encode_u64(size), client_nonce,
                                         auth::hello_mac(secret, challenge.value, rank, size)}}));
  auto welcome = read_until_conclusive(fd, buffer, config, reporter, error, [&](std::string_view bytes) {
    return handshake::read_welcome(bytes, secret, client_nonce);
  });
  if (welcome.heard != handshake::Heard::kWelcome) return handshake_error(welcome, buffer, error, config, where);
  buffer.erase(0, welcome.consumed);
  return ServiceConnection{std::move(connection.value().socket), std::move(buffer),
                           auth::frame_keys(secret, challenge.value, client_nonce, rank)};
}

}  // namespace dew::runtime
