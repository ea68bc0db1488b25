#include "dew/supervisor.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "dew/exit_status.h"
#include "dew/failure_record.h"
#include "dew/log.h"

namespace dew::launch {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// After the last process has ended, output still in flight (from children
// it left behind holding its pipes) is read for at most this long.
constexpr auto kDrain = 1s;
// How long a pool's "a peer failed" exit waits for the failure it reports:
// a process that said its failure to the pool exits within 250 ms
// (kAnnouncedExitBound), its peers a moment after the word; 200 ms named
// it by its peers' word, not its own exit code, on a loaded machine.
constexpr auto kSettle = 500ms;
// After a process's own failure, how long the others have to end by
// themselves before they are signalled: in a pool they learn of it at once
// and end saying which process failed and why, a line SIGTERM would cut.
constexpr auto kPeersEndOnTheirOwn = 500ms;

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed terminal or pipe: the output is lost, the launch goes on
    done += static_cast<std::size_t>(n);
  }
}

std::string ssh_hint(const std::string& host) {
  // Quoted as a shell reads it, so that the command pastes as it is shown.
  return "passwordless ssh must work: check that `ssh -o BatchMode=yes -- " + shell_quote(host) + " true` succeeds";
}

Supervisor::Supervisor(std::chrono::milliseconds grace, std::string notice_tag)
    : grace_(grace), notice_tag_(std::move(notice_tag)) {
  sigset_t set;
  sigemptyset(&set);
  for (const int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, s);
  sigprocmask(SIG_BLOCK, &set, nullptr);
  signal_fd_ = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd_ < 0) log_error(std::string("signalfd failed: ") + std::strerror(errno));
}

void Supervisor::add(Running process) { processes_.push_back(std::make_unique<Running>(std::move(process))); }

int Supervisor::run() {
  if (signal_fd_ < 0) {
    signal_all(SIGKILL);
    return 1;
  }
  std::optional<Clock::time_point> kill_at, drain_until;
  for (;;) {
    if (any_alive()) {
      if (stopping_ && !kill_at) kill_at = Clock::now() + grace_;
    } else if (!drain_until) {
      drain_until = Clock::now() + kDrain;
    }
    if (drain_until && (open_streams() == 0 || Clock::now() >= *drain_until)) break;
    if (awaited_stop_at_ && Clock::now() >= *awaited_stop_at_) {
      awaited_stop_at_.reset();
      if (awaited_line_) log_error(*awaited_line_);  // it did not end by itself
      awaited_line_.reset();
      for (auto& p : processes_) {
        if (!p->alive || p->rank != *awaited_) continue;
        kill(-p->io.pid, SIGTERM);
        kill(-p->io.pid, SIGCONT);
      }
    }
    if (kill_at && Clock::now() >= *kill_at) {
      signal_all(SIGKILL);
      kill_at = Clock::now() + 24h;
    }
    std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
    std::vector<std::pair<Running*, bool>> owners{{nullptr, false}};
    for (auto& p : processes_) {
      if (p->io.out >= 0) fds.push_back({p->io.out, POLLIN, 0}), owners.emplace_back(p.get(), false);
      if (p->io.err >= 0) fds.push_back({p->io.err, POLLIN, 0}), owners.emplace_back(p.get(), true);
    }
    auto next = drain_until ? *drain_until : Clock::now() + 1h;
    if (kill_at && *kill_at < next) next = *kill_at;
    if (awaited_stop_at_ && *awaited_stop_at_ < next) next = *awaited_stop_at_;
    const auto wait_ms =
        std::max<long long>(0, std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count() + 1);
    if (poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(wait_ms, 1000000))) < 0) {
      if (errno == EINTR) continue;
      log_error(std::string("poll failed: ") + std::strerror(errno));
      signal_all(SIGKILL);
      return 1;
    }
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) pump(*owners[i].first, owners[i].second);
    }
    if ((fds[0].revents & POLLIN) != 0) handle_signals();
  }
  if (awaited_line_) log_error(*awaited_line_);
  for (auto& p : processes_) {
    for (int* fd : {&p->io.out, &p->io.err, &p->io.in}) close_fd(*fd);
  }
  const bool srun = processes_.size() == 1 && processes_[0]->rank < 0;
  if (srun && !signalled_ && processes_[0]->status != 0) {
    exit_code_ = srun_exit_code();
    log_error("srun ended with " + describe_wait_status(processes_[0]->status) +
              (blame_ ? "; the failing rank: rank " + std::to_string(blame_->rank) +
                            (blame_->node.empty() ? "" : " on " + blame_->node) + " (" + blame_->why + ")"
                      : "") +
              "; exiting with " + std::to_string(exit_code_));
  }
  return exit_code_;
}

