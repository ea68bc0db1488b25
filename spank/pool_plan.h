// The pure core of spank_dew.so: everything the plugin decides, as functions
// of plain values. No Slurm, no environment, no I/O: the SPANK edge
// (plugin.cpp) gathers the inputs, calls these, and applies the result.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dew/coordinator_port.h"
#include "dew/failure_timings.h"
#include "dew/framework_env.h"
#include "dew/gpu_binding.h"
#include "dew/result.h"
#include "dew/watchdog.h"

// Shared with the runtime (common/): hostlists, the port formula, the
// watchdog's syntax and XLA flag, GPU binding, wait statuses, hex.
namespace dew::spank {

// Settings an admin gives on the plugstack.conf line.
struct PlugstackConfig {
  PortRange port_range;
  // Where each step's framework port (MASTER_PORT, JAX_COORDINATOR_ADDRESS)
  // is derived from; never sharing a port with port_range.
  PortRange framework_port_range = kFrameworkPortRange;
  bool kill_on_bad_exit = true;
  Watchdog watchdog = kDefaultWatchdog;
  // nullopt: every task sees all of the step's GPUs on its node.
  std::optional<unsigned> devices_per_process;
};

// What the user asked for on the srun/sbatch/salloc command line.
struct PoolOptions {
  bool pool = false;
  bool multi_host = false;
  // --dew-devices-per-process: N, or off (an inner nullopt: every task sees
  // all of the step's GPUs, whatever the admin's default says).
  std::optional<DevicesPerProcess> devices_per_process;
  std::optional<std::uint16_t> port;
  std::optional<std::string> coordinator;
  std::optional<Watchdog> watchdog;
  std::optional<bool> kill_on_bad_exit;
};

// ------------------------------------------------------------ parsing ---

// The plugstack.conf arguments (`key=value` words after the plugin path).
// Unknown keys, repeated keys and bad values are errors.
Result<PlugstackConfig> parse_plugstack_args(const std::vector<std::string>& args);

// Values of the srun options; `option` names the option in error messages.
Result<unsigned> parse_devices_per_process(std::string_view text, std::string_view option);
// The srun option's: N or off.
Result<std::uint16_t> parse_port(std::string_view text, std::string_view option);
Result<PortRange> parse_port_range(std::string_view text, std::string_view option);
Result<bool> parse_yes_no(std::string_view text, std::string_view option);
Result<std::string> parse_coordinator_host(std::string_view text, std::string_view option);

// The values each srun option was given so far (option -> its text). An
// option given again with the same text is kept (srun and slurmstepd may
// pass one twice; a flag's text is always ""); with another text it is
// refused naming both (kInvalidArgument), as pyxis does, instead of the last
// one silently winning.
using SeenOptions = std::map<std::string, std::string, std::less<>>;
Result<Done> note_option(SeenOptions& seen, std::string_view option, std::string_view text);

// Options that only make sense together (checked once all are parsed).
Result<PoolOptions> check_pool_options(PoolOptions options);

// ------------------------------------------ a plugstack.conf that is bad ---

// An admin's typo on the plugstack.conf line must not stop steps that never
// asked for Dew: it is judged where the plugin first knows whether a step
// (or job) asked, and only those that did are refused.
enum class FaultSite {
  kSrun,       // srun, options parsed (init_post_opt): before anything is allocated or run
  kAllocator,  // sbatch/salloc, options parsed: before the job is submitted
  kNodeStep,   // slurmstepd, once per node and step (init_post_opt): writes reach slurmd's log only
  kNodeTask,   // slurmstepd, per task just before exec (task_init): the task's stderr reaches srun
};

enum class FaultLineTo {
  kNowhere,
  kDebug,       // slurm_debug: srun -vv, or slurmd's log at debug level
  kInfo,        // slurm_info: slurmd's log
  kError,       // slurm_error: the user's stderr in srun/sbatch/salloc, slurmd's log on a node
  kTaskStderr,  // the task's own stderr, which srun prints (slurm_error there would also log once per task)
};

struct FaultVerdict {
  bool refuse = false;  // the callback fails: the step (or job) does not run
  FaultLineTo line_to = FaultLineTo::kNowhere;
  std::string line;  // one line, without the "dew: " prefix
};

// What to do at `site` given the plugstack.conf's parse error (nullopt: it
// parsed) and the --dew-* options the step (or job) was given (none: it did
// not ask for Dew; steps Slurm runs for itself, such as a batch script, pass
// none). `first_task_on_node`: at kNodeTask, whether this is the node's local
// task 0, which alone says why, so srun shows the line once per node.
FaultVerdict judge_plugstack_fault(FaultSite site, const std::optional<Error>& config_error,
                                   const std::vector<std::string>& dew_options, bool first_task_on_node = true);

// ------------------------------------------------------ the task's env ---

// What slurmstepd knows about one task, gathered by the SPANK edge.
struct TaskFacts {
  std::uint32_t job_id = 0;
  std::uint32_t step_id = 0;
  std::uint32_t global_task = 0;
  std::uint32_t task_count = 1;
  std::uint32_t local_task = 0;
  std::uint32_t local_task_count = 1;
  std::uint32_t node_id = 0;
  std::optional<std::string> step_nodelist;    // SLURM_STEP_NODELIST
  std::optional<std::string> distribution;     // SLURM_DISTRIBUTION
  std::optional<std::string> pool_secret;      // carried from srun
  std::optional<std::string> visible_devices;  // CUDA_VISIBLE_DEVICES
  std::optional<std::string> tres_bind;        // SLURMD_TRES_BIND
  std::optional<std::string> gpus_per_task;    // SLURM_GPUS_PER_TASK
  std::optional<std::string> xla_flags;        // XLA_FLAGS
  // Process 0's node: whether its name resolves here, and else its NodeAddr,
  // looked up by srun once per step and carried to the tasks (not when
  // --dew-coordinator names the host; nullopt: Slurm gave none).
  bool rank0_name_resolves = true;
  std::optional<std::string> rank0_node_address;
};

struct EnvPlan {
  std::vector<std::pair<std::string, std::string>> set;
  std::vector<std::string> unset;
  std::vector<std::string> notes;  // for slurmd's log (debug level)
};

// Whether a step of `task_count` tasks forms a pool: one task runs alone
// unless asked (--dew-multi-host, multi_host in the design).
inline bool forms_pool(std::uint32_t task_count, const PoolOptions& options) {
  return task_count > 1 || options.multi_host;
}

// The host that runs rank 0, for distributions where that is known: the
// --dew-coordinator given, else process 0's node name where it resolves,
// else that node's NodeAddr from Slurm (NodeName and NodeAddr differ: the
// name alone reaches nothing).
Result<std::string> coordinator_host(const TaskFacts& facts, const PoolOptions& options);

// What bind_gpus is given for this task: the user's devices per process, else
// the admin's (for steps with GPUs), else an even share of the node's GPUs
// when it runs several tasks (more tasks than GPUs: kInvalidArgument); Slurm's
// own binding kept. Lines for slurmd's log go to `notes`.
Result<GpuBindingInput> task_gpu_binding(const TaskFacts& facts, const PoolOptions& options,
                                         const PlugstackConfig& config, std::vector<std::string>& notes);

// Everything a task of a pool step gets (docs/guide/srun.md, "What every task gets").
Result<EnvPlan> plan_task_environment(const TaskFacts& facts, const PoolOptions& options,
                                      const PlugstackConfig& config);

// --------------------------------------------------------- task exits ---

// How a task of a pool step ended, as kill-on-bad-exit treats it. Within a
// libdew pool the failing rank publishes its error and its peers end at once
// with kPeerFailedExitCode, often before the failing rank's own exit reaches
// its slurmstepd: a peer's 75 never names the cause.
enum class TaskEnd {
  kClean,       // exit code 0
  kFailed,      // its own failure: named, and the step is ended now
  kPeerFailed,  // 75: another rank failed; that rank's exit ends the step, or this node does after kPeerGrace
  kStepEnding,  // the step's end reaching it (SIGTERM, or SIGKILL once this node knows the step is ending)
};

// How the plugin ends a step: SIGTERM to every task, SIGKILL kStepKillGrace
// later to any that caught it. A task killed by SIGKILL before that (the OOM
// killer, kill -9) is a failure of its own and is named.
inline constexpr int kStepEndSignal = 15;  // SIGTERM
using timings::kNodeLinePause;
using timings::kSrunStepKillAfter;
using timings::kStepKillGrace;  // dew/failure_timings.h
// How long a node that saw only peers' 75s waits for the failing rank's own
// exit to end the step before ending it itself (a frozen or lost rank).
using timings::kPeerGrace;

struct TaskEndReport {
  TaskEnd kind = TaskEnd::kClean;
  // kFailed: "rank 1 ended with exit code 3; ending step 42.0 (kill-on-bad-exit)",
  // for srun's stderr; the other kinds: a line for slurmd's log.
  std::string line;
};

// `step_ending`: this node has already ended the step or seen its end.
TaskEndReport classify_task_end(int wait_status, std::uint32_t rank, std::uint32_t job_id, std::uint32_t step_id,
                                bool step_ending);

// ------------------------------------------------------ srun's watch ---

// What srun's plugin finds of its step in slurmctld at one look.
enum class StepRecord {
  kListed,   // the step still exists
  kGone,     // slurmctld has no such step (or job): it has ended
  kUnknown,  // slurmctld did not answer: nothing can be concluded
};

// srun waits for every task's exit. A node cut off when its tasks ended
// cannot send them, and its slurmstepd does not send them again once the
// link is back: srun then waits for ever for a step that Slurm has ended
// (a node that stays cut is set DOWN at SlurmdTimeout, and srun ends then).
// srun's plugin looks at the step every kSrunWatchEvery; this decides, from
// the looks so far, when srun has waited long enough for nothing.
using timings::kSrunWatchEvery;  // dew/failure_timings.h
using timings::kSrunWatchGoneLooks;

class SrunWatch {
 public:
  SrunWatch(std::uint32_t job_id, std::uint32_t step_id) : job_id_(job_id), step_id_(step_id) {}
  // After one look: the line to print as srun is ended, once the step has
  // been gone for kSrunWatchGoneLooks looks in a row; else nullopt.
  std::optional<std::string> after_look(StepRecord record);

 private:
  std::uint32_t job_id_;
  std::uint32_t step_id_;
  int gone_looks_ = 0;
};

}  // namespace dew::spank
