// The coordination service's connections: accepting (backing off when file
// descriptors run out), reading and writing frames, the handshake, and
// heartbeats both ways. Requests are in service_requests.cpp.
#include <malloc.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "auth.h"
#include "dew/failure_timings.h"
#include "service_impl.h"
#include "silence_verdict.h"

namespace dew::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using asio::ip::tcp;

// Accept errors that go away once connections close: wait rather than spin.
// (Asio's system errors are in its own category: compare the errno values.)
bool out_of_resources(std::error_code ec) {
  if (ec.category() != asio::error::get_system_category()) return false;
  const int value = ec.value();
  return value == EMFILE || value == ENFILE || value == ENOBUFS || value == ENOMEM;
}

std::string peer_of(const tcp::socket& socket) {
  std::error_code ignored;
  const auto remote = socket.remote_endpoint(ignored);
  auto address = remote.address();
  if (address.is_v6() && address.to_v6().is_v4_mapped()) {
    address = asio::ip::make_address_v4(asio::ip::v4_mapped, address.to_v6());
  }
  return address.to_string() + ":" + std::to_string(remote.port());
}

}  // namespace

Result<std::uint16_t> CoordinationService::Impl::listen(std::uint16_t wanted) {
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
    return unavailable("the coordination service cannot listen on port " + std::to_string(wanted) + ": " +
                       ec.message());
  }
  return acceptor.local_endpoint().port();
}

void CoordinationService::Impl::accept() {
  acceptor.async_accept([this](std::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      accept_failed(ec);
      return;
    }
    accept_failures = 0;
    accepted(std::move(socket));
    accept();
  });
}

// With no file descriptor left, the listening socket stays readable and every
// accept fails at once: pause (10 ms, doubling to 1 s) until connections close.
void CoordinationService::Impl::accept_failed(std::error_code ec) {
  if (!out_of_resources(ec)) {
    accept();
    return;
  }
  const auto pause =
      std::min(std::chrono::milliseconds(10) * (1 << std::min(accept_failures, 7)), std::chrono::milliseconds(1000));
  ++accept_failures;
  note_stranger("cannot accept connections: " + ec.message() + " (" + std::to_string(pending.size()) +
                " unauthenticated connections open); trying again in " + std::to_string(pause.count()) + " ms");
  accept_pause.expires_after(pause);
  accept_pause.async_wait([this](std::error_code wait_ec) {
    if (!wait_ec) accept();
  });
}

void CoordinationService::Impl::accepted(tcp::socket socket) {
  if (!room_for_stranger()) {
    // Said without queueing: the socket is closed before this returns.
    const std::string busy = wire::encode(
        wire::Frame{wire::Type::kBusy, {std::to_string(pending.size()) + " unauthenticated connections are waiting"}});
    std::error_code ignored;
    socket.non_blocking(true, ignored);
    socket.send(asio::buffer(busy), 0, ignored);
    note_stranger("told a connection from " + peer_of(socket) + " to come back: " + std::to_string(pending.size()) +
                  " unauthenticated connections are open, none older than " + std::to_string(kStrangerGrace.count()) +
                  " ms");
    socket.close(ignored);
    return;
  }
  auto session = std::make_shared<Session>(std::move(socket));
  session->peer = peer_of(session->socket);
  std::error_code ignored;
  session->socket.set_option(tcp::no_delay(true), ignored);
  session->nonce = auth::random_nonce();
  pending.insert(session);
  wire::Frame challenge{wire::Type::kChallenge, {session->nonce}};
  if (config.credential) {
    auto credential = config.credential();
    if (!credential.ok()) {
      note_stranger("cannot seal the secret for " + session->peer + ": " + credential.error().message);
    } else {
      challenge.items.push_back(credential.value());
    }
  }
  send(session, challenge);
  read(session);
}

CoordinationService::Impl::Chunk CoordinationService::Impl::chunk_of(std::string bytes) {
  auto part = std::make_shared<Part>();
  part->length = bytes.size();
  part->storage = std::move(bytes);
  return part;
}

