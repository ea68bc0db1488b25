// The coordination service: one Asio io_context on one thread owns every
// connection and all of the pool's shared state, so nothing here locks
// except the few calls other threads make (flush_failure, wait_until_...).
#include <asio.hpp>

#include <array>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "auth.h"
#include "coordination.h"

namespace dew::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using asio::ip::tcp;

std::string join_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (int rank : ranks) out += (out.empty() ? "" : ",") + std::to_string(rank);
  return out;
}

// How long a connection may take to prove it knows the secret.
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);

}  // namespace

struct CoordinationService::Impl {
  struct Session;
  using SessionPtr = std::shared_ptr<Session>;

  struct Session : std::enable_shared_from_this<Session> {
    explicit Session(tcp::socket s) : socket(std::move(s)) {}
    tcp::socket socket;
    std::string peer;          // "127.0.0.1:40112", for log lines
    std::string nonce;         // our challenge
    int rank = -1;             // -1 until authenticated
    bool bye = false;
    bool closed = false;
    Clock::time_point opened = Clock::now();
    Clock::time_point last_heard = Clock::now();
    std::string in;
    std::array<char, 65536> chunk{};
    std::deque<std::string> out;
  };

  struct Waiter {
    SessionPtr session;
    std::string request;
    std::shared_ptr<asio::steady_timer> timer;
  };

  struct Agreement {
    std::set<int> arrived;
    std::vector<Waiter> waiters;
  };

  struct Gathering {
    std::map<int, std::string> parts;
    std::vector<Waiter> waiters;
  };

  explicit Impl(ServiceConfig c) : config(std::move(c)), acceptor(io), heartbeat(io), clients(config.size) {}

  ServiceConfig config;
  asio::io_context io;
  tcp::acceptor acceptor;
  asio::steady_timer heartbeat;
  std::thread thread;
  std::uint16_t port = 0;

  std::vector<SessionPtr> clients;      // by rank, authenticated only
  std::set<SessionPtr> pending;          // not yet authenticated
  std::map<std::string, std::string> kv;
  std::multimap<std::string, Waiter> gets;
  std::map<std::string, Agreement> agreements;
  std::map<std::string, Gathering> gatherings;
  std::optional<PeerFailure> failure;

  // Shared with other threads.
  std::mutex mutex;
  std::condition_variable changed;
  std::set<int> gone;           // ranks that left (bye) or were lost
  bool failure_flushed = false;

  void log(const std::string& line) {
    if (config.log) config.log(line);
  }

