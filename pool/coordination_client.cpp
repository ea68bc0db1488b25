// A process's connection to the coordination service: the caller's thread
// sends requests and waits on a condition variable; a reader thread decodes
// replies and pushed failures; a heartbeat thread keeps the service (and
// itself) sure the other side is alive.
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <asio.hpp>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "auth.h"
#include "coordination.h"
#include "coordination_connect.h"
#include "dew/log.h"
#include "dew/text.h"
#include "frame_reader.h"
#include "silence_verdict.h"

namespace dew::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using asio::ip::tcp;

std::vector<int> parse_ranks(std::string_view text) {
  std::vector<int> ranks;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t comma = text.find(',', at);
    if (comma == std::string::npos) comma = text.size();
    ranks.push_back(std::atoi(std::string(text.substr(at, comma - at)).c_str()));
    at = comma + 1;
  }
  return ranks;
}

}  // namespace

struct CoordinationClient::Impl {
  ClientConfig config;
  asio::io_context io;
  tcp::socket socket{io};
  int fd = -1;

  // One writer at a time; a signal handler that finds it taken writes nothing.
  std::atomic_flag writing = ATOMIC_FLAG_INIT;
  auth::FrameKeys keys;             // this connection's, from the handshake
  std::uint64_t send_sequence = 0;  // the writer's (under `writing`)

  std::mutex mutex;
  std::condition_variable changed;
  // The heartbeat thread's own: a reply must not wake it (it would, on
  // `changed`, for every reply: a third wake-up each round trip).
  std::condition_variable stopping;
  std::map<std::uint64_t, wire::ReceivedFrame> replies;
  std::uint64_t next_request = 1;
  std::optional<PeerFailure> failure;
  bool failure_reported = false;
  bool leaving = false;
  bool service_closed = false;  // the reader saw the end of the stream
  Clock::time_point last_heard = Clock::now();
  Clock::time_point said_slow{};               // when the service was last named as slow
  Clock::time_point last_tick = Clock::now();  // the heartbeat thread's last wake
  Clock::time_point paused_at{};               // when it last found it woke late

  // The frames from the service, read by whichever thread holds read_mutex:
  // a caller waiting for its reply, else the reader thread.
  std::mutex read_mutex;
  std::unique_ptr<FrameReader> frames;
  int callers_waiting = 0;              // under `mutex`
  std::condition_variable reader_wait;  // the reader thread's own
  static constexpr std::chrono::milliseconds kReaderLook{200};
  static constexpr std::chrono::milliseconds kCallerLook{250};
  static constexpr std::chrono::milliseconds kWriteLook{250};  // a blocked write's look at the time
  std::thread reader;
  std::thread heartbeat;
  std::string signal_frames[8];

  void write_frame(const wire::Frame& frame) { write_bytes(wire::encode(frame)); }