bool Supervisor::any_alive() const {
  return std::any_of(processes_.begin(), processes_.end(), [](const auto& p) { return p->alive; });
}

int Supervisor::open_streams() const {
  int n = 0;
  for (const auto& p : processes_) n += (p->io.out >= 0) + (p->io.err >= 0);
  return n;
}

void Supervisor::emit(const Running& p, bool err, const std::string& line) {
  // A failure record is for the launcher, not the terminal: the line for
  // people is beside it. Blame comes from records alone, never from the
  // wording of a line (a program may print anything).
  if (auto record = decode_failure_record(notice_tag_, line)) {
    take_record(*record);
    return;
  }
  note_line(p, line);
  write_all(err ? 2 : 1, p.rank < 0 ? relabel_srun_line(line) : rank_line(p.rank, line));
}

// The first record names the failure; a later one of the same rank adds
// what the first could not know (a peer's word has no exit code or node;
// the plugin's verdict and the process's own record have both).
void Supervisor::take_record(const FailureRecord& record) {
  if (!blame_) {
    blame_ = PeerBlame{record.rank, record.why, record.exit_code, record.node};
    return;
  }
  if (blame_->rank != record.rank) return;
  if (!blame_->exit_code) blame_->exit_code = record.exit_code;
  if (blame_->node.empty()) blame_->node = record.node;
}

// How srun says its tasks ended (Slurm's own lines): the exit code of a
// failure no record told (srun without the plugin).
void Supervisor::note_line(const Running& p, const std::string& line) {
  if (p.rank < 0) {
    if (auto end = srun_task_end(line)) srun_ends_.push_back(std::move(*end));
  }
}

void Supervisor::pump(Running& p, bool err) {
  int& fd = err ? p.io.err : p.io.out;
  LineSplitter& lines = err ? p.err_lines : p.out_lines;
  char buffer[65536];
  const ssize_t n = read(fd, buffer, sizeof buffer);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n > 0) {
    for (const auto& line : lines.feed(std::string_view(buffer, static_cast<std::size_t>(n)))) emit(p, err, line);
    return;
  }
  if (auto rest = lines.finish()) emit(p, err, *rest);
  close_fd(fd);
}

void Supervisor::handle_signals() {
  signalfd_siginfo info{};
  while (read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    const int signo = static_cast<int>(info.ssi_signo);
    if (signo == SIGCHLD) {
      reap();
    } else if (!stopping_) {
      exit_code_ = 128 + signo;
      signalled_ = true;
      log_warn(std::string(strsignal(signo)) + " received: stopping every process");
      stop();
    } else {
      signal_all(SIGKILL);  // a second Ctrl-C does not wait for the grace
    }
  }
}

// Marks every process that has ended; returns those that failed while the
// launcher was not stopping them.
std::vector<Running*> Supervisor::collect() {
  std::vector<Running*> failed;
  int status = 0;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    for (auto& p : processes_) {
      if (p->io.pid != pid || !p->alive) continue;
      p->alive = false;
      p->status = status;
      // The blamed process ending as a peer (75, its own failure published
      // before it froze) or with 0 (it left while the others waited) still
      // failed.
      if (awaited_ && p->rank == *awaited_) {
        exit_code_ = blamed_exit_code(status);
        say_awaited_end(*p);
      }
      // Whatever else its group still runs goes with it.
      kill(-pid, stopping_ ? SIGKILL : 0);
      if (!stopping_ && status != 0) failed.push_back(p.get());
    }
  }
  return failed;
}