  Result<std::uint16_t> listen(std::uint16_t wanted) {
    std::error_code ec;
    // Dual-stack where the host has IPv6, IPv4 otherwise.
    tcp::endpoint endpoint(tcp::v6(), wanted);
    acceptor.open(endpoint.protocol(), ec);
    if (!ec) acceptor.set_option(asio::ip::v6_only(false), ec);
    if (ec) {
      acceptor.close();
      endpoint = tcp::endpoint(tcp::v4(), wanted);
      acceptor.open(endpoint.protocol(), ec);
    }
    if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return unavailable("the coordination service cannot listen on port " + std::to_string(wanted) + ": " + ec.message());
    }
    return acceptor.local_endpoint().port();
  }

  void accept() {
    acceptor.async_accept([this](std::error_code ec, tcp::socket socket) {
      if (ec) {
        if (ec != asio::error::operation_aborted) accept();
        return;
      }
      auto session = std::make_shared<Session>(std::move(socket));
      std::error_code ignored;
      const auto remote = session->socket.remote_endpoint(ignored);
      auto address = remote.address();
      if (address.is_v6() && address.to_v6().is_v4_mapped()) {
        address = asio::ip::make_address_v4(asio::ip::v4_mapped, address.to_v6());
      }
      session->peer = address.to_string() + ":" + std::to_string(remote.port());
      session->socket.set_option(tcp::no_delay(true), ignored);
      session->nonce = auth::random_nonce();
      pending.insert(session);
      send(session, wire::Frame{wire::Type::kChallenge, {session->nonce}});
      read(session);
      accept();
    });
  }

  void send(const SessionPtr& session, const wire::Frame& frame) {
    if (session->closed) return;
    const bool idle = session->out.empty();
    session->out.push_back(wire::encode(frame));
    if (idle) write(session);
  }

  void write(const SessionPtr& session) {
    asio::async_write(session->socket, asio::buffer(session->out.front()),
                      [this, session](std::error_code ec, std::size_t) {
                        if (ec) {
                          close(session, "");
                          return;
                        }
                        session->out.pop_front();
                        if (!session->out.empty()) {
                          write(session);
                        } else {
                          note_flushed();
                        }
                      });
  }

  // A failure counts as flushed once no connection has anything left to send.
  void note_flushed() {
    if (!failure) return;
    for (const auto& client : clients) {
      if (client && !client->closed && !client->out.empty()) return;
    }
    std::lock_guard lock(mutex);
    failure_flushed = true;
    changed.notify_all();
  }

  void read(const SessionPtr& session) {
    session->socket.async_read_some(asio::buffer(session->chunk), [this, session](std::error_code ec, std::size_t n) {
      if (ec) {
        close(session, "");
        return;
      }
      session->last_heard = Clock::now();
      session->in.append(session->chunk.data(), n);
      while (!session->closed) {
        const std::size_t limit = session->rank < 0 ? wire::kMaxHandshakeFrameBytes : wire::kMaxFrameBytes;
        auto decoded = wire::decode(session->in, limit);
        if (decoded.status == wire::DecodeStatus::kNeedMore) break;
        if (decoded.status == wire::DecodeStatus::kBad) {
          close(session, "closed a connection from " + session->peer + describe(session) + ": " + decoded.error);
          return;
        }
        session->in.erase(0, decoded.consumed);
        handle(session, decoded.frame);
      }
      if (!session->closed) read(session);
    });
  }

  static std::string describe(const SessionPtr& session) {
    return session->rank < 0 ? " (not authenticated)" : " (process " + std::to_string(session->rank) + ")";
  }

  void refuse(const SessionPtr& session, const std::string& reason) {
    log("refused a connection from " + session->peer + ": " + reason);
    send(session, wire::Frame{wire::Type::kRefused, {reason}});
    // Let the refusal go out, then close.
    auto timer = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(100));
    session->rank = -2;
    timer->async_wait([this, session, timer](std::error_code) { close(session, ""); });
  }

  void handle(const SessionPtr& session, const wire::Frame& frame) {
    if (session->rank == -2) return;  // refused, closing
    if (session->rank < 0) {
      handle_hello(session, frame);
      return;
    }
    switch (frame.type) {
      case wire::Type::kHeartbeat: return;
      case wire::Type::kBye: {
        session->bye = true;
        return;
      }
      case wire::Type::kPut: {
        kv[frame.items[0]] = frame.items[1];
        auto range = gets.equal_range(frame.items[0]);
        for (auto it = range.first; it != range.second; ++it) {
          it->second.timer->cancel();
          send(it->second.session, wire::Frame{wire::Type::kValue, {it->second.request, frame.items[1]}});
        }
        gets.erase(range.first, range.second);
        return;
      }
      case wire::Type::kGet: return handle_get(session, frame);
      case wire::Type::kAgree: return handle_agree(session, frame);
      case wire::Type::kGather: return handle_gather(session, frame);
      case wire::Type::kFail: {
        publish(PeerFailure{session->rank, frame.items[1]});
        return;
      }
      default:
        close(session, "closed the connection of process " + std::to_string(session->rank) + ": unexpected " +
                           std::string(wire::type_name(frame.type)) + " frame");
    }
  }

  void handle_hello(const SessionPtr& session, const wire::Frame& frame) {
    if (frame.type != wire::Type::kHello) {
      refuse(session, "sent a " + std::string(wire::type_name(frame.type)) + " frame before proving it knows the pool secret");
      return;
    }
    const auto rank = wire::decode_u64(frame.items[0]);
    const auto size = wire::decode_u64(frame.items[1]);
    if (!rank || !size) {
      refuse(session, "malformed hello");
      return;
    }
    if (!auth::same_mac(frame.items[3], auth::hello_mac(config.secret, session->nonce, *rank, *size))) {
      refuse(session, "wrong MAC: the client does not know this pool's DEW_POOL_SECRET");
      return;
    }
    if (*size != static_cast<std::uint64_t>(config.size) || *rank >= *size) {
      refuse(session, "process " + std::to_string(*rank) + " of " + std::to_string(*size) + " does not belong to this pool of " +
                          std::to_string(config.size));
      return;
    }
    const int r = static_cast<int>(*rank);
    if (clients[static_cast<std::size_t>(r)] && !clients[static_cast<std::size_t>(r)]->closed) {
      refuse(session, "process " + std::to_string(r) + " is already connected");
      return;
    }
    pending.erase(session);
    session->rank = r;
    clients[static_cast<std::size_t>(r)] = session;
    send(session, wire::Frame{wire::Type::kWelcome, {auth::welcome_mac(config.secret, frame.items[2])}});
    if (failure) send(session, wire::Frame{wire::Type::kFailure, {wire::encode_u64(static_cast<std::uint64_t>(failure->rank)), failure->message}});
  }

  std::shared_ptr<asio::steady_timer> timer_for(std::string_view patience_item) {
    const auto ms = wire::decode_u64(patience_item).value_or(0);
    auto timer = std::make_shared<asio::steady_timer>(io);
    // Patience is bounded by what a steady_clock can add (a day is typical).
    timer->expires_after(std::chrono::milliseconds(std::min<std::uint64_t>(ms, 1ULL << 40)));
    return timer;
  }

  void handle_get(const SessionPtr& session, const wire::Frame& frame) {
    const std::string& key = frame.items[1];
    if (auto found = kv.find(key); found != kv.end()) {
      send(session, wire::Frame{wire::Type::kValue, {frame.items[0], found->second}});
      return;
    }
    auto timer = timer_for(frame.items[2]);
    auto it = gets.emplace(key, Waiter{session, frame.items[0], timer});
    timer->async_wait([this, it](std::error_code ec) {
      if (ec) return;  // answered
      send(it->second.session, wire::Frame{wire::Type::kNotFound, {it->second.request}});
      gets.erase(it);
    });
  }

  std::vector<int> missing_from(const std::set<int>& arrived) const {
    std::vector<int> missing;
    for (int rank = 0; rank < config.size; ++rank) {
      if (!arrived.count(rank)) missing.push_back(rank);
    }
    return missing;
  }

  void handle_agree(const SessionPtr& session, const wire::Frame& frame) {
    const std::string name = frame.items[1];
    Agreement& agreement = agreements[name];
    agreement.arrived.insert(session->rank);
    if (static_cast<int>(agreement.arrived.size()) == config.size) {
      for (auto& waiter : agreement.waiters) {
        waiter.timer->cancel();
        send(waiter.session, wire::Frame{wire::Type::kAgreed, {waiter.request}});
      }
      send(session, wire::Frame{wire::Type::kAgreed, {frame.items[0]}});
      agreements.erase(name);
      return;
    }
    auto timer = timer_for(frame.items[2]);
    agreement.waiters.push_back(Waiter{session, frame.items[0], timer});
    timer->async_wait([this, name, session, request = frame.items[0]](std::error_code ec) {
      if (ec) return;
      auto found = agreements.find(name);
      if (found == agreements.end()) return;
      send(session, wire::Frame{wire::Type::kAgreeTimeout, {request, join_ranks(missing_from(found->second.arrived))}});
      auto& waiters = found->second.waiters;
      std::erase_if(waiters, [&](const Waiter& w) { return w.session == session && w.request == request; });
    });
  }

  void handle_gather(const SessionPtr& session, const wire::Frame& frame) {
    const std::string round = frame.items[1];
    Gathering& gathering = gatherings[round];
    gathering.parts[session->rank] = frame.items[2];
    auto timer = timer_for(frame.items[3]);
    gathering.waiters.push_back(Waiter{session, frame.items[0], timer});
    if (static_cast<int>(gathering.parts.size()) == config.size) {
      for (auto& waiter : gathering.waiters) {
        waiter.timer->cancel();
        wire::Frame reply{wire::Type::kGathered, {waiter.request}};
        for (auto& [rank, part] : gathering.parts) reply.items.push_back(part);
        send(waiter.session, reply);
      }
      gatherings.erase(round);
      return;
    }
    timer->async_wait([this, round, session, request = frame.items[0]](std::error_code ec) {
      if (ec) return;
      auto found = gatherings.find(round);
      if (found == gatherings.end()) return;
      std::set<int> arrived;
      for (auto& [rank, part] : found->second.parts) arrived.insert(rank);
      send(session, wire::Frame{wire::Type::kAgreeTimeout, {request, join_ranks(missing_from(arrived))}});
      std::erase_if(found->second.waiters, [&](const Waiter& w) { return w.session == session && w.request == request; });
    });
  }

  // The first failure wins; it goes to every connected process, and to any
  // that connects later.
  void publish(PeerFailure failed) {
    if (failure) return;
    failure = failed;
    const wire::Frame push{wire::Type::kFailure, {wire::encode_u64(static_cast<std::uint64_t>(failed.rank)), failed.message}};
    for (const auto& client : clients) {
      if (client && !client->closed) send(client, push);
    }
    note_flushed();
  }

  void close(const SessionPtr& session, const std::string& why) {
    if (session->closed) return;
    session->closed = true;
    if (!why.empty()) log(why);
    std::error_code ignored;
    session->socket.shutdown(tcp::socket::shutdown_both, ignored);
    session->socket.close(ignored);
    pending.erase(session);
    if (session->rank < 0) return;
    const int rank = session->rank;
    if (clients[static_cast<std::size_t>(rank)] == session) {
      if (!session->bye) {
        publish(PeerFailure{rank, "process " + std::to_string(rank) +
                                      " lost its connection to the coordination service without leaving the pool"
                                      " (it exited or was killed)"});
      }
      std::lock_guard lock(mutex);
      gone.insert(rank);
      changed.notify_all();
    }
    note_flushed();
  }

  // Heartbeats both ways: every quarter of the timeout the service sends one
  // to each process and drops those it has not heard from for the timeout.
  void beat() {
    const auto interval = std::max(config.heartbeat_timeout / 4, std::chrono::milliseconds(20));
    heartbeat.expires_after(interval);
    heartbeat.async_wait([this](std::error_code ec) {
      if (ec) return;
      const auto now = Clock::now();
      for (const auto& client : clients) {
        if (!client || client->closed || client->bye) continue;
        if (now - client->last_heard > config.heartbeat_timeout) {
          const auto seconds = std::chrono::duration<double>(config.heartbeat_timeout).count();
          char text[32];
          std::snprintf(text, sizeof text, "%g", seconds);
          publish(PeerFailure{client->rank, "process " + std::to_string(client->rank) +
                                                " stopped answering: no heartbeat for " + text + " s"});
          close(client, "");
          continue;
        }
        send(client, wire::Frame{wire::Type::kHeartbeat, {}});
      }
      for (auto it = pending.begin(); it != pending.end();) {
        auto session = *it++;
        if (now - session->opened > kHandshakeTimeout) {
          close(session, "closed a connection from " + session->peer + ": no hello within 10 s");
        }
      }
      beat();
    });
  }
};

