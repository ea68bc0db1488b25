// libdew's process pool: who this process is, meeting its peers, and ending
// the whole pool within seconds when one process fails.
//
//   auto pool = dew::runtime::join();          // reads PMIx, Open MPI, Slurm or dew variables
//   pool.agree("loaded");                      // a barrier with a patience
//   auto all = pool.all_gather(my_bytes);      // one entry per process, in rank order
//
// A process that fails after joining (pool.fail(), an uncaught exception, a
// fatal signal) prints its error once, publishes it and exits at once; its
// peers end with kPeerFailedExitCode (dew/exit_status.h) and a line naming
// it. Errors a caller may handle (a get that timed out, an agreement whose
// patience ran out, a directory that is not shared) are returned as a
// Result's Error by the try_ calls (try_join, try_get, try_agree, ...),
// which carries an ErrorCode (kTimeout, kInvalidArgument, ...). The calls
// without try_ are the same with the Error thrown as PoolError: left
// uncaught, it fails the process, and so the pool (fail fast).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "dew/exit_status.h"
#include "dew/export.h"
#include "dew/failure_timings.h"
#include "dew/result.h"
#include "dew/slurm_step.h"

namespace dew::runtime {

// Where the identity came from, in the order join() tries them.
enum class PoolSource { kExplicit, kPmix, kOpenMpi, kSlurm, kDew, kAlone };
DEW_API std::string_view source_name(PoolSource source);

struct DEW_API Address {
  std::string host;
  std::uint16_t port = 0;
  std::string text() const;  // "host:port", "[v6]:port"
};

// "host:port" or "[v6 address]:port"; `name` names the value in the error.
DEW_API Result<Address> parse_address(std::string_view text, std::string_view name);

struct DEW_API Identity {
  PoolSource source = PoolSource::kAlone;
  std::string why;  // one line: what made this the source
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int node = 0;
  std::string hostname;  // PMIx's PMIX_HOSTNAME, else gethostname(); filled by join()
  std::optional<Address> coordinator;
  std::string coordinator_from;  // the variable (or rule) it came from
  bool pmix = false;             // a PMIx server is there: PMIx fences and abort are used
  // Where the training framework's own rendezvous listens (jax.distributed's
  // coordinator, torch's env:// store): never Dew's coordinator. From
  // DEW_FRAMEWORK_COORDINATOR (srun --dew-pool, dew launch), else chosen by
  // process 0 at the join (a free port on its host) and agreed by the pool.
  std::optional<Address> framework_coordinator;
  std::string framework_coordinator_from;
};

struct DEW_API JoinOptions {
  // Explicit identity: both or neither.
  std::optional<int> rank;
  std::optional<int> size;
  std::optional<std::string> coordinator;  // "host:port"
  std::optional<std::string> secret;       // default: DEW_POOL_SECRET, removed from the environment once joined
  // One Slurm task (SLURM_NTASKS=1) forms no pool unless this is set.
  bool multi_host = false;
  // Default: DEW_AGREEMENT_PATIENCE_SECONDS, else one day.
  std::optional<std::chrono::milliseconds> agreement_patience;
  // A process not heard from for this long has failed. Default:
  // DEW_HEARTBEAT_TIMEOUT_SECONDS, else 10 s.
  std::optional<std::chrono::milliseconds> heartbeat_timeout;
  // A published failure not heard at an agreement within this ends the
  // process anyway. Default: DEW_FAILURE_GRACE_SECONDS, else 60 s.
  std::optional<std::chrono::milliseconds> failure_grace;
  // The grace when neither failure_grace nor DEW_FAILURE_GRACE_SECONDS sets
  // one: a program with no agreement loop to unwind a peer's failure through
  // (a Python script, dew worker's devices) sets a millisecond, to end as
  // soon as the failure is heard.
  std::optional<std::chrono::milliseconds> failure_grace_fallback;
  // An agreement or gather waiting this long is said, naming whom it waits
  // for. Default: DEW_SLOW_SECONDS, else 30 s.
  std::optional<std::chrono::milliseconds> slow_after;
  // How long to wait for the coordinator and every peer to show up.
  // Default: DEW_JOIN_TIMEOUT_SECONDS, else 300 s.
  std::optional<std::chrono::milliseconds> join_timeout;
  // How long a process ending for its own failure or a peer's gives its
  // before-exit hook (set_before_exit: flushing, Python's finally: and
  // atexit) before it ends hard. Default: DEW_EXIT_BOUND_SECONDS, else 2 s.
  std::optional<std::chrono::milliseconds> exit_bound;
  // Install the SIGSEGV/SIGABRT/SIGBUS/SIGFPE handlers and std::terminate
  // handler that publish a failure.
  bool failure_handlers = true;
};

using Environment = dew::Environment;  // dew/slurm_step.h
DEW_API Environment current_environment();

// Pure: which source applies and what it says. PMIx identities carry only
// the source here (rank and size come from PMIx_Init at join time).
DEW_API Result<Identity> resolve_identity(const Environment& env, const JoinOptions& options);

struct DEW_API Settings {
  // The defaults, and the race each bounds: dew/failure_timings.h.
  std::chrono::milliseconds agreement_patience{timings::kAgreementPatience};
  std::chrono::milliseconds heartbeat_timeout{timings::kHeartbeatTimeout};
  std::chrono::milliseconds failure_grace{timings::kFailureGrace};
  std::chrono::milliseconds join_timeout{timings::kJoinTimeout};
  std::chrono::milliseconds exit_bound{timings::kBeforeExitBound};
  std::chrono::milliseconds slow_after{timings::kSlowAfter};
};
// Pure: options first, then the DEW_*_SECONDS variables, then the defaults.
DEW_API Result<Settings> resolve_settings(const Environment& env, const JoinOptions& options);

// What all_gather returns: every process's bytes in rank order, as views
// into the buffer they came in (the service's reply, PMIx's strings), which
// it holds. One allocation a round, not one a process: at 1024 processes
// that was a fifth of a round's CPU. Copies share the buffer; a view lives
// as long as some copy does.
class DEW_API Gathered {
 public:
  using const_iterator = std::vector<std::string_view>::const_iterator;
  Gathered() = default;
  // `parts` view into what `owner` holds.
  Gathered(std::shared_ptr<const void> owner, std::vector<std::string_view> parts);
  // Parts given as strings (PMIx's, a pool of one): kept, not copied.
  explicit Gathered(std::vector<std::string> parts);