// At the first failure: names it and stops the rest. When every failure
// seen is the runtime pool's "a peer failed" exit, the process that failed
// first is usually a moment behind: wait up to kSettle for it.
void Supervisor::reap() {
  std::vector<Running*> failed = collect();
  if (stopping_ || failed.empty()) return;
  const auto settle_until = Clock::now() + kSettle;
  while (std::all_of(failed.begin(), failed.end(), [](const Running* p) { return is_peer_failure(p->status); }) &&
         any_alive() && Clock::now() < settle_until) {
    std::this_thread::sleep_for(10ms);
    for (Running* p : collect()) failed.push_back(p);
  }
  std::vector<std::pair<int, int>> statuses;
  for (const Running* p : failed) statuses.emplace_back(p->rank, p->status);
  const Running& picked = *failed[pick_failure(statuses)];
  if (is_peer_failure(picked.status) && picked.rank >= 0) {
    report_blamed(picked);
  } else {
    report(picked);
    const auto others_until = Clock::now() + kPeersEndOnTheirOwn;
    while (any_alive() && Clock::now() < others_until) {
      std::this_thread::sleep_for(10ms);
      collect();
    }
  }
  stop();
}

// Every failure so far is "a peer failed": the process the peers named is
// the failure, though it has not ended (frozen, found by heartbeats); the
// launcher exits with its code once it is stopped.
void Supervisor::report_blamed(const Running& peer) {
  auto named = std::find_if(processes_.begin(), processes_.end(),
                            [&](const auto& p) { return blame_ && p->rank == blame_->rank; });
  if (named == processes_.end()) {
    exit_code_ = 1;
    log_error("rank " + std::to_string(peer.rank) + " on " + peer.host + " ended with " +
              describe_wait_status(peer.status) +
              " (a peer failed; no process said which); stopping the other processes");
    return;
  }
  const Running& culprit = **named;
  const std::string line = "rank " + std::to_string(culprit.rank) + " on " + culprit.host +
                           " failed: its peers ended because " + blame_->why + "; stopping the other processes";
  if (culprit.alive) {
    // Usually a moment from its own exit (a process that said its failure
    // to the pool exits within 250 ms): that is said when it comes.
    awaited_ = culprit.rank;
    awaited_line_ = line;
    exit_code_ = 1;  // until it ends
  } else {
    log_error(line);
    exit_code_ = blamed_exit_code(culprit.status);
  }
}

// The awaited process has ended: by itself with a failure of its own, its
// own exit is the line; otherwise (it left with 0 or 75, or was stopped)
// its peers' word.
void Supervisor::say_awaited_end(const Running& p) {
  if (!awaited_line_) return;
  if (!signalled_ && is_bad_exit(p.status) && !is_peer_failure(p.status)) {
    log_error("rank " + std::to_string(p.rank) + " on " + p.host + " ended with " + describe_wait_status(p.status) +
              "; stopping the other processes");
  } else {
    log_error(*awaited_line_);
  }
  awaited_line_.reset();
}

int Supervisor::srun_exit_code() const {
  const auto srun = std::find_if(processes_.begin(), processes_.end(), [](const auto& p) { return p->rank < 0; });
  return slurm_exit_code(exit_code_of((*srun)->status), srun_ends_, blame_);
}

void Supervisor::report(const Running& p) {
  exit_code_ = exit_code_of(p.status);
  if (p.rank < 0) return;  // run() says how srun ended, once its last lines are read
  std::string line =
      "rank " + std::to_string(p.rank) + " on " + p.host + " ended with " + describe_wait_status(p.status);
  if (p.remote && WIFEXITED(p.status) && WEXITSTATUS(p.status) == 255) {
    line += " (ssh's code for a failed connection or login; " + ssh_hint(p.host) + ")";
  }
  log_error(line + "; stopping the other processes");
}

void Supervisor::stop() {
  stopping_ = true;
  for (auto& p : processes_) close_fd(p->io.in);  // EOF: the remote watcher ends the command
  // The process the peers named, still running, is stopped half the grace
  // later: its own exit code is the launcher's, and one that is ending (it
  // left the pool; Python's teardown takes a while) should give it.
  if (awaited_ && !signalled_) awaited_stop_at_ = Clock::now() + grace_ / 2;
  const auto sparing = awaited_stop_at_ ? awaited_ : std::nullopt;
  signal_all(SIGTERM, sparing);
  signal_all(SIGCONT, sparing);  // a stopped process acts on SIGTERM only once continued
}

void Supervisor::signal_all(int signo, std::optional<int> sparing) {
  for (auto& p : processes_) {
    if (!p->alive || (sparing && p->rank == *sparing)) continue;
    // srun relays the signal to the step itself; anything else: its group.
    kill(p->rank < 0 ? p->io.pid : -p->io.pid, signo);
  }
}

}  // namespace dew::launch