// Frames are tagged once the session's keys are set (after the welcome).
void CoordinationService::Impl::send(const SessionPtr& session, const wire::Frame& frame) {
  if (session->closed) return;
  std::string bytes = wire::encode(frame);
  if (!session->keys.to_client.empty()) {
    const auto tag = auth::frame_tag(session->keys.to_client, session->sent_frames++, bytes);
    bytes.append(reinterpret_cast<const char*>(tag.data()), tag.size());
  }
  queue(session, chunk_of(std::move(bytes)));
}

void CoordinationService::Impl::send_shared(const SessionPtr& session, std::string head, const std::vector<Chunk>& tail,
                                            const auth::TailHash& tail_hash) {
  if (session->closed) return;
  const auto tag = auth::frame_tag(session->keys.to_client, session->sent_frames++, head, tail_hash);
  queue(session, chunk_of(std::move(head)));
  for (const auto& chunk : tail) queue(session, chunk);
  queue(session, chunk_of(std::string(reinterpret_cast<const char*>(tag.data()), tag.size())));
}

void CoordinationService::Impl::queue(const SessionPtr& session, Chunk chunk) {
  session->out.push_back(std::move(chunk));
  if (session->in_flight == 0) write(session);
}

// Writes up to kChunksPerWrite chunks, or kBytesPerWrite (at least one
// chunk), in one gathered write, then drops them: small frames go out
// together, and a large part is let go as soon as it is out, not with the
// whole reply.
void CoordinationService::Impl::write(const SessionPtr& session) {
  std::vector<asio::const_buffer> buffers;
  std::size_t bytes_taken = 0;
  for (std::size_t i = 0; i < session->out.size() && i < kChunksPerWrite; ++i) {
    const std::string_view bytes = session->out[i]->bytes();
    if (i > 0 && bytes_taken + bytes.size() > kBytesPerWrite) break;
    buffers.emplace_back(bytes.data(), bytes.size());
    bytes_taken += bytes.size();
  }
  session->in_flight = buffers.size();
  asio::async_write(session->socket, buffers, [this, session](std::error_code ec, std::size_t) {
    // A session closed meanwhile has dropped its queue (close() frees it).
    if (ec || session->closed) {
      close(session, "");
      return;
    }
    session->out.erase(session->out.begin(), session->out.begin() + static_cast<std::ptrdiff_t>(session->in_flight));
    session->in_flight = 0;
    if (!session->out.empty()) {
      write(session);
    } else {
      note_flushed();
    }
  });
}

// A failure counts as flushed once no connection has anything left to send.
void CoordinationService::Impl::note_flushed() {
  if (!failure) return;
  for (const auto& client : clients) {
    if (client && !client->closed && !client->out.empty()) return;
  }
  std::lock_guard lock(mutex);
  failure_flushed = true;
  changed.notify_all();
}

void CoordinationService::Impl::read(const SessionPtr& session) {
  session->socket.async_read_some(asio::buffer(session->chunk), [this, session](std::error_code ec, std::size_t n) {
    if (ec) {
      close(session, "");
      return;
    }
    const auto now = Clock::now();
    if (session->rank >= 0) note_gap(*session, now);
    session->last_heard = now;
    session->in.append(session->chunk.data(), n);
    if (take_frames(session)) read(session);
  });
}