  std::size_t size() const { return parts_.size(); }
  bool empty() const { return parts_.empty(); }
  std::string_view operator[](std::size_t rank) const { return parts_[rank]; }
  std::string_view at(std::size_t rank) const { return parts_.at(rank); }
  std::string_view front() const { return parts_.front(); }
  std::string_view back() const { return parts_.back(); }
  const_iterator begin() const { return parts_.begin(); }
  const_iterator end() const { return parts_.end(); }
  // Each part copied into a string of its own.
  std::vector<std::string> strings() const;

 private:
  std::shared_ptr<const void> owner_;
  std::vector<std::string_view> parts_;
};

// What the pool's throwing calls throw: the Error's line as what(), and its code.
class DEW_API PoolError : public std::runtime_error {
 public:
  explicit PoolError(Error error) : std::runtime_error(error.message), error_(std::move(error)) {}
  ErrorCode code() const { return error_.code; }
  const Error& error() const { return error_; }
  // For an agreement or gather that ran out of patience: the processes that
  // never arrived (Error::late_processes). Left uncaught, the pool fails
  // because of them: every process ends as their peer (kPeerFailedExitCode),
  // naming the first.
  const std::vector<int>& late_ranks() const { return error_.late_processes; }

 private:
  Error error_;
};

// The throwing convenience: the value, or the Error thrown as PoolError.
template <typename T>
T value_or_throw(Result<T> result) {
  if (!result.ok()) throw PoolError(result.error());
  return std::move(result.value());
}

// Why `secret` cannot be a pool's DEW_POOL_SECRET (one line naming its
// length and what is allowed: 64 hex digits, as srun --dew-pool and dew
// launch draw them), or "" when it can.
DEW_API std::string pool_secret_problem(std::string_view secret);

// What join() would resolve here, without joining: the identity with PMIx's
// answers filled in (PMIx_Init, when a PMIx server is there) and this host's
// name. For `dew env`.
DEW_API Result<Identity> describe_identity(const Environment& env, const JoinOptions& options);

class DEW_API Pool {
 public:
  Pool(Pool&&) noexcept;
  Pool& operator=(Pool&&) noexcept;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  // Leaves the pool (see leave()).
  ~Pool();

