// The pure core of spank_dew.so: everything the plugin decides, as functions
// of plain values. No Slurm, no environment, no I/O: the SPANK edge
// (plugin.cpp) gathers the inputs, calls these, and applies the result.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dew/result.h"

namespace dew::spank {

using dew::Error;
using dew::Result;

// ---------------------------------------------------------------- values ---

struct PortRange {
  std::uint16_t low = 20000;
  std::uint16_t high = 29999;
  friend bool operator==(const PortRange&, const PortRange&) = default;
};

// A watchdog duration in whole seconds; nullopt means "off".
using Watchdog = std::optional<std::chrono::seconds>;

// Settings an admin gives on the plugstack.conf line.
struct PlugstackConfig {
  PortRange port_range;
  bool kill_on_bad_exit = true;
  Watchdog watchdog = std::chrono::minutes(30);
  // nullopt: every task sees all of the step's GPUs on its node.
  std::optional<unsigned> devices_per_process;
};

// What the user asked for on the srun/sbatch/salloc command line.
struct PoolOptions {
  bool pool = false;
  bool multi_host = false;
  std::optional<unsigned> devices_per_process;
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
Result<std::uint16_t> parse_port(std::string_view text, std::string_view option);
Result<PortRange> parse_port_range(std::string_view text, std::string_view option);
Result<Watchdog> parse_watchdog(std::string_view text, std::string_view option);
Result<bool> parse_yes_no(std::string_view text, std::string_view option);
Result<std::string> parse_coordinator_host(std::string_view text, std::string_view option);

// "30m", "1h30m", "90s": the form XLA's duration flags accept.
std::string format_duration(std::chrono::seconds duration);

// Options that only make sense together (checked once all are parsed).
Result<PoolOptions> check_pool_options(PoolOptions options);

// ----------------------------------------------------------- hostlist ---

// Slurm hostlist expansion: "n[1-3,7]", "gpu[01-10]", "r[1-2]-n[1-2]",
// "a,b[1-2],c". At most `max_hosts` names (an error beyond, so a hostile
// range cannot exhaust memory).
Result<std::vector<std::string>> expand_hostlist(std::string_view hostlist,
                                                 std::size_t max_hosts = 1u << 16);

// ---------------------------------------------------------------- port ---

// The coordinator port of a step: see docs/design/spank.md for the formula.
// Steps of one job get consecutive ports (mod the range), so up to
// (high - low + 1) steps of a job running at once never share one.
std::uint16_t derive_port(std::uint32_t job_id, std::uint32_t step_id, PortRange range);

// --------------------------------------------------------- GPU binding ---

struct GpuBindingInput {
  // The step's CUDA_VISIBLE_DEVICES on this node as Slurm set it; nullopt when
  // unset. Tokens (indices or UUIDs) are opaque.
  std::optional<std::string> visible_devices;
  // Slurm bound GPUs per task itself (--gpus-per-task, --gpu-bind).
  bool bound_by_slurm = false;
  unsigned local_task = 0;
  unsigned local_task_count = 1;
  std::optional<unsigned> devices_per_process;
};

struct GpuBinding {
  // The task's CUDA_VISIBLE_DEVICES; nullopt: leave it as it is.
  std::optional<std::string> visible_devices;
  // JAX_LOCAL_DEVICE_IDS; nullopt when the task has no GPUs.
  std::optional<std::string> local_device_ids;
};

Result<GpuBinding> bind_gpus(const GpuBindingInput& input);

// Whether Slurm has already bound GPUs per task, from SLURMD_TRES_BIND and
// SLURM_GPUS_PER_TASK as slurmstepd passes them to the task.
bool slurm_bound_gpus(const std::optional<std::string>& tres_bind,
                      const std::optional<std::string>& gpus_per_task);

// ----------------------------------------------------------- XLA flags ---

inline constexpr std::string_view kXlaWatchdogFlag = "--xla_gpu_execution_terminate_timeout";

// XLA_FLAGS with the watchdog appended, unless the flags already set it or
// the watchdog is off (then nullopt: leave XLA_FLAGS untouched).
std::optional<std::string> merge_xla_flags(const std::optional<std::string>& xla_flags,
                                           const Watchdog& watchdog);

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
};

struct EnvPlan {
  std::vector<std::pair<std::string, std::string>> set;
  std::vector<std::string> unset;
};

// The host that runs rank 0, for distributions where that is known.
Result<std::string> coordinator_host(const TaskFacts& facts, const PoolOptions& options);

// Everything a task of a pool step gets (see README: "What a task gets").
Result<EnvPlan> plan_task_environment(const TaskFacts& facts, const PoolOptions& options,
                                      const PlugstackConfig& config);

// --------------------------------------------------------- task exits ---

// A raw wait status (S_TASK_EXIT_STATUS): "exit code 3", "signal 11 (SIGSEGV)".
std::string describe_wait_status(int wait_status);
bool is_bad_exit(int wait_status);

// What kill-on-bad-exit says when a task ends badly.
struct BadExitReport {
  std::string line;  // "rank 1 ended with exit code 3; ending step 42.0 (kill-on-bad-exit)"
  // False for SIGKILL, most often our own kill arriving from another node:
  // srun's stderr keeps the one line about the rank that failed first.
  bool tell_srun = true;
};

// nullopt for a clean exit (code 0).
std::optional<BadExitReport> report_bad_exit(int wait_status, std::uint32_t rank, std::uint32_t job_id,
                                             std::uint32_t step_id);

// ------------------------------------------------------------- secret ---

// Hex encoding of random bytes: the pool secret's text form.
std::string to_hex(const unsigned char* bytes, std::size_t count);

}  // namespace dew::spank