  void write_bytes(const std::string& bytes) {
    // Another writer may wait up to the heartbeat timeout on a frozen
    // service: wait for it without spinning a core.
    for (int spins = 0; writing.test_and_set(std::memory_order_acquire); ++spins) {
      if (spins < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    const bool sent = send_tagged(bytes);
    writing.clear(std::memory_order_release);
    if (!sent)
      lose_service("took nothing of this process's frames for " + timeout_text() + " (frozen, or its link cut)");
  }

  // A heartbeat is skipped while another frame is being written: that frame
  // is traffic too, and waiting for it would hold the silence check.
  void write_heartbeat() {
    if (writing.test_and_set(std::memory_order_acquire)) return;
    const bool sent = send_tagged(wire::encode(wire::Frame{wire::Type::kHeartbeat, {}}));
    writing.clear(std::memory_order_release);
    if (!sent)
      lose_service("took nothing of this process's frames for " + timeout_text() + " (frozen, or its link cut)");
  }

  std::string timeout_text() const {
    char text[32];
    std::snprintf(text, sizeof text, "%g s", std::chrono::duration<double>(config.heartbeat_timeout).count());
    return text;
  }

  // The service is gone for this process: the pool's failure, and the
  // connection shut both ways, so a caller blocked in the middle of reading
  // a reply (or a writer in the middle of a frame) returns at once instead
  // of at the failure grace.
  void lose_service(const std::string& why) {
    record_failure(PeerFailure{0, "the coordination service on process 0 " + why});
    ::shutdown(fd, SHUT_RDWR);
  }

  // Sends a frame and its tag; the caller holds `writing` (the sequence
  // number is the writer's). False when the service took none of it for
  // the heartbeat timeout (its buffers full: frozen, or the link cut).
  // Allocates nothing: the signal path uses it.
  bool send_tagged(std::string_view bytes) noexcept {
    const auto tag = auth::frame_tag(keys.to_service, send_sequence++, bytes);
    iovec parts[2] = {{const_cast<char*>(bytes.data()), bytes.size()},
                      {const_cast<unsigned char*>(tag.data()), tag.size()}};
    msghdr message{};
    message.msg_iov = parts;
    message.msg_iovlen = 2;
    // Only looks that found the socket still full count: this process's own
    // pause (SIGSTOP) is not the service's silence.
    std::chrono::milliseconds stalled{0};
    while (message.msg_iovlen > 0) {
      const ssize_t n = ::sendmsg(fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (stalled >= config.heartbeat_timeout) return false;
        pollfd writable{fd, POLLOUT, 0};
        if (::poll(&writable, 1, static_cast<int>(kWriteLook.count())) == 0) stalled += kWriteLook;
        continue;
      }
      if (n <= 0) {
        if (n < 0 && errno == EINTR) continue;
        return true;  // the reader notices the closed connection
      }
      stalled = std::chrono::milliseconds(0);
      auto sent = static_cast<std::size_t>(n);
      while (message.msg_iovlen > 0 && sent >= message.msg_iov->iov_len) {
        sent -= message.msg_iov->iov_len;
        ++message.msg_iov;
        --message.msg_iovlen;
      }
      if (message.msg_iovlen > 0) {
        message.msg_iov->iov_base = static_cast<char*>(message.msg_iov->iov_base) + sent;
        message.msg_iov->iov_len -= sent;
      }
    }
    return true;
  }

  void record_failure(PeerFailure failed) {
    {
      std::lock_guard lock(mutex);
      if (failure || leaving) return;
      failure = failed;
      changed.notify_all();
    }
    if (config.on_failure) config.on_failure(failed);
  }

  // Reads one frame and acts on it (a reply, a pushed failure, a
  // heartbeat); false once the stream ended. The caller holds read_mutex.
  bool read_one() {
    std::string error;
    auto frame = frames->next(error);
    if (!frame && frames->altered()) {
      // Said to the pool as this process's own failure, so every process
      // prints the same line naming the altered connection.
      const std::string message = auth::altered_connection(config.rank, error);
      write_frame(wire::failure_frame(wire::Type::kFail, static_cast<std::uint64_t>(config.rank), message, false));
      record_failure(PeerFailure{config.rank, message});
    }
    if (!frame) {
      // The failure first: a caller that sees the stream closed returns it.
      record_failure(PeerFailure{0, "lost the coordination service on process 0 (" + error + ")"});
      {
        std::lock_guard lock(mutex);
        service_closed = true;
      }
      changed.notify_all();
      return false;
    }
    switch (frame->type) {
      case wire::Type::kFailure: {
        // Also one that names this process: another published it (this
        // one was late to an agreement). A process that published its own
        // failure is already ending and ignores the echo.
        const auto rank = wire::decode_u64(frame->items[0]).value_or(0);
        record_failure(
            PeerFailure{static_cast<int>(rank), std::string(frame->items[1]), frame->items[2] == wire::kStoppedKind});
        break;
      }
      case wire::Type::kValue:
      case wire::Type::kNotFound:
      case wire::Type::kAgreed:
      case wire::Type::kAgreeTimeout:
      case wire::Type::kGathered: {
        const auto id = wire::decode_u64(frame->items[0]).value_or(0);
        {
          std::lock_guard lock(mutex);
          replies[id] = std::move(*frame);
        }
        break;
      }
      default:
        break;  // heartbeats; nothing else is sent to a client
    }
    changed.notify_all();  // unlocked: a waiter does not wake into a held mutex
    return true;
  }

  // Waits up to `timeout` for a frame to read (one already buffered counts).
  // The caller holds read_mutex.
  bool readable(std::chrono::milliseconds timeout) {
    if (frames->buffered()) return true;
    pollfd ready{fd, POLLIN, 0};
    const int polled = ::poll(&ready, 1, static_cast<int>(timeout.count()));
    return polled > 0 || (polled < 0 && errno != EINTR);
  }

  // The reader thread reads whatever the service pushes while no caller is
  // waiting for a reply. A caller that is waiting reads for itself (the
  // reply wakes it alone, not this thread and then it: half the wake-ups of
  // a round trip), and this thread stays out of its way, looking again every
  // kReaderLook. Between requests it is in poll(), so a pushed failure is
  // read at once.
  void read_loop() {
    for (;;) {
      {
        std::unique_lock lock(mutex);
        if (leaving || service_closed) return;
        if (callers_waiting > 0) {
          reader_wait.wait_for(lock, kReaderLook, [&] { return leaving || service_closed; });
          continue;
        }
      }
      std::unique_lock reading(read_mutex, std::try_to_lock);
      if (!reading.owns_lock()) {
        std::unique_lock lock(mutex);
        reader_wait.wait_for(lock, kReaderLook, [&] { return leaving || service_closed; });
        continue;
      }
      while (readable(kReaderLook)) {
        if (!read_one()) return;
        std::lock_guard lock(mutex);
        if (callers_waiting > 0 || leaving) break;
      }
    }
  }

  // Bytes from the service: it is alive. After a silence of over half the
  // heartbeat timeout (two heartbeats late), it is named as slow.
  void heard_bytes() {
    const auto now = Clock::now();
    Clock::duration gap{};
    {
      std::lock_guard lock(mutex);
      gap = now - last_heard;
      // This process's own pause (SIGSTOP, a starved machine) is not the
      // service's slowness: its heartbeat thread woke late too.
      const bool paused = paused_at > last_heard ||
                          now - last_tick > 2 * std::max(config.heartbeat_timeout / 4, std::chrono::milliseconds(20));
      last_heard = now;
      if (paused || gap <= config.heartbeat_timeout / 2 || now - said_slow < config.slow_after) return;
      said_slow = now;
    }
    char line[200];
    std::snprintf(line, sizeof line,
                  "the coordination service on process 0 is slow: nothing heard from it for %.1f s (it is counted as "
                  "lost after %.1f s of silence)",
                  std::chrono::duration<double>(gap).count(),
                  std::chrono::duration<double>(config.heartbeat_timeout).count());
    log_warn(line);
  }

  // The service's bytes in the socket that no thread has read yet.
  std::size_t bytes_unread() const {
    int count = 0;
    return ::ioctl(fd, FIONREAD, &count) == 0 && count > 0 ? static_cast<std::size_t>(count) : 0;
  }

  void heartbeat_loop() {
    const auto interval = std::max(config.heartbeat_timeout / 4, std::chrono::milliseconds(20));
    std::unique_lock lock(mutex);
    while (!leaving) {
      if (stopping.wait_for(lock, interval, [&] { return leaving; })) return;
      const auto now = Clock::now();
      const auto since_last_look = now - last_tick;
      if (since_last_look > 2 * interval) paused_at = now;  // this process was stopped or starved
      last_tick = now;
      const bool silent = lost_for_silence(
          SilenceFacts{now - last_heard, since_last_look, interval, config.heartbeat_timeout, bytes_unread()});
      lock.unlock();
      if (silent) {
        lose_service("stopped answering heartbeats");
      } else {
        write_heartbeat();
      }
      lock.lock();
    }
  }

  // Sends a request and waits for its reply, reading it itself when no
  // other thread is reading; an Error once the pool failed, or when
  // `answer_by` passes first.
  Result<wire::ReceivedFrame> request(wire::Type type, std::vector<std::string_view> items,
                                      std::optional<Clock::time_point> answer_by = std::nullopt) {
    std::uint64_t id = 0;
    {
      std::lock_guard lock(mutex);
      id = next_request++;
      ++callers_waiting;
    }
    const std::string id_item = wire::encode_u64(id);
    items.insert(items.begin(), id_item);
    write_bytes(wire::encode(type, items));
    std::unique_lock lock(mutex);
    const auto answered = [&] { return replies.count(id) || failure || service_closed; };
    while (!answered()) {
      const auto now = Clock::now();
      if (answer_by && now >= *answer_by) {
        --callers_waiting;
        return timeout_error("the coordination service at " + host_port(config.host, std::to_string(config.port)) +
                             " did not answer a " + std::string(wire::type_name(type)) + " request in time");
      }
      // A look at most every kCallerLook: the heartbeat thread may have
      // found the service silent, and `answer_by` may pass.
      auto look = kCallerLook;
      if (answer_by) look = std::min(look, std::chrono::ceil<std::chrono::milliseconds>(*answer_by - now));
      lock.unlock();
      {
        std::unique_lock reading(read_mutex, std::try_to_lock);
        if (reading.owns_lock()) {
          if (readable(look)) read_one();
          lock.lock();
          continue;
        }
      }
      lock.lock();
      // Another thread reads (the reader thread, or another caller): its
      // frame may be this reply; read_one() notifies.
      changed.wait_for(lock, std::chrono::milliseconds(5), answered);
    }
    --callers_waiting;
    if (failure) return peer_failed(failure->message);
    if (!replies.count(id)) return peer_failed("lost the coordination service on process 0");
    auto reply = std::move(replies[id]);
    replies.erase(id);
    return reply;
  }
};

CoordinationClient::CoordinationClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<CoordinationClient>> CoordinationClient::connect(ClientConfig config) {
  if (!auth::ready()) return system_error("libsodium could not start (no entropy source)");
  auto impl = std::make_unique<Impl>();
  impl->config = std::move(config);
  auto connection = connect_to_service(impl->io, impl->config);
  if (!connection.ok()) return connection.error();
  impl->socket = std::move(connection.value().socket);
  impl->fd = impl->socket.native_handle();
  impl->keys = std::move(connection.value().keys);
  impl->frames = std::make_unique<FrameReader>(impl->fd, std::size_t{1} << 34, std::move(connection.value().leftover),
                                               impl->keys.to_client);
  Impl* heard = impl.get();
  impl->frames->on_bytes([heard] { heard->heard_bytes(); });

  Impl* raw = impl.get();
  impl->last_heard = Clock::now();
  impl->reader = std::thread([raw] { raw->read_loop(); });
  impl->heartbeat = std::thread([raw] { raw->heartbeat_loop(); });
  return std::unique_ptr<CoordinationClient>(new CoordinationClient(std::move(impl)));
}

CoordinationClient::~CoordinationClient() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->leaving = true;
    impl_->changed.notify_all();
    impl_->stopping.notify_all();
    impl_->reader_wait.notify_all();
  }
  ::shutdown(impl_->fd, SHUT_RDWR);
  if (impl_->reader.joinable()) impl_->reader.join();
  if (impl_->heartbeat.joinable()) impl_->heartbeat.join();
}