  const Identity& identity() const;
  int rank() const;
  int size() const;
  // "tcp", "pmix+tcp" or "none" (one process alone).
  std::string backend() const;
  // The framework's coordinator the whole pool agreed on (see Identity).
  const Address& framework_coordinator() const;
  // What a framework reads to find its rendezvous (dew/framework_env.h):
  // torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
  // MASTER_ADDR, MASTER_PORT and JAX_COORDINATOR_ADDRESS, all for this
  // process and framework_coordinator(). A program sets them before it
  // initializes torch.distributed or jax.distributed.
  std::vector<std::pair<std::string, std::string>> framework_variables() const;

  // Key-value: put is visible to every later get; get waits up to timeout
  // (kTimeout when no process put the key by then). A key or value over the
  // coordination service's frame limit is refused (kInvalidArgument).
  Result<Done> try_put(const std::string& key, const std::string& value);
  Result<std::string> try_get(const std::string& key, std::chrono::milliseconds timeout);
  // Everybody's bytes in rank order.
  Result<Gathered> try_all_gather(const std::string& bytes);
  // A named agreement: returns when every process has called agree(name) as
  // many times as this one; kTimeout naming the missing processes (and
  // listing them in Error::late_processes) when the patience runs out.
  Result<Done> try_agree(const std::string& name);
  Result<Done> try_agree(const std::string& name, std::chrono::milliseconds patience);
  // The same, throwing the Error as PoolError.
  void put(const std::string& key, const std::string& value);
  std::string get(const std::string& key, std::chrono::milliseconds timeout);
  Gathered all_gather(const std::string& bytes);
  void agree(const std::string& name);
  void agree(const std::string& name, std::chrono::milliseconds patience);

  // True once this process has heard of a peer's failure, or is failing
  // itself: an error it meets now (a collective whose peer is gone) is a
  // consequence of the pool's ending, not a failure of its own.
  bool ending() const;
  // Waits until ending() is true, at most `bound`: true if it is. For an
  // error that may be the consequence of a peer's failure (a collective
  // whose peer is gone): the pool's word of that peer, which names it, is
  // waited for, not slept through (timings::kPeerNoticeGrace).
  bool wait_until_ending(std::chrono::milliseconds bound);

  // Prints the error once, publishes it to every peer and exits with
  // exit_code at once.
  [[noreturn]] void fail(const std::string& error, int exit_code = 1);
  // `error` came of waiting for the processes `late` (a PoolError's
  // late_ranks()): the pool's failure names them, once, as an uncaught
  // PoolError does in C++, and this process ends as a peer.
  [[noreturn]] void fail_for_late(const std::vector<int>& late, const std::string& error);

  // Every process writes a token into `path` and reads everybody's:
  // kInvalidArgument naming who sees what when the directory is not one
  // shared directory. require_ throws it as PoolError.
  Result<Done> check_shared_directory(const std::string& path);
  void require_shared_directory(const std::string& path);
  // Hash of every process's accelerator fingerprint (this process's is
  // `fingerprint`, for example topology::accelerator_fingerprint()), or
  // nullopt (and a log line naming the processes that differ) when they are
  // not all equal. compile_cache_key throws the gather's Error as PoolError.
  Result<std::optional<std::string>> try_compile_cache_key(const std::string& fingerprint);
  std::optional<std::string> compile_cache_key(const std::string& fingerprint);

  // This process is being stopped by `signal_number` from outside the pool
  // (scancel, a time limit's or a preemption's SIGTERM, a launcher): says so
  // in one line and tells the peers, which end at once (75) naming the stop,
  // unless the pool is ending already. Returns; the caller then ends the
  // process by that signal's default action, so a launcher or Slurm's
  // plugin sees a stop, not a failure to blame.
  void stopped_by_signal(int signal_number);
  // This process's program is ending with a failure of its own (Python's
  // sys.exit(3)): says "error: <error>" once and publishes it, so the peers
  // end at once naming this process, before its other connections (a
  // framework's) close under them. Returns; the program then ends with its
  // own exit code, which ends the process anyway (_exit) once
  // timings::kAnnouncedExitBound has passed. Nothing said when the pool is
  // ending already.
  void announce_failure(const std::string& error, int exit_code);

  // The lowest process, other than this one, that has left the pool (its
  // program ended: a return, sys.exit(0)) while this one runs; nullopt when
  // none has. A framework's collective (torch's gloo) that broke here with
  // no failure published was most likely that process's leaving.
  std::optional<int> a_process_that_left();

  // Normal exit: tells the pool this process is done. Process 0 hosts the
  // coordination service and waits here until every other process has left.
  void leave();

  struct DEW_LOCAL State;  // opaque; also reached by the process's failure handlers

