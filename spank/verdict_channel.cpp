#include "verdict_channel.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <random>
#include <vector>

extern "C" {
#include <slurm/spank.h>
}

#include "dew/coordinator_port.h"
#include "dew/failure_record.h"
#include "step_verdict.h"

namespace dew::spank {

void say_failure_record(const std::optional<std::string>& tag, const FailureNotice& failure) {
  if (!tag || tag->empty()) return;
  const std::string said = "rank " + std::to_string(failure.rank) + " ";
  const std::string& line = failure.line;
  const std::string why = line.rfind(said, 0) == 0 ? line.substr(said.size()) : line;
  const FailureRecord record{static_cast<int>(failure.rank), why, failure.exit_code, failure.node, failure.ended_at_us};
  slurm_error("%s", encode_failure_record(*tag, record).c_str());
}

namespace {

using Clock = std::chrono::steady_clock;
// Notices being read at once; more wait in the listen backlog.
constexpr std::size_t kMaxPending = 64;
constexpr std::string_view kTaken = "ok\n";

int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// One node's connection, read until its newline or its deadline.
struct Pending {
  int fd = -1;
  std::string text;
  Clock::time_point deadline;
};

void say(StepVerdict& verdict) {
  const auto lines = verdict.say();
  if (!lines) return;
  slurm_error("dew: %s", lines->verdict.c_str());
  const char* tag = std::getenv(kNoticeTagVariable);
  FailureNotice named = lines->named;
  named.line = lines->verdict;
  say_failure_record(tag ? std::optional<std::string>(tag) : std::nullopt, named);
  // srun -v: not a verdict of their own.
  for (const auto& line : lines->after) slurm_verbose("dew: %s", line.c_str());
}

// Reads what `p` has; true once it is done with (taken, refused or timed out).
bool read_notice(Pending& p, std::uint32_t job, std::uint32_t step, const std::string& secret, StepVerdict& verdict,
                 std::optional<Clock::time_point>& say_at) {
  char buffer[512];
  const ssize_t n = ::recv(p.fd, buffer, sizeof buffer, MSG_DONTWAIT);
  if (n > 0) p.text.append(buffer, static_cast<std::size_t>(n));
  const bool whole = p.text.find('\n') != std::string::npos;
  if (!whole && n != 0 && p.text.size() <= kFailureNoticeMaxBytes && Clock::now() < p.deadline) return false;
  auto notice = whole ? decode_failure_notice(p.text.substr(0, p.text.find('\n') + 1), job, step, secret)
                      : Result<FailureNotice>(invalid_argument("failure notice refused: cut short"));
  if (!notice.ok()) {
    slurm_verbose("dew: %s", notice.error().message.c_str());
    return true;
  }
  static_cast<void>(::send(p.fd, kTaken.data(), kTaken.size(), MSG_NOSIGNAL | MSG_DONTWAIT));
  if (auto late = verdict.add(std::move(notice.value()))) slurm_verbose("dew: %s", late->c_str());
  if (!say_at) say_at = Clock::now() + kVerdictSettle;
  return true;
}

// Binds `fd` to a port of `range` (Slurm's SrunPortRange: a site whose
// firewall lets the nodes reach srun on those ports only), from a random one
// on, as srun takes its own; without a range, to one the kernel picks.
bool bind_in(int fd, sockaddr_in6& address, std::optional<PortRange> range) {
  const auto bind_to = [&](std::uint16_t port) {
    address.sin6_port = htons(port);
    return ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  };
  if (!range) return bind_to(0);
  const std::uint32_t span = static_cast<std::uint32_t>(range->high) - range->low + 1;
  const std::uint32_t first = std::random_device{}() % span;
  for (std::uint32_t tried = 0; tried < span; ++tried) {
    if (bind_to(port_from_random(first + tried, *range))) return true;
    if (errno != EADDRINUSE) return false;
  }
  return false;
}

}  // namespace

VerdictListener::~VerdictListener() { stop(); }

std::uint16_t VerdictListener::listen(std::optional<PortRange> range) {
  const int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return 0;
  const int no = 0;
  ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof no);  // IPv4 nodes too
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_any;
  if (!bind_in(fd, address, range) || ::listen(fd, 128) != 0) {
    ::close(fd);
    return 0;
  }
  socklen_t length = sizeof address;
  wake_fd_ = ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0
                 ? ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)
                 : -1;
  if (wake_fd_ < 0) {
    ::close(fd);
    return 0;
  }
  listen_fd_ = fd;
  port_ = ntohs(address.sin6_port);
  port_from_range_ = range.has_value();
  return port_;
}

