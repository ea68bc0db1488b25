// A pool of real pool_worker processes on localhost, and a raw TCP peer for
// talking to its coordination service by hand: shared by the pool's tests.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "process.h"
#include "test_paths.h"
#include "wire.h"

namespace dew::testing {

using namespace std::chrono_literals;

inline std::string worker() { return pool_worker(); }

inline const std::string kSecret = "5f0c3a0e8d2b4f6a9c1e7d3b5a8f2c4e6b9d1a3c5e7f9b2d4a6c8e0f1a3b5c7d";

// A pool of `size` pool_workers started the way srun --dew-pool and dew
// launch start them: DEW_* variables only.
struct LocalPool {
  // `service_port`: where process 0 listens (default: a free port).
  LocalPool(int size, const std::vector<std::string>& args, std::map<std::string, std::string> extra = {},
            std::map<int, std::map<std::string, std::string>> per_rank = {},
            std::optional<std::uint16_t> service_port = std::nullopt)
      : port(service_port.value_or(free_loopback_port())) {
    for (int rank = 0; rank < size; ++rank) {
      auto env = extra;
      env["DEW_PROCESS_ID"] = std::to_string(rank);
      env["DEW_PROCESS_COUNT"] = std::to_string(size);
      env["DEW_COORDINATOR_ADDRESS"] = "127.0.0.1:" + std::to_string(port);
      env["DEW_POOL_SECRET"] = kSecret;
      for (const auto& [name, value] : per_rank[rank]) env[name] = value;
      std::vector<std::string> argv = {worker()};
      argv.insert(argv.end(), args.begin(), args.end());
      ranks.push_back(std::make_unique<Spawned>(argv, env));
    }
  }
  // Every exit code, waiting at most `timeout` in all.
  std::vector<int> wait_all(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<int> codes;
    for (auto& rank : ranks) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      codes.push_back(rank->wait(std::max(left, 0ms)));
    }
    return codes;
  }
  std::string all_output() const {
    std::string text;
    for (const auto& rank : ranks) text += rank->out() + rank->err();
    return text;
  }
  std::string describe() const {
    std::string text;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      text += "--- rank " + std::to_string(r) + " stdout:\n" + ranks[r]->out() + "--- stderr:\n" + ranks[r]->err();
    }
    return text;
  }
  std::uint16_t port;
  std::vector<std::unique_ptr<Spawned>> ranks;
};

// A raw TCP peer speaking (or not) the service's protocol.
class RawClient {
 public:
  explicit RawClient(std::uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(port);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    timeval timeout{5, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  }
  ~RawClient() { close(fd_); }
  bool connected() const { return connected_; }
  void send_bytes(const std::string& bytes) {
    [[maybe_unused]] auto n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  // Reads until the service closes (or 5 s pass); true if it closed.
  bool read_until_closed(std::string& got) {
    char buffer[4096];
    for (;;) {
      const ssize_t n = recv(fd_, buffer, sizeof buffer, 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
      got.append(buffer, static_cast<std::size_t>(n));
    }
  }
  std::optional<dew::runtime::wire::Frame> read_frame() {
    std::string buffer;
    char chunk[4096];
    for (;;) {
      auto decoded = dew::runtime::wire::decode(buffer, dew::runtime::wire::kMaxFrameBytes);
      if (decoded.status == dew::runtime::wire::DecodeStatus::kFrame) return decoded.frame;
      if (decoded.status == dew::runtime::wire::DecodeStatus::kBad) return std::nullopt;
      const ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) return std::nullopt;
      buffer.append(chunk, static_cast<std::size_t>(n));
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

}  // namespace dew::testing