CoordinationService::CoordinationService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<CoordinationService>> CoordinationService::start(ServiceConfig config) {
  if (!auth::ready()) return system_error("libsodium could not start (no entropy source)");
  auto impl = std::make_unique<Impl>(std::move(config));
  auto port = impl->listen(impl->config.port);
  if (!port.ok()) return port.error();
  impl->port = port.value();
  impl->accept();
  impl->beat();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->io.run(); });
  return std::unique_ptr<CoordinationService>(new CoordinationService(std::move(impl)));
}

CoordinationService::~CoordinationService() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::uint16_t CoordinationService::port() const { return impl_->port; }

void CoordinationService::flush_failure(std::chrono::milliseconds bound) {
  std::unique_lock lock(impl_->mutex);
  impl_->changed.wait_for(lock, bound, [&] { return impl_->failure_flushed; });
}

void CoordinationService::wait_until_others_left(const std::function<void(const std::vector<int>&)>& waiting) {
  std::unique_lock lock(impl_->mutex);
  for (;;) {
    std::vector<int> still;
    for (int rank = 1; rank < impl_->config.size; ++rank) {
      if (!impl_->gone.count(rank)) still.push_back(rank);
    }
    if (still.empty()) return;
    if (impl_->changed.wait_for(lock, std::chrono::seconds(10)) == std::cv_status::timeout) {
      lock.unlock();
      waiting(still);
      lock.lock();
    }
  }
}

}  // namespace dew::runtime