void VerdictListener::start(std::uint32_t job, std::uint32_t step, std::string secret,
                            std::function<void()> on_first_notice) {
  std::lock_guard lock(mutex_);
  if (listen_fd_ < 0 || thread_.joinable() || stopping_) return;
  thread_ = std::thread([this, job, step, secret = std::move(secret), first = std::move(on_first_notice)] {
    run(job, step, secret, first);
  });
}

void VerdictListener::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  if (wake_fd_ >= 0) {
    const std::uint64_t one = 1;
    if (::write(wake_fd_, &one, sizeof one) < 0) {
      // eventfd write fails only when its count is full: the thread is awake then
    }
  }
  if (thread_.joinable()) thread_.join();
  close_fd(listen_fd_);
  close_fd(wake_fd_);
}

void VerdictListener::run(std::uint32_t job, std::uint32_t step, const std::string& secret,
                          const std::function<void()>& on_first_notice) {
  // Said here, not at listen(): srun takes -v after the plugin's options.
  slurm_verbose("dew: step %u.%u: the nodes' failure notices come to srun's port %u%s", job, step, port_,
                port_from_range_ ? " (of SrunPortRange)" : "");
  StepVerdict verdict;
  std::vector<Pending> pending;
  std::optional<Clock::time_point> say_at, stop_by;
  for (;;) {
    if (!stop_by) {
      std::lock_guard lock(mutex_);
      // Told to stop: what the nodes sent already (their task_exit waits
      // for srun's "ok" before srun hears of the exit) is still taken.
      if (stopping_) stop_by = Clock::now() + kNoticeBound;
    }
    std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    for (const auto& p : pending) fds.push_back({p.fd, POLLIN, 0});
    auto deadline = Clock::now() + std::chrono::seconds(60);
    if (say_at) deadline = std::min(deadline, *say_at);
    for (const auto& p : pending) deadline = std::min(deadline, p.deadline);
    if (stop_by) deadline = std::min(deadline, pending.empty() ? Clock::now() : *stop_by);
    const int ready = ::poll(fds.data(), fds.size(), ms_until(deadline));
    if (ready < 0 && errno != EINTR) break;
    if (fds[1].revents & POLLIN) {
      std::uint64_t count = 0;
      if (::read(wake_fd_, &count, sizeof count) < 0) {
        // nothing to read: another wake took it
      }
    }
    for (std::size_t k = 0; k < pending.size();) {
      const bool had_notice = say_at.has_value();
      if (read_notice(pending[k], job, step, secret, verdict, say_at)) {
        if (!had_notice && say_at && on_first_notice) on_first_notice();
        ::close(pending[k].fd);
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(k));
      } else {
        ++k;
      }
    }
    while (pending.size() < kMaxPending) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) break;
      pending.push_back({fd, "", Clock::now() + kNoticeBound});
    }
    if (say_at && Clock::now() >= *say_at) say(verdict);
    if (stop_by && ((pending.empty() && ready == 0) || Clock::now() >= *stop_by)) break;
  }
  for (auto& p : pending) ::close(p.fd);
  say(verdict);
}

bool send_failure_notice(const std::string& host, std::uint16_t port, const std::string& notice,
                         std::chrono::milliseconds bound) {
  const auto deadline = Clock::now() + bound;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  int fd = -1;
  for (const addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) close_fd(fd);
  }
  ::freeaddrinfo(found);
  if (fd < 0) return false;
  std::size_t sent = 0;
  std::string reply;
  bool taken = false;
  while (!taken && Clock::now() < deadline) {
    pollfd p{fd, static_cast<short>(sent < notice.size() ? POLLOUT : POLLIN), 0};
    if (::poll(&p, 1, ms_until(deadline)) <= 0) continue;
    if (p.revents & (POLLERR | POLLHUP) && !(p.revents & POLLIN)) break;
    if (sent < notice.size()) {
      const ssize_t n = ::send(fd, notice.data() + sent, notice.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN && errno != EINTR) break;
      if (n > 0) sent += static_cast<std::size_t>(n);
      continue;
    }
    char buffer[16];
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
    if (n > 0) reply.append(buffer, static_cast<std::size_t>(n));
    taken = reply.starts_with(kTaken);
  }
  ::close(fd);
  return taken;
}

}  // namespace dew::spank
