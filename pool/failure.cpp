// The process-wide failure path of a pool: a process that fails prints its
// error once, publishes it and exits at once; one that hears of a peer's
// failure ends with kPeerFailedExitCode; the watch thread ends a process that
// has not heard of it at an agreement within the grace; fatal signals and
// uncaught exceptions become published failures.
#include "failure.h"

#include <cxxabi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "dew/failure_record.h"
#include "dew/failure_timings.h"
#include "dew/log.h"
#include "dew/task_contract.h"
#include "dew/text.h"
#include "pool_state.h"

namespace dew::runtime {
namespace {

// How a stop's notice begins (Pool::stopped_by_signal).
const std::string kStoppedBy = "stopped by ";

// The process's pool, for the signal and terminate handlers.
std::atomic<Pool::State*> g_pool{nullptr};
std::terminate_handler g_previous_terminate = nullptr;
bool g_terminate_installed = false;
bool g_handlers_installed = false;
// The message of the PoolError a failed join() threw (see guard_join_failure).
std::string g_join_failure;
std::unique_ptr<PmixSession> g_join_pmix;  // a failed join's PMIx session

std::mutex g_before_exit_mutex;
std::function<void(int)> g_before_exit;

// Runs the program's hook on a thread of its own and waits for it at most
// `bound` (Settings::exit_bound): a hook stuck (a lock held by the thread
// that failed, a finally: blocked in C code) must not hold the process.
void run_before_exit(std::chrono::milliseconds bound, int exit_code) {
  std::function<void(int)> hook;
  {
    std::lock_guard lock(g_before_exit_mutex);
    hook = std::exchange(g_before_exit, nullptr);
  }
  if (!hook) return;
  struct Done {
    std::mutex mutex;
    std::condition_variable changed;
    bool done = false;
  };
  auto done = std::make_shared<Done>();
  std::thread([hook = std::move(hook), done, exit_code] {
    // Says "done" however the hook ends, an unwinding by pthread_exit included.
    struct MarkDone {
      Done& done;
      ~MarkDone() {
        std::lock_guard lock(done.mutex);
        done.done = true;
        done.changed.notify_all();
      }
    } mark{*done};
    try {
      hook(exit_code);
    } catch (abi::__forced_unwind&) {
      // pthread_exit: Python ends a thread that takes its lock while the
      // interpreter finalizes. The unwinding must go on: swallowing it
      // aborts the process ("FATAL: exception not rethrown").
      throw;
    } catch (...) {  // the process is ending: nothing to report it to
    }
  }).detach();
  std::unique_lock lock(done->mutex);
  done->changed.wait_for(lock, bound, [&] { return done->done; });
}

[[noreturn]] void wait_for_the_end() {
  // Another thread is already ending the process.
  for (;;) pause();
}

// note_exit_under_way(): set once by the exiting thread, then only read. The
// pool may be destroyed by that exit at any moment after: a thread ended by
// it reads these, never g_pool.
std::atomic<bool> g_exit_under_way{false};
std::atomic<long long> g_exit_bound_ms{timings::kBeforeExitBound.count()};
char g_ended_by_exit_line[512] = {};
std::size_t g_ended_by_exit_length = 0;

[[noreturn]] void park_thread_ended_by_exit() {
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    // A raw write: the logger may be destroyed by the exit already.
    [[maybe_unused]] ssize_t ignored = ::write(STDERR_FILENO, g_ended_by_exit_line, g_ended_by_exit_length);
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(g_exit_bound_ms.load()));
      std::signal(SIGABRT, SIG_DFL);
      std::abort();
    }).detach();
  }
  wait_for_the_end();
}

