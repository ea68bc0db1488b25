// Pool::State: what a joined pool holds, shared by pool.cpp (join and the
// calls), failure.cpp (the process's failure path) and shared_directory.cpp.
// Private to pool/.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "coordination.h"
#include "dew/pool.h"
#include "pmix_session.h"

namespace dew::runtime {

using Clock = std::chrono::steady_clock;

// The signals whose default action would end the process without a word:
// the pool publishes them as failures first.
inline constexpr int kFatalSignals[] = {SIGSEGV, SIGABRT, SIGBUS, SIGFPE};

struct Pool::State {
  Identity identity;
  Settings settings;
  std::unique_ptr<PmixSession> pmix;
  std::unique_ptr<CoordinationService> service;
  std::unique_ptr<CoordinationClient> client;
  std::map<std::string, unsigned> agreement_rounds;
  unsigned gather_round = 0;
  std::size_t last_gather_bytes = 0;            // the previous round's reply, for trimming after large ones
  std::map<std::string, std::string> local_kv;  // a pool of one

  std::atomic<bool> failing{false};
  std::atomic<bool> ending{false};
  // leave() has begun: a failure that names this process is then its own
  // leaving, which the peers waited for, not a reason to end it as a peer.
  std::atomic<bool> left{false};

  // The watch thread: ends the process when a published failure has not
  // been heard at an agreement within the grace.
  std::mutex mutex;
  std::condition_variable changed;
  std::optional<Clock::time_point> failure_heard;
  bool stopping = false;
  std::thread watch;

  // Written by a fatal signal's handler: whole lines, prefix included.
  std::string signal_lines[std::size(kFatalSignals)];

  // Under plain srun (Slurm's variables, no plugin) no launcher ends the
  // step when a task ends before it joins: the join's wait says so.
  bool loss_before_join_unseen = false;

  // "[rank] ", unless a launcher (dew launch) already prefixes every line.
  bool lines_prefixed = false;
  std::string prefix() const { return lines_prefixed ? "" : "[" + std::to_string(identity.rank) + "] "; }

  ~State() { stop_watch(); }

  void stop_watch();
  void start_watch();
  // Ends this process because `failed` failed: one line, exit code 75.
  [[noreturn]] void end_for_peer(const PeerFailure& failed);
  // Ends this process with its own error: one line, published, exit_code.
  [[noreturn]] void fail(const std::string& error, int exit_code);
  // See Pool::stopped_by_signal and Pool::announce_failure: `line` said
  // here (an error, or info), `message` published; the process goes on.
  // False when the pool was already ending (nothing said).
  void stopped_by_signal(int signal_number);
  bool announce_end(const std::string& line, const std::string& message, bool error);
  // The record of this process's own failure for a Dew launcher
  // (dew/failure_record.h): its rank, node and exit code.
  void say_own_failure_record(const std::string& error, int exit_code) const;
  // The pool fails because `late` never came (to the join, an agreement, a
  // gather): published once (by process 0 when it waits too), every process
  // ending as their peer, naming the first.
  [[noreturn]] void fail_for_late(const std::vector<int>& late, const std::string& error);

  // Every pool call that finds the pool failed ends here: the failure has
  // been "heard at an agreement".
  template <typename T>
  T checked(Result<T> result) {
    if (!result.ok()) {
      auto failed = client ? client->failure() : std::nullopt;
      end_for_peer(failed.value_or(PeerFailure{0, result.error().message}));
    }
    return std::move(result.value());
  }
};

// The process's failure path (failure.cpp): makes `state` the pool that
// fail_process() and the handlers publish to; with `handlers`, installs the
// SIGSEGV/SIGABRT/SIGBUS/SIGFPE and std::terminate handlers too.
void attach_failure_path(Pool::State& state, bool handlers);
// Undoes it, when `state` is still the attached pool.
void detach_failure_path(Pool::State& state);
// Before a join: a PoolError that join() throws (and notes here) and the
// program leaves uncaught ends the process with one line and
// kJoinFailedExitCode instead of std::terminate's abort.
void guard_join_failure();
void note_join_failure(const std::string& message);
// A join that failed under PMIx keeps its session: left uncaught, the
// failure aborts the job step through it (PMIx_Abort).
void keep_pmix_for_join_failure(std::unique_ptr<PmixSession> pmix);

// The framework's coordinator (framework_port.cpp): process 0 offers it
// before the join's last agreement, every other process takes it after.
Result<Done> offer_framework_coordinator(Pool::State& state);
Result<Done> take_framework_coordinator(Pool::State& state);

}  // namespace dew::runtime