// Handles every whole frame in the session's buffer; false once the session
// is closed. A large frame's buffer is sized once from its header and freed
// after it, so a gather's parts are not held twice. An authenticated
// session's frames are each followed by a tag (auth.h), checked first.
bool CoordinationService::Impl::take_frames(const SessionPtr& session) {
  while (!session->closed) {
    const bool authenticated = session->rank >= 0;
    const std::size_t limit = authenticated ? wire::kMaxFrameBytes : wire::kMaxHandshakeFrameBytes;
    const std::size_t tag = authenticated ? auth::kTagBytes : 0;
    const auto decoded = wire::decode_views(session->in, limit);
    if (decoded.status == wire::DecodeStatus::kNeedMore ||
        (decoded.status == wire::DecodeStatus::kFrame && session->in.size() < decoded.consumed + tag)) {
      if (auto size = wire::announced_size(session->in); size && *size <= limit + wire::kHeaderBytes) {
        session->in.reserve(*size + tag);
      }
      break;
    }
    if (decoded.status == wire::DecodeStatus::kBad) {
      if (authenticated) {
        publish(PeerFailure{session->rank, "process " + std::to_string(session->rank) +
                                               " sent the coordination service a frame it refused: " + decoded.error});
        close(session, "closed the connection of process " + std::to_string(session->rank) + ": " + decoded.error);
      } else {
        note_stranger("closed a connection from " + session->peer + " (not authenticated): " + decoded.error);
        close(session, "");
      }
      return false;
    }
    if (authenticated && !tag_holds(session, decoded.consumed, decoded.type)) return false;
    if (authenticated && decoded.type == wire::Type::kGather) {
      take_gather(session, decoded);
      continue;
    }
    wire::Frame frame{decoded.type, std::vector<std::string>(decoded.items.begin(), decoded.items.end())};
    session->in.erase(0, decoded.consumed + tag);
    if (session->in.empty() && session->in.capacity() > session->chunk.size()) std::string().swap(session->in);
    if (session->rank == -2) continue;  // refused, closing
    if (!authenticated) {
      handle_hello(session, frame);
    } else {
      handle(session, frame);
    }
  }
  return !session->closed;
}

// A frame whose tag does not hold was altered on the way (or forged): the
// pool cannot trust that connection, and ends naming it.
bool CoordinationService::Impl::tag_holds(const SessionPtr& session, std::size_t bytes, wire::Type type) {
  const std::string_view frame = std::string_view(session->in).substr(0, bytes);
  const auto expected = auth::frame_tag(session->keys.to_service, session->received_frames++, frame);
  if (auth::same_tag(expected, std::string_view(session->in).substr(bytes, auth::kTagBytes))) return true;
  publish(PeerFailure{session->rank,
                      auth::altered_connection(session->rank, "its " + std::string(wire::type_name(type)) + " frame " +
                                                                  std::to_string(session->received_frames - 1) +
                                                                  " failed its integrity check")});
  close(session,
        "closed the connection of process " + std::to_string(session->rank) + ": a frame failed its integrity check");
  return false;
}

// A gather's part stays in the buffer it arrived in when the frame (and its
// tag) is all the buffer holds (a large part arrives so); a small one is
// copied out.
void CoordinationService::Impl::take_gather(const SessionPtr& session, const wire::DecodedViews& decoded) {
  const std::string request(decoded.items[0]);
  const std::string round(decoded.items[1]);
  const std::string patience(decoded.items[3]);
  Part part;
  if (decoded.consumed + auth::kTagBytes == session->in.size() && decoded.items[2].size() > session->chunk.size()) {
    part.offset = static_cast<std::size_t>(decoded.items[2].data() - session->in.data());
    part.length = decoded.items[2].size();
    part.storage = std::exchange(session->in, std::string());
  } else {
    part.storage = std::string(decoded.items[2]);
    part.length = part.storage.size();
    session->in.erase(0, decoded.consumed + auth::kTagBytes);
  }
  handle_gather(session, request, round, patience, std::move(part));
}

void CoordinationService::Impl::refuse(const SessionPtr& session, const std::string& reason) {
  note_stranger("refused a connection from " + session->peer + ": " + reason);
  send(session, wire::Frame{wire::Type::kRefused, {reason}});
  // Let the refusal go out, then close.
  auto timer = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(100));
  session->rank = -2;
  timer->async_wait([this, session, timer](std::error_code) { close(session, ""); });
}

void CoordinationService::Impl::handle_hello(const SessionPtr& session, const wire::Frame& frame) {
  if (frame.type != wire::Type::kHello) {
    refuse(session,
           "sent a " + std::string(wire::type_name(frame.type)) + " frame before proving it knows the pool secret");
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
    refuse(session, "process " + std::to_string(*rank) + " of " + std::to_string(*size) +
                        " does not belong to this pool of " + std::to_string(config.size));
    return;
  }
  const int r = static_cast<int>(*rank);
  auto& slot = clients[static_cast<std::size_t>(r)];
  if (slot && !slot->closed) {
    refuse(session, "process " + std::to_string(r) + " is already connected");
    return;
  }
  pending.erase(session);
  session->rank = r;
  session->chunk.resize(kReadBytes);
  slot = session;
  {
    std::lock_guard lock(mutex);
    connected.insert(r);
  }
  send(session, wire::Frame{wire::Type::kWelcome, {auth::welcome_mac(config.secret, frame.items[2])}});
  // Every frame after the welcome, both ways, carries a tag.
  session->keys = auth::frame_keys(config.secret, session->nonce, frame.items[2], *rank);
  if (failure) {
    send(session, wire::failure_frame(wire::Type::kFailure, static_cast<std::uint64_t>(failure->rank), failure->message,
                                      failure->stopped));
  }
}