void on_fatal_signal(int signal_number) {
  Pool::State* state = g_pool.load();
  if (state && !state->failing.exchange(true)) {
    std::size_t slot = 0;
    while (slot < std::size(kFatalSignals) && kFatalSignals[slot] != signal_number) ++slot;
    // The logger may hold a lock the interrupted code held: a raw write.
    const std::string& line = state->signal_lines[slot];
    [[maybe_unused]] ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
    if (state->client) {
      state->client->publish_prepared_from_signal(static_cast<int>(slot));
      // Give the frame time to leave (and process 0's service thread time
      // to push it) before the process dies.
      const auto wait = state->service ? timings::kSignalFramePushed : timings::kSignalFrameLeaves;
      const timespec pause{0, static_cast<long>(std::chrono::nanoseconds(wait).count())};
      nanosleep(&pause, nullptr);
    }
  }
  // Re-raise with the default action: the exit status still says "signal".
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

void on_terminate() {
  // Before g_pool is read: the exit under way may be destroying the pool.
  if (g_exit_under_way.load() && !std::current_exception()) park_thread_ended_by_exit();
  std::string message = "uncaught exception";
  bool join_failed = false;
  std::vector<int> late;
  if (auto current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const PoolError& error) {
      message += ": " + std::string(error.what());
      join_failed = !g_join_failure.empty() && g_join_failure == error.what();
      late = error.late_ranks();
    } catch (const std::exception& error) {
      message += ": " + std::string(error.what());
    } catch (...) {
      message += " (not a std::exception)";
    }
  }
  if (Pool::State* state = g_pool.load()) {
    if (!late.empty()) state->fail_for_late(late, message);
    state->fail(message, 1);
  }
  if (join_failed) {
    log_error("error: cannot join the pool: " + g_join_failure);
    if (g_join_pmix) g_join_pmix->abort(kJoinFailedExitCode, "cannot join the pool: " + g_join_failure);
    std::fflush(nullptr);
    ::_exit(kJoinFailedExitCode);
  }
  if (g_previous_terminate) g_previous_terminate();
  std::abort();
}

void install_terminate_handler() {
  if (g_terminate_installed) return;
  g_previous_terminate = std::set_terminate(on_terminate);
  g_terminate_installed = true;
}

}  // namespace

void Pool::State::stop_watch() {
  {
    std::lock_guard lock(mutex);
    stopping = true;
    changed.notify_all();
  }
  if (watch.joinable() && watch.get_id() != std::this_thread::get_id()) watch.join();
}

void Pool::State::start_watch() {
  watch = std::thread([this] {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return stopping || failure_heard.has_value(); });
    if (stopping) return;
    if (changed.wait_until(lock, *failure_heard + settings.failure_grace, [&] { return stopping; })) return;
    lock.unlock();
    auto failed = client->failure().value_or(PeerFailure{0, "unknown failure"});
    if (left.load() && failed.rank == identity.rank) return;  // its own leaving: leave() goes on
    // A grace below a second is a program that ends at once (Python, dew
    // worker): nothing to say about agreements.
    if (settings.failure_grace >= std::chrono::seconds(1)) {
      failed.message += " (not heard at an agreement within " +
                        seconds_text(std::chrono::duration<double>(settings.failure_grace).count()) +
                        ", DEW_FAILURE_GRACE_SECONDS)";
    }
    end_for_peer(failed);
  });
}