void CoordinationClient::put(const std::string& key, const std::string& value) {
  impl_->write_bytes(wire::encode(wire::Type::kPut, {key, value}));
}

bool CoordinationClient::caller_waiting() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->callers_waiting > 0;
}

Result<std::optional<std::string>> CoordinationClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string timeout_item = wire::encode_u64(static_cast<std::uint64_t>(timeout.count()));
  auto reply = impl_->request(wire::Type::kGet, {key, timeout_item});
  if (!reply.ok()) return reply.error();
  if (reply.value().type == wire::Type::kValue) return std::optional<std::string>(reply.value().items[1]);
  return std::optional<std::string>();
}

Result<std::vector<int>> CoordinationClient::agree(const std::string& name, std::chrono::milliseconds patience,
                                                   std::optional<Clock::time_point> answer_by) {
  const std::string patience_item = wire::encode_u64(static_cast<std::uint64_t>(patience.count()));
  auto reply = impl_->request(wire::Type::kAgree, {name, patience_item}, answer_by);
  if (!reply.ok()) return reply.error();
  if (reply.value().type == wire::Type::kAgreeTimeout) return parse_ranks(reply.value().items[1]);
  return std::vector<int>();
}

Result<Gathered> CoordinationClient::gather(const std::string& round, const std::string& bytes,
                                            std::chrono::milliseconds patience, std::vector<int>& missing) {
  const std::string patience_item = wire::encode_u64(static_cast<std::uint64_t>(patience.count()));
  auto reply = impl_->request(wire::Type::kGather, {round, bytes, patience_item});
  if (!reply.ok()) return reply.error();
  if (reply.value().type == wire::Type::kAgreeTimeout) {
    missing = parse_ranks(reply.value().items[1]);
    return Gathered();
  }
  // The parts, without the request's id, still in the reply's buffer.
  auto& items = reply.value().items;
  items.erase(items.begin());
  return Gathered(std::move(reply.value().owner), std::move(items));
}

