// An on-path relay without the secret, between process 1 and the
// coordination service: it lets the handshake through and then changes one
// byte of one frame. Every frame after the handshake carries a tag, so the
// change is found, the pool ends, and the line names the altered connection
// (before the tags, both processes read the rewritten value and exited 0).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <thread>

#include "auth.h"
#include "local_pool.h"

namespace {

using dew::testing::LocalPool;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
namespace wire = dew::runtime::wire;
using namespace std::chrono_literals;

enum class Direction { kToService, kToClient };

// Forwards one connection from `listen_port` to the service at
// `service_port`, frame by frame; `change` may alter a whole frame (its bytes
// without the tag) before it goes on. The first frames of each direction are
// the handshake's (no tag): the hello one way, the challenge and welcome the
// other.
class Relay {
 public:
  using Change = std::function<void(Direction, wire::Type, std::string&)>;
  Relay(std::uint16_t service_port, Change change) : service_port_(service_port), change_(std::move(change)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in address = loopback(0);
    ::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address);
    ::listen(listener_, 4);
    socklen_t length = sizeof address;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~Relay() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
  }
  std::uint16_t port() const { return port_; }
  int changed() const { return changed_.load(); }

 private:
  static sockaddr_in loopback(std::uint16_t port) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(port);
    return address;
  }

  struct Side {
    int from = -1;
    int to = -1;
    Direction direction;
    std::size_t untagged;  // handshake frames still to pass without a tag
    std::string buffer;
  };

  // Passes on every whole frame (and its tag) in the side's buffer.
  void pass_frames(Side& side) {
    for (;;) {
      const auto decoded = wire::decode(side.buffer, wire::kMaxFrameBytes);
      if (decoded.status != wire::DecodeStatus::kFrame) return;
      const std::size_t tag = side.untagged > 0 ? 0 : dew::runtime::auth::kTagBytes;
      if (side.buffer.size() < decoded.consumed + tag) return;
      std::string frame = side.buffer.substr(0, decoded.consumed);
      const std::string before = frame;
      change_(side.direction, decoded.frame.type, frame);
      if (frame != before) ++changed_;
      const bool dropped = frame.empty();  // the frame and its tag
      frame += side.buffer.substr(decoded.consumed, tag);
      side.buffer.erase(0, decoded.consumed + tag);
      if (side.untagged > 0) --side.untagged;
      if (dropped) continue;
      [[maybe_unused]] auto n = ::send(side.to, frame.data(), frame.size(), MSG_NOSIGNAL);
    }
  }

  void run() {
    pollfd waiting{listener_, POLLIN, 0};
    while (!stop_ && ::poll(&waiting, 1, 100) <= 0) {
    }
    if (stop_) return;
    const int client = ::accept(listener_, nullptr, nullptr);
    // Process 0 may not listen yet: connect until it does.
    int service = -1;
    for (int attempt = 0; attempt < 1000 && !stop_; ++attempt) {
      service = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in address = loopback(service_port_);
      if (::connect(service, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) break;
      ::close(service);
      service = -1;
      std::this_thread::sleep_for(10ms);
    }
    Side sides[2] = {{client, service, Direction::kToService, 1, {}}, {service, client, Direction::kToClient, 2, {}}};
    while (!stop_) {
      pollfd ready[2] = {{client, POLLIN, 0}, {service, POLLIN, 0}};
      if (::poll(ready, 2, 100) <= 0) continue;
      bool closed = false;
      for (int i = 0; i < 2; ++i) {
        if (!(ready[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char chunk[65536];
        const ssize_t n = ::recv(sides[i].from, chunk, sizeof chunk, 0);
        if (n <= 0) {
          closed = true;
          break;
        }
        sides[i].buffer.append(chunk, static_cast<std::size_t>(n));
        pass_frames(sides[i]);
      }
      if (closed) break;
    }
    ::close(client);
    ::close(service);
  }

  std::uint16_t service_port_;
  Change change_;
  int listener_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> changed_{0};
  std::thread thread_;
};

// The last byte of a frame's last item (a put's value, a value's value).
void flip_last_byte(std::string& frame) { frame.back() = static_cast<char>(frame.back() ^ 0x20); }

// Process 1 of 2 through the relay; both play `exchange` (put, get, gather).
struct RelayedPool {
  explicit RelayedPool(const Relay::Change& change, const std::vector<std::string>& scenario = {"exchange"})
      : port(dew::testing::free_loopback_port()), relay(port, change), pool(make_pool(scenario)) {}
  LocalPool make_pool(const std::vector<std::string>& scenario) {
    return LocalPool(2, scenario, {}, {{1, {{"DEW_COORDINATOR_ADDRESS", "127.0.0.1:" + std::to_string(relay.port())}}}},
                     port);
  }
  std::uint16_t port;
  Relay relay;
  LocalPool pool;
};

// The relay changed one frame, and neither process exited 0.
void expect_one_change_ended_the_pool(RelayedPool& relayed) {
  const auto codes = relayed.pool.wait_all(30s);
  EXPECT_EQ(relayed.relay.changed(), 1);
  EXPECT_NE(codes[0], 0) << relayed.pool.describe();
  EXPECT_NE(codes[1], 0) << relayed.pool.describe();
}

TEST(FrameTags, ARelayThatRewritesAPutValueIsFoundAndThePoolEndsNamingTheConnection) {
  RelayedPool relayed([](Direction direction, wire::Type type, std::string& frame) {
    if (direction == Direction::kToService && type == wire::Type::kPut) flip_last_byte(frame);
  });
  expect_one_change_ended_the_pool(relayed);
  // The frame's number in its direction: the join's own frames come first.
  const auto said = ContainsRegex(
      "ending: process 1 failed: the connection of process 1 to the coordination service was altered on the way: "
      "its put frame [0-9]+ failed its integrity check \\(a relay or a faulty network between process 1 and "
      "process 0\\)");
  EXPECT_THAT(relayed.pool.ranks[0]->err(), said) << relayed.pool.describe();
  EXPECT_THAT(relayed.pool.ranks[1]->err(), said) << relayed.pool.describe();
  EXPECT_THAT(relayed.pool.all_output(), Not(HasSubstr("RESULT")));
}

TEST(FrameTags, ARelayThatRewritesAValueOnItsWayToTheClientIsFoundByTheClient) {
  RelayedPool relayed([](Direction direction, wire::Type type, std::string& frame) {
    if (direction == Direction::kToClient && type == wire::Type::kValue) flip_last_byte(frame);
  });
  expect_one_change_ended_the_pool(relayed);
  EXPECT_THAT(relayed.pool.ranks[1]->err(),
              HasSubstr("the connection of process 1 to the coordination service was altered on the way: its value "
                        "frame "))
      << relayed.pool.describe();
  EXPECT_THAT(relayed.pool.ranks[0]->err(), HasSubstr("failed its integrity check")) << relayed.pool.describe();
  EXPECT_THAT(relayed.pool.all_output(), Not(HasSubstr("RESULT")));
}

// A large reply (read item by item, its tail digested as it arrives).
TEST(FrameTags, ARelayThatRewritesALargeGatherReplyIsFound) {
  RelayedPool relayed(
      [](Direction direction, wire::Type type, std::string& frame) {
        if (direction == Direction::kToClient && type == wire::Type::kGathered) frame[frame.size() / 2] ^= 1;
      },
      {"gather", std::to_string(3 << 20), "1"});
  const auto codes = relayed.pool.wait_all(60s);
  EXPECT_NE(codes[1], 0) << relayed.pool.describe();
  EXPECT_THAT(relayed.pool.ranks[1]->err(), ContainsRegex("its gathered frame [0-9]+ from the coordination service "
                                                          "failed its integrity check"))
      << relayed.pool.describe();
  EXPECT_THAT(relayed.pool.ranks[1]->out(), Not(HasSubstr("GATHER ok")));  // process 0's own reply was not relayed
}

// A frame put in another's place keeps no tag that holds; a dropped frame
// shifts every later sequence number, so the next frame's tag fails.
TEST(FrameTags, ARelayThatReplacesOrDropsAFrameIsFound) {
  RelayedPool replaced([](Direction direction, wire::Type type, std::string& frame) {
    if (direction == Direction::kToService && type == wire::Type::kPut) {
      frame = wire::encode(wire::Frame{wire::Type::kHeartbeat, {}});
    }
  });
  EXPECT_NE(replaced.pool.wait_all(30s)[0], 0) << replaced.pool.describe();
  EXPECT_THAT(replaced.pool.all_output(), ContainsRegex("its heartbeat frame [0-9]+ failed its integrity check"))
      << replaced.pool.describe();

  RelayedPool relayed([](Direction direction, wire::Type type, std::string& frame) {
    if (direction == Direction::kToService && type == wire::Type::kPut) frame.clear();
  });
  const auto codes = relayed.pool.wait_all(30s);
  EXPECT_NE(codes[0], 0) << relayed.pool.describe();
  EXPECT_THAT(relayed.pool.all_output(), ContainsRegex("its agree frame [0-9]+ failed its integrity check"))
      << relayed.pool.describe();
}

// The relay itself changes nothing: the pool works through it (the test's
// own check that the relay forwards faithfully).
TEST(FrameTags, AFaithfulRelayChangesNothing) {
  RelayedPool relayed([](Direction, wire::Type, std::string&) {});
  EXPECT_EQ(relayed.pool.wait_all(30s), std::vector<int>({0, 0})) << relayed.pool.describe();
  EXPECT_THAT(relayed.pool.ranks[1]->out(), HasSubstr("gets=hello from 0|hello from 1"));
}

}  // namespace