void CoordinationService::Impl::close(const SessionPtr& session, const std::string& why) {
  if (session->closed) return;
  session->closed = true;
  if (!why.empty()) log(why);
  std::error_code ignored;
  session->socket.shutdown(tcp::socket::shutdown_both, ignored);
  session->socket.close(ignored);
  session->out.clear();  // a gather's shared parts are not held for a dead connection
  if (pending.erase(session) && ++strangers_closed >= 256 && pending.empty()) {
    // After a flood, give the freed sessions' memory back to the system
    // (glibc keeps freed heap otherwise; 10,000 strangers once held 660 MB).
    strangers_closed = 0;
    ::malloc_trim(0);
  }
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
    connected.erase(rank);
    changed.notify_all();
  }
  note_flushed();
}

// Heartbeats both ways: every quarter of the timeout the service sends one
// to each process and drops those it has not heard from for the timeout.
void CoordinationService::Impl::beat() {
  const auto interval = std::max(config.heartbeat_timeout / 4, std::chrono::milliseconds(20));
  heartbeat.expires_after(interval);
  heartbeat.async_wait([this, interval](std::error_code ec) {
    if (ec) return;
    const auto now = Clock::now();
    const auto since_last_look = now - last_beat;
    if (since_last_look > 2 * interval) paused_at = now;
    last_beat = now;
    for (const auto& client : clients) {
      if (!client || client->closed || client->bye) continue;
      std::error_code unread_error;
      const std::size_t unread = client->socket.available(unread_error);
      if (lost_for_silence(SilenceFacts{now - client->last_heard, since_last_look, interval, config.heartbeat_timeout,
                                        unread_error ? 0 : unread})) {
        char text[32];
        std::snprintf(text, sizeof text, "%g", std::chrono::duration<double>(config.heartbeat_timeout).count());
        publish(PeerFailure{client->rank, "process " + std::to_string(client->rank) +
                                              " stopped answering: no heartbeat for " + text + " s"});
        close(client, "");
        continue;
      }
      send(client, wire::Frame{wire::Type::kHeartbeat, {}});
    }
    for (auto it = pending.begin(); it != pending.end();) {
      auto session = *it++;
      if (now - session->opened > timings::kHandshakeTimeout) {
        note_stranger("closed a connection from " + session->peer + ": no hello within 10 s");
        close(session, "");
      }
    }
    flush_stranger_notices();
    beat();
  });
}

CoordinationService::CoordinationService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<CoordinationService>> CoordinationService::start(ServiceConfig config) {
  if (!auth::ready()) return system_error("libsodium could not start (no entropy source)");
  auto impl = std::make_unique<Impl>(std::move(config));
  auto port = impl->listen(impl->config.port);
  if (!port.ok()) return port.error();
  impl->port = port.value();
  impl->accept();
  impl->beat();
  impl->watch_slow_rounds();
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

std::vector<int> CoordinationService::unconnected_ranks() const {
  std::lock_guard lock(impl_->mutex);
  std::vector<int> ranks;
  for (int rank = 0; rank < impl_->config.size; ++rank) {
    if (!impl_->connected.count(rank)) ranks.push_back(rank);
  }
  return ranks;
}

void CoordinationService::wait_until_others_left(const std::function<void(const std::vector<int>&)>& waiting) {
  // Process 0 is leaving: rounds that wait for it fail now (the others end,
  // and leave) instead of waiting for it while it waits for them.
  asio::post(impl_->io, [impl = impl_.get()] { impl->leaves(0); });
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