void CoordinationClient::publish_failure(const std::string& message, std::chrono::milliseconds bound, bool stopped) {
  impl_->write_frame(
      wire::failure_frame(wire::Type::kFail, static_cast<std::uint64_t>(impl_->config.rank), message, stopped));
  ::shutdown(impl_->fd, SHUT_WR);
  std::unique_lock lock(impl_->mutex);
  impl_->changed.wait_for(lock, bound, [&] { return impl_->service_closed; });
}

void CoordinationClient::publish_blame(int rank, const std::string& message) {
  impl_->write_frame(wire::failure_frame(wire::Type::kFail, static_cast<std::uint64_t>(rank), message, false));
}

void CoordinationClient::prepare_signal_frame(int slot, const std::string& message) {
  impl_->signal_frames[slot] = wire::encode(
      wire::failure_frame(wire::Type::kFail, static_cast<std::uint64_t>(impl_->config.rank), message, false));
}

void CoordinationClient::publish_prepared_from_signal(int slot) noexcept {
  if (impl_->writing.test_and_set(std::memory_order_acquire)) return;  // a write was cut by the signal
  static_cast<void>(impl_->send_tagged(impl_->signal_frames[slot]));
  impl_->writing.clear(std::memory_order_release);
}

std::optional<PeerFailure> CoordinationClient::failure() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->failure;
}

void CoordinationClient::leave() {
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->leaving) return;
    impl_->leaving = true;
    impl_->changed.notify_all();
    impl_->stopping.notify_all();
    impl_->reader_wait.notify_all();
  }
  impl_->write_frame(wire::Frame{wire::Type::kBye, {}});
  ::shutdown(impl_->fd, SHUT_RDWR);
}

}  // namespace dew::runtime