namespace {

// The record of the failure for the launcher (dew/failure_record.h), on
// stderr beside the line for people, when a Dew launcher asked for it.
void say_failure_record(const FailureRecord& record) {
  const char* tag = std::getenv(kNoticeTagVariable);
  if (tag == nullptr || *tag == '\0') return;
  const std::string line = encode_failure_record(tag, record) + "\n";
  std::fflush(stderr);
  [[maybe_unused]] const auto written = ::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace

void Pool::State::say_own_failure_record(const std::string& error, int exit_code) const {
  say_failure_record(FailureRecord{identity.rank, error, exit_code, identity.hostname, failure_seen_now_us()});
}

void Pool::State::end_for_peer(const PeerFailure& failed) {
  if (failing.load() || ending.exchange(true)) wait_for_the_end();
  // A peer stopped from outside (stopped_by_signal) did not fail: said as a stop.
  if (failed.stopped) {
    log_info("ending: process " + std::to_string(failed.rank) + " was " + failed.message);
  } else {
    log_error("ending: process " + std::to_string(failed.rank) + " failed: " + failed.message);
    // A peer's word: the failed process's exit code and node are its own.
    say_failure_record(FailureRecord{failed.rank, failed.message, std::nullopt, "", failure_seen_now_us()});
  }
  run_before_exit(settings.exit_bound, kPeerFailedExitCode);
  // Process 0's service dies with it: let the failure reach everyone first.
  if (service) service->flush_failure(timings::kFailureFlush);
  std::fflush(nullptr);
  ::_exit(kPeerFailedExitCode);
}

void Pool::State::fail(const std::string& error, int exit_code) {
  // A peer's failure heard already, its word not yet acted on (the watch
  // thread ends the process a moment later; a device that waited for that
  // word, Pool::wait_until_ending, is woken first): this error is its
  // consequence, and the process ends as that peer's peer, naming it.
  if (client) {
    if (auto heard = client->failure(); heard && heard->rank != identity.rank) end_for_peer(*heard);
  }
  if (failing.exchange(true) || ending.load()) wait_for_the_end();
  log_error("error: " + error);
  say_own_failure_record(error, exit_code);
  if (client) {
    client->publish_failure(error, timings::kFailureFlush);
    // Process 0 hosts the service: its own failure must reach every peer
    // before the service dies with it.
    if (service) service->flush_failure(timings::kFailureFlush);
  }
  run_before_exit(settings.exit_bound, exit_code);
  if (pmix) pmix->abort(exit_code, prefix() + error);
  std::fflush(nullptr);
  ::_exit(exit_code);
}

bool Pool::State::announce_end(const std::string& line, const std::string& message, bool error) {
  if (failing.exchange(true) || ending.load() || (client && client->failure())) return false;
  error ? log_error(line) : log_info(line);
  if (!client) return true;
  // The process lives on a while: the frame needs no wait to leave it,
  // except from process 0, whose service must push it before it ends.
  client->publish_failure(message, std::chrono::milliseconds(0), /*stopped=*/!error);
  if (service) service->flush_failure(timings::kStopNoticeFlush);
  return true;
}

void Pool::State::stopped_by_signal(int signal_number) {
  const std::string signal =
      std::string("signal ") + std::to_string(signal_number) + " (SIG" + sigabbrev_np(signal_number) + ")";
  announce_end("stopped by " + signal + " from outside the pool: ending",
               kStoppedBy + signal + " from outside the pool (scancel, a time limit, a preemption or a launcher)",
               false);
}

void Pool::stopped_by_signal(int signal_number) { state_->stopped_by_signal(signal_number); }

void Pool::announce_failure(const std::string& error, int exit_code) {
  if (state_->announce_end("error: " + error, error, true)) state_->say_own_failure_record(error, exit_code);
  // Peers have ended by now, and launchers wait only a moment for the
  // process they name: the rest of its exit (a framework's teardown over
  // connections whose peers are gone) is bounded.
  std::thread([exit_code] {
    std::this_thread::sleep_for(timings::kAnnouncedExitBound);
    std::fflush(nullptr);
    ::_exit(exit_code);
  }).detach();
}

std::optional<int> Pool::a_process_that_left() {
  if (!state_->client) return std::nullopt;
  for (int rank = 0; rank < size(); ++rank) {
    if (rank == this->rank()) continue;
    // Put at once when it left: a moment's wait for the service's answer only.
    const auto left =
        state_->client->get(std::string(kLeftKeyPrefix) + std::to_string(rank), std::chrono::milliseconds(0));
    if (!left.ok()) return std::nullopt;  // the pool is ending: its own word names the failure
    if (left.value()) return rank;
  }
  return std::nullopt;
}

void note_exit_under_way() {
  if (g_exit_under_way.load()) return;
  std::string line =
      "warning: a thread ended in std::terminate (no exception) while the program was already "
      "exiting: not a failure; the exit goes on\n";
  if (Pool::State* state = g_pool.load()) {
    line = state->prefix() + line;
    g_exit_bound_ms = state->settings.exit_bound.count();
  }
  g_ended_by_exit_length = std::min(line.size(), sizeof g_ended_by_exit_line);
  std::memcpy(g_ended_by_exit_line, line.data(), g_ended_by_exit_length);
  g_exit_under_way = true;
}

void set_before_exit(std::function<void(int exit_code)> flush) {
  std::lock_guard lock(g_before_exit_mutex);
  g_before_exit = std::move(flush);
}

// Every waiting process learns at about the same moment that the same
// processes are late. Process 0 says so for the pool (when it is not late
// itself); the others wait a moment for its word and end as peers, so the
// news is published once and names the late process, not a waiting one.
void Pool::State::fail_for_late(const std::vector<int>& late, const std::string& error) {
  if (!client) fail(error, 1);
  const bool zero_says_it = identity.rank != 0 && std::find(late.begin(), late.end(), 0) == late.end();
  if (zero_says_it) {
    std::unique_lock lock(mutex);
    changed.wait_for(lock, timings::kLateWordWait, [&] { return failure_heard.has_value(); });
  }
  if (auto heard = client->failure()) end_for_peer(*heard);
  const PeerFailure blamed{late.front(), error};
  client->publish_blame(blamed.rank, blamed.message);
  end_for_peer(blamed);
}

void attach_failure_path(Pool::State& state, bool handlers) {
  g_pool.store(&state);
  if (!handlers) return;
  for (std::size_t slot = 0; slot < std::size(kFatalSignals); ++slot) {
    const int number = kFatalSignals[slot];
    const std::string message = std::string("fatal signal ") + sigabbrev_np(number) + " (" + strsignal(number) + ")";
    state.signal_lines[slot] = state.prefix() + "error: " + message + "\n";
    if (state.client) state.client->prepare_signal_frame(static_cast<int>(slot), message);
    struct sigaction action {};
    action.sa_handler = on_fatal_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND;
    sigaction(number, &action, nullptr);
  }
  install_terminate_handler();
  g_handlers_installed = true;
}

void guard_join_failure() { install_terminate_handler(); }

void note_join_failure(const std::string& message) { g_join_failure = message; }

void keep_pmix_for_join_failure(std::unique_ptr<PmixSession> pmix) { g_join_pmix = std::move(pmix); }

void detach_failure_path(Pool::State& state) {
  Pool::State* expected = &state;
  if (!g_pool.compare_exchange_strong(expected, nullptr) || !g_handlers_installed) return;
  for (int number : kFatalSignals) std::signal(number, SIG_DFL);
  std::set_terminate(g_previous_terminate);
  g_terminate_installed = false;
  g_handlers_installed = false;
}

namespace detail {

Pool::State* attached_pool() { return g_pool.load(); }

void fail_process(const std::string& message, int exit_code) {
  if (Pool::State* state = g_pool.load()) state->fail(message, exit_code);
  // Not joined: the line still carries the rank a launcher gave, as a pool's do.
  // The rank of the launcher the pool would have joined by (identity's
  // precedence: mpirun inside an allocation is Open MPI's rank, not Slurm's).
  const Environment env = current_environment();
  if (!(env.count(contract::kLinesPrefixed.name) && env.at(contract::kLinesPrefixed.name) == "1")) {
    if (const char* name = rank_variable(rank_source(env))) {
      if (auto rank = env.find(name); rank != env.end() && parse_whole<unsigned>(rank->second)) {
        set_log_prefix("[" + rank->second + "] ");
      }
    }
  }
  log_error("error: " + message);
  std::fflush(nullptr);
  ::_exit(exit_code);
}

}  // namespace detail
}  // namespace dew::runtime
