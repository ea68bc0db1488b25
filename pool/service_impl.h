// The coordination service's state and its two halves: connections
// (coordination_service.cpp: accept, read, write, the handshake, heartbeats)
// and requests (service_requests.cpp: keys, agreements, gathers, failures).
// One Asio io_context on one thread owns all of it, so nothing here locks
// except what other threads read (flush_failure, wait_until_others_left,
// unconnected_ranks). Private to pool/.
#pragma once

#include <array>
#include <asio.hpp>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "coordination.h"
#include "wire.h"

namespace dew::runtime {

struct CoordinationService::Impl {
  using Clock = std::chrono::steady_clock;
  using tcp = asio::ip::tcp;

  // A process's part of a gather, left in the buffer it arrived in when it
  // filled the buffer (a large one), so it is never copied inside process 0.
  struct Part {
    std::string storage;
    std::size_t offset = 0;
    std::size_t length = 0;
    std::string_view bytes() const { return std::string_view(storage).substr(offset, length); }
  };

  // Bytes queued for one connection: a frame's own bytes, then (for a
  // gather's reply) every process's part, shared by all the replies and
  // written from where it arrived. Each connection lets go of a part once it
  // has written it, so a part is freed when the slowest connection is past
  // it, not when the whole round is out.
  struct Outgoing {
    std::string head;
    std::vector<std::shared_ptr<const Part>> parts;
    bool head_sent = false;
    std::size_t parts_sent = 0;
    std::string length;  // the part being written: its 4-byte length
  };

  struct Session {
    explicit Session(tcp::socket s) : socket(std::move(s)) {}
    tcp::socket socket;
    std::string peer;   // "127.0.0.1:40112", for log lines
    std::string nonce;  // our challenge
    int rank = -1;      // -1 until authenticated, -2 once refused
    bool bye = false;
    bool closed = false;
    Clock::time_point opened = Clock::now();
    Clock::time_point last_heard = Clock::now();
    std::string in;
    std::array<char, 65536> chunk{};
    std::deque<Outgoing> out;
  };
  using SessionPtr = std::shared_ptr<Session>;

  // A request waiting for an answer. Its timer's handler may already be
  // queued when the answer comes (an expired timer cannot be cancelled), so
  // handlers find their waiter again by id and do nothing if it is gone:
  // no handler holds an iterator or a reference into the containers.
  struct Waiter {
    std::uint64_t id = 0;
    SessionPtr session;
    std::string request;
    std::shared_ptr<asio::steady_timer> timer;
  };
  struct Agreement {
    std::set<int> arrived;
    std::vector<Waiter> waiters;
  };
  struct Gathering {
    std::map<int, Part> parts;
    std::vector<Waiter> waiters;
  };

  // Notices about connections from outside the pool, at most one line a
  // second: the rest are counted into the next line, so strangers cannot
  // flood the job's log.
  struct StrangerNotices {
    Clock::time_point last_line{};
    int held_back = 0;
  };

  explicit Impl(ServiceConfig c)
      : config(std::move(c)), acceptor(io), heartbeat(io), accept_pause(io), clients(config.size) {}

  ServiceConfig config;
  asio::io_context io;
  tcp::acceptor acceptor;
  asio::steady_timer heartbeat;
  asio::steady_timer accept_pause;  // backing off while file descriptors run out
  std::thread thread;
  std::uint16_t port = 0;

  std::vector<SessionPtr> clients;  // by rank, authenticated only
  std::set<SessionPtr> pending;     // not yet authenticated
  std::map<std::string, std::string> kv;
  std::multimap<std::string, Waiter> gets;  // by key
  std::map<std::string, Agreement> agreements;
  std::map<std::string, Gathering> gatherings;
  std::uint64_t next_waiter = 1;
  std::optional<PeerFailure> failure;
  StrangerNotices strangers;
  int accept_failures = 0;  // in a row

  // Read by other threads.
  mutable std::mutex mutex;
  std::condition_variable changed;
  std::set<int> gone;       // ranks that left (bye) or were lost
  std::set<int> connected;  // ranks authenticated and not yet gone
  bool failure_flushed = false;

  // Connections (coordination_service.cpp).
  Result<std::uint16_t> listen(std::uint16_t wanted);
  void accept();
  void accepted(tcp::socket socket);
  void accept_failed(std::error_code ec);
  void send(const SessionPtr& session, const wire::Frame& frame);
  void send_shared(const SessionPtr& session, std::string head, std::vector<std::shared_ptr<const Part>> parts);
  void write(const SessionPtr& session);
  void note_flushed();
  void read(const SessionPtr& session);
  bool take_frames(const SessionPtr& session);
  void take_gather(const SessionPtr& session, const wire::DecodedViews& decoded);
  void refuse(const SessionPtr& session, const std::string& reason);
  void handle_hello(const SessionPtr& session, const wire::Frame& frame);
  void close(const SessionPtr& session, const std::string& why);
  void note_stranger(const std::string& line);
  void flush_stranger_notices();
  void beat();
  void log(const std::string& line) {
    if (config.log) config.log(line);
  }

  // Requests (service_requests.cpp).
  void handle(const SessionPtr& session, wire::Frame& frame);
  void handle_put(wire::Frame& frame);
  void handle_get(const SessionPtr& session, const wire::Frame& frame);
  void handle_agree(const SessionPtr& session, const wire::Frame& frame);
  void handle_gather(const SessionPtr& session, const std::string& request, const std::string& round,
                     std::string_view patience, Part part);
  void complete_gather(const std::string& round);
  std::shared_ptr<asio::steady_timer> timer_for(std::string_view patience_item);
  // Removes the waiter `id`; nullopt if it was answered meanwhile.
  static std::optional<Waiter> take_waiter(std::vector<Waiter>& waiters, std::uint64_t id);
  std::vector<int> missing_from(const std::set<int>& arrived) const;
  // The first failure wins; it goes to every connected process, and to any
  // that connects later.
  void publish(PeerFailure failed);
};

}  // namespace dew::runtime
