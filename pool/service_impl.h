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

#include "auth.h"
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

  // What a connection has left to write: chunks, each a frame's own bytes,
  // a tag, or (for a gather's reply) a run of parts with their lengths,
  // shared by every reply of the round. A write takes up to kChunksPerWrite
  // chunks at once (one sendmsg for a whole small reply, a few for 1024
  // parts), and drops each chunk once written, so a large part is freed
  // when the slowest connection is past it, not when the round is out.
  using Chunk = std::shared_ptr<const Part>;
  static constexpr std::size_t kStrangerReadBytes = wire::kMaxHandshakeFrameBytes + wire::kHeaderBytes;
  static constexpr std::size_t kReadBytes = std::size_t{64} << 10;
  // Unauthenticated connections held at once: enough for every process of
  // the pool to be mid-handshake twice over, so a join never meets the cap,
  // and a few hundred more. A new stranger past it takes the place of the
  // oldest one that has had kStrangerGrace to authenticate; with none such,
  // it is told the service is busy (the client connects again).
  std::size_t max_strangers() const { return 2 * static_cast<std::size_t>(config.size) + 512; }
  static constexpr std::chrono::milliseconds kStrangerGrace{200};
  static constexpr std::size_t kChunksPerWrite = 64;
  static constexpr std::size_t kBytesPerWrite = std::size_t{256} << 10;
  static Chunk chunk_of(std::string bytes);

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
    Clock::time_point said_slow{};  // when it was last named as slow
    std::string in;
    // What one read takes: small until the session is authenticated (a
    // stranger holds little: the handshake's frames are small), then 64 KiB.
    std::vector<char> chunk = std::vector<char>(kStrangerReadBytes);
    std::deque<Chunk> out;
    std::size_t in_flight = 0;  // chunks at the front of `out` being written
    // Tag keys and sequence numbers (auth.h), set once the hello is accepted.
    auth::FrameKeys keys;
    std::uint64_t sent_frames = 0;
    std::uint64_t received_frames = 0;
  };
  using SessionPtr = std::shared_ptr<Session>;

  // A request waiting for an answer until its deadline (its patience). A
  // get has a timer of its own; a round's waiters share the round's. A
  // timer's handler may already be queued when the answer comes (an expired
  // timer cannot be cancelled), so handlers find their waiter or round again
  // by id or name and do nothing if it is gone: no handler holds an iterator
  // or a reference into the containers.
  struct Waiter {
    std::uint64_t id = 0;
    SessionPtr session;
    std::string request;
    Clock::time_point deadline;
    std::shared_ptr<asio::steady_timer> timer;  // a get's
  };
  // When a round began (its first arrival) and when it is next said to be
  // slow: at slow_after, then at twice, four times ... that wait.
  struct Slowness {
    Clock::time_point started = Clock::now();
    Clock::duration next_word{};
  };
  // An agreement's or a gather's waiters and one timer, set for the earliest
  // deadline among them: a round of 1024 processes sets one timer, not 1024
  // that are each set, cancelled and run.
  struct Round {
    std::vector<Waiter> waiters;
    Slowness slowness;
    std::unique_ptr<asio::steady_timer> timer;
    Clock::time_point timer_at = Clock::time_point::max();
  };
  struct Agreement : Round {
    std::set<int> arrived;
  };
  struct Gathering : Round {
    std::map<int, Part> parts;
  };

  // Notices about connections from outside the pool, at most one line a
  // second: the rest are counted into the next line, so strangers cannot
  // flood the job's log.
  struct StrangerNotices {
    Clock::time_point last_line{};
    int held_back = 0;
  };

  explicit Impl(ServiceConfig c)
      : config(std::move(c)),
        tail_key(auth::tail_key(config.secret)),
        acceptor(io),
        heartbeat(io),
        slow_check(io),
        accept_pause(io),
        clients(config.size) {}

  ServiceConfig config;
  std::string tail_key;  // the pool's, for the shared tails of gather replies (auth.h)
  asio::io_context io;
  tcp::acceptor acceptor;
  asio::steady_timer heartbeat;
  asio::steady_timer slow_check;
  asio::steady_timer accept_pause;  // backing off while file descriptors run out
  std::thread thread;
  std::uint16_t port = 0;

  std::vector<SessionPtr> clients;  // by rank, authenticated only
  std::set<SessionPtr> pending;     // not yet authenticated
  std::map<std::string, std::string> kv;
  std::multimap<std::string, Waiter> gets;  // by key
  std::map<std::string, Agreement> agreements;
  std::map<std::string, Gathering> gatherings;
  std::set<int> left;  // ranks that left the pool (said bye), on the service's thread
  std::uint64_t next_waiter = 1;
  std::optional<PeerFailure> failure;
  StrangerNotices strangers;
  int accept_failures = 0;   // in a row
  int strangers_closed = 0;  // since memory was last given back
  // The heartbeat timer's last run, and when it last ran late: process 0
  // itself was stopped or starved, and the silence it saw is not a peer's.
  Clock::time_point last_beat = Clock::now();
  Clock::time_point paused_at{};
  Clock::time_point last_slow_line{};

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
  // Makes room for one more stranger; false when none may be dropped yet.
  bool room_for_stranger();
  void accept_failed(std::error_code ec);
  void send(const SessionPtr& session, const wire::Frame& frame);
  // A frame made of its own head and chunks shared with other replies, whose
  // bytes' hash (for the tag) the caller computed once.
  void send_shared(const SessionPtr& session, std::string head, const std::vector<Chunk>& tail,
                   const auth::TailHash& tail_hash);
  void queue(const SessionPtr& session, Chunk chunk);
  void write(const SessionPtr& session);
  void note_flushed();
  void read(const SessionPtr& session);
  bool take_frames(const SessionPtr& session);
  // Whether the tag after the frame of `bytes` bytes at the front of the
  // session's buffer is right; publishes the alteration when not.
  bool tag_holds(const SessionPtr& session, std::size_t bytes, wire::Type type);
  void take_gather(const SessionPtr& session, const wire::DecodedViews& decoded);
  void refuse(const SessionPtr& session, const std::string& reason);
  void handle_hello(const SessionPtr& session, const wire::Frame& frame);
  void close(const SessionPtr& session, const std::string& why);
  void note_stranger(const std::string& line);
  void flush_stranger_notices();
  void beat();
  // Says which rounds have waited past slow_after, and for whom.
  void say_slow_rounds(Clock::time_point now);
  void watch_slow_rounds();
  // A process heard after a silence of over half the heartbeat timeout (two
  // heartbeats late) is named as slow, at most once per slow_after.
  void note_gap(Session& session, Clock::time_point now);
  void log(const std::string& line) {
    if (config.log) config.log(line);
  }

  // Requests (service_requests.cpp).
  void handle(const SessionPtr& session, wire::Frame& frame);
  void handle_put(wire::Frame& frame);
  void store(const std::string& key, std::string value);
  void handle_get(const SessionPtr& session, const wire::Frame& frame);
  void handle_agree(const SessionPtr& session, const wire::Frame& frame);
  void handle_gather(const SessionPtr& session, const std::string& request, const std::string& round,
                     std::string_view patience, Part part);
  void complete_gather(const std::string& round);
  static Clock::time_point deadline_of(std::string_view patience_item);
  // Adds a waiter to round `name` of `rounds` and sets the round's timer
  // when its deadline is the earliest.
  template <typename R>
  void wait_in(std::map<std::string, R>& rounds, const std::string& name, Waiter waiter);
  // Answers the round's waiters whose patience has run out (the processes
  // still missing), and sets the timer for the next deadline.
  template <typename R>
  void time_out(std::map<std::string, R>& rounds, const std::string& name);
  std::vector<int> missing_from(const std::set<int>& arrived) const;
  static std::set<int> arrived_in(const Agreement& agreement) { return agreement.arrived; }
  static std::set<int> arrived_in(const Gathering& gathering);
  // The first failure wins; it goes to every connected process, and to any
  // that connects later.
  void publish(PeerFailure failed);
  // A process left the pool (its bye; process 0 as it waits for the others):
  // a round open without it can never complete, and is its failure.
  void leaves(int rank);
  void fail_rounds_missing_a_leaver();
};

}  // namespace dew::runtime