 private:
  explicit Pool(std::unique_ptr<State> state);
  friend Result<Pool> try_join(JoinOptions options);
  std::unique_ptr<State> state_;
};

// Joins the pool this process belongs to (see PoolSource), logging one line
// such as "[1] Joined the pool: process 1 of 4 (slurm, tcp)". From then on
// every line of the process's logger (dew/log.h) starts with "[rank] "
// unless DEW_LINES_PREFIXED=1. Fails on contradictory variables
// (kInvalidArgument) or when peers never come (kTimeout, kUnavailable).
// A process joins once: a second call is refused (kInvalidArgument).
DEW_API Result<Pool> try_join(JoinOptions options = {});
// The same, throwing the Error as PoolError; left uncaught, that is one line
// and kJoinFailedExitCode (and under PMIx the step's abort), not
// std::terminate's abort.
DEW_API Pool join(JoinOptions options = {});

// What a process runs before it ends for its own failure or a peer's (not
// for a fatal signal): a program's own buffered output, such as Python's
// sys.stdout and logging handlers, its finally: blocks and atexit. It runs
// on a thread of its own, given at most Settings::exit_bound
// (DEW_EXIT_BOUND_SECONDS, 2 s), then the process ends anyway with the
// failure's exit code, which the hook is given (kPeerFailedExitCode for a
// peer's failure, kWatchdogExitCode for a step over its bound: a step that
// is stuck). One hook per process; an empty function removes it.
DEW_API void set_before_exit(std::function<void(int exit_code)> flush);

// What this process's framework says when one of its steps outlived its
// bound: true when its main thread waits on its peers inside a collective,
// false when it works on its own, nullopt when it cannot tell. Called on the
// watchdog's thread, and must answer within a second. Python's `import dew`
// sets one that reads the main thread's frames (torch.distributed, DDP, or
// autograd's backward once a process group exists). An empty function
// removes it.
DEW_API void set_collective_probe(std::function<std::optional<bool>()> probe);

// Says that the program is ending by itself (its main function returned, or
// Python's interpreter is finalizing after a return or sys.exit). From then
// on a thread that ends in std::terminate with no exception (a library's
// worker thread unwound by pthread_exit through a noexcept frame: Python
// 3.11 ends so a thread that takes the GIL once finalization has begun) is
// not the process's failure: it says so in one line and pauses, and the
// program's own exit goes on. Should that exit not come within
// Settings::exit_bound, the process ends by SIGABRT.
DEW_API void note_exit_under_way();

// Ends the process when one step runs longer than its bound. The bound is
// DEW_WATCHDOG (the SPANK plugin's value: "30m", "90s", "2h", "off") or 30
// minutes. A step is the life of the object step() returns.
//
// In a pool, the processes whose bounds pass say to each other their step
// count and whether they wait on their peers inside a collective (a pool
// call in flight, or what the collective probe says), for at most
// timings::kStallReportWait; the processes behind (outside a collective
// while others wait in one, silent, or at an earlier step) are named and end
// with kWatchdogExitCode, the waiting ones as their peers. When no one is
// known to wait (every step is just slow), each process names itself.
class DEW_API StepWatchdog {
 public:
  // Throws a DEW_WATCHDOG or DEW_PACE_SECONDS it cannot read as PoolError
  // (kInvalidArgument); create() returns it as the Error.
  explicit StepWatchdog(std::optional<std::chrono::milliseconds> bound = std::nullopt);
  static Result<std::unique_ptr<StepWatchdog>> create(std::optional<std::chrono::milliseconds> bound = std::nullopt);
  ~StepWatchdog();
  StepWatchdog(const StepWatchdog&) = delete;
  StepWatchdog& operator=(const StepWatchdog&) = delete;

  class Step {
   public:
    ~Step();
    Step(Step&&) = delete;

   private:
    friend class StepWatchdog;
    explicit Step(StepWatchdog& owner) : owner_(owner) {}
    StepWatchdog& owner_;
  };
  [[nodiscard]] Step step();
  // The same without a scope, for bindings whose steps are not C++ scopes
  // (Python's `with`): begin_step() starts one, end_step() ends it.
  void begin_step();
  void end_step();
  std::optional<std::chrono::milliseconds> bound() const;

 private:
  struct DEW_LOCAL Choice;  // the bound and the pace window, read and checked
  DEW_LOCAL static Result<Choice> choose(std::optional<std::chrono::milliseconds> bound);
  explicit StepWatchdog(const Choice& choice);
  struct DEW_LOCAL State;
  std::unique_ptr<State> state_;
};

}  // namespace dew::runtime
