// The environment of one task of a pool step, from the facts slurmstepd knows.
#include <sys/wait.h>

#include <csignal>

#include "dew/exit_status.h"
#include "dew/hostlist.h"
#include "dew/slurm_step.h"
#include "dew/task_contract.h"
#include "dew/text.h"
#include "pool_plan.h"

namespace dew::spank {

Result<std::string> coordinator_host(const TaskFacts& facts, const PoolOptions& options) {
  if (options.coordinator) return *options.coordinator;
  auto node = rank0_node(facts.step_nodelist, facts.distribution);
  if (!node.ok() && node.error().code != ErrorCode::kInvalidArgument) {
    return Error{node.error().code, node.error().message + "; or name the host with --dew-coordinator=HOST"};
  }
  if (!node.ok() || facts.rank0_name_resolves) return node;
  if (facts.rank0_node_address && !facts.rank0_node_address->empty()) return *facts.rank0_node_address;
  return unavailable("process 0's node '" + node.value() +
                     "' does not resolve here and Slurm gave no NodeAddr for it; name the host other nodes reach it "
                     "by with --dew-coordinator=HOST");
}

Result<GpuBindingInput> task_gpu_binding(const TaskFacts& facts, const PoolOptions& options,
                                         const PlugstackConfig& config, std::vector<std::string>& notes) {
  GpuBindingInput gpus;
  gpus.visible_devices = facts.visible_devices;
  gpus.bound_by_slurm = slurm_bound_gpus(facts.tres_bind, facts.gpus_per_task);
  gpus.local_process = facts.local_task;
  gpus.local_process_count = facts.local_task_count;
  gpus.devices_per_process = options.devices_per_process ? *options.devices_per_process : config.devices_per_process;
  // Nothing said how many: several tasks on a node share its GPUs evenly
  // instead of each seeing (and oversubscribing) all of them.
  if (!options.devices_per_process && !config.devices_per_process && !gpus.bound_by_slurm) {
    auto share = default_share(gpus);
    if (!share.ok()) return share.error().prefixed("--dew-devices-per-process is not set and ");
    gpus.devices_per_process = share.value().devices_per_process;
    if (share.value().idle_note) notes.push_back(*share.value().idle_note);
  }
  // The admin's default applies to steps with GPUs; one that asked for none
  // is left alone (the user's own value still fails it, as it should).
  const bool no_gpus = !gpus.bound_by_slurm && (!facts.visible_devices || facts.visible_devices->empty());
  if (!options.devices_per_process && config.devices_per_process && no_gpus) {
    notes.push_back("rank " + std::to_string(facts.global_task) +
                    ": the step has no GPUs on this node, so plugstack's devices_per_process=" +
                    std::to_string(*config.devices_per_process) +
                    " does not apply; CUDA_VISIBLE_DEVICES left as it is");
    gpus.devices_per_process.reset();
  }
  return gpus;
}

Result<EnvPlan> plan_task_environment(const TaskFacts& facts, const PoolOptions& options,
                                      const PlugstackConfig& config) {
  if (facts.task_count == 0 || facts.global_task >= facts.task_count || facts.local_task_count == 0 ||
      facts.local_task >= facts.local_task_count) {
    return internal_error("inconsistent task numbers from Slurm: task " + std::to_string(facts.global_task) + " of " +
                          std::to_string(facts.task_count) + ", local task " + std::to_string(facts.local_task) +
                          " of " + std::to_string(facts.local_task_count));
  }
  EnvPlan plan;
  auto set = [&plan](std::string name, std::string value) { plan.set.emplace_back(std::move(name), std::move(value)); };
  const bool pool = forms_pool(facts.task_count, options);
  set(contract::kProcessId.name, pool ? std::to_string(facts.global_task) : "0");
  set(contract::kProcessCount.name, pool ? std::to_string(facts.task_count) : "1");
  set(contract::kLocalProcessId.name, pool ? std::to_string(facts.local_task) : "0");
  set(contract::kLocalProcessCount.name, pool ? std::to_string(facts.local_task_count) : "1");
  set(contract::kNodeId.name, pool ? std::to_string(facts.node_id) : "0");
  // libdew reads SLURM_NTASKS=1 as "alone" unless told otherwise.
  if (options.multi_host) set(contract::kMultiHost.name, "1");
  std::string framework_host = "127.0.0.1";  // one task: its own machine
  std::optional<std::uint16_t> dew_port;
  if (pool) {
    auto host = coordinator_host(facts, options);
    if (!host.ok()) return host.error();
    framework_host = host.value();
    dew_port = options.port.value_or(derive_port(facts.job_id, facts.step_id, config.port_range));
    set(contract::kCoordinatorAddress.name, host_port(host.value(), std::to_string(*dew_port)));
    if (!facts.pool_secret || facts.pool_secret->empty()) {
      return unavailable(
          "no pool secret reached this task from srun; is spank_dew.so listed in the "
          "plugstack.conf that srun reads (SLURM_CONF)?");
    }
    set(contract::kPoolSecret.name, *facts.pool_secret);
  } else {
    // A coordinator inherited from the caller's environment would mislead
    // the process into waiting for peers that do not exist.
    plan.unset = {contract::kCoordinatorAddress.name, contract::kPoolSecret.name, contract::kMultiHost.name};
  }
  // The framework's own rendezvous (jax.distributed, torch's env://) gets a
  // port of its own, never Dew's: process 0 binds both.
  std::uint16_t framework_port = derive_port(facts.job_id, facts.step_id, config.framework_port_range);
  if (dew_port == framework_port) {  // a --dew-port given inside the framework range
    const PortRange r = config.framework_port_range;
    framework_port = framework_port == r.high ? r.low : static_cast<std::uint16_t>(framework_port + 1);
  }
  const FrameworkPlace place{pool ? facts.global_task : 0u,
                             pool ? facts.task_count : 1u,
                             pool ? facts.local_task : 0u,
                             pool ? facts.local_task_count : 1u,
                             pool ? facts.node_id : 0u,
                             framework_host,
                             framework_port};
  for (auto& [name, value] : framework_variables(place)) {
    set(std::move(name), std::move(value));
  }

  auto gpus = task_gpu_binding(facts, options, config, plan.notes);
  if (!gpus.ok()) return gpus.error();
  auto binding = bind_gpus(gpus.value());
  if (!binding.ok()) return binding.error();
  if (binding.value().visible_devices) set("CUDA_VISIBLE_DEVICES", *binding.value().visible_devices);
  if (binding.value().local_device_ids) set("JAX_LOCAL_DEVICE_IDS", *binding.value().local_device_ids);

  const Watchdog watchdog = options.watchdog ? *options.watchdog : config.watchdog;
  if (auto flags = merge_xla_flags(facts.xla_flags, watchdog)) set("XLA_FLAGS", *flags);
  // The same bound for libdew's StepWatchdog, dew worker and Python
  // (chosen_watchdog reads it), not only for XLA.
  set(contract::kWatchdog.name, watchdog ? format_duration(*watchdog) : "off");
  return plan;
}

TaskEndReport classify_task_end(int wait_status, std::uint32_t rank, std::uint32_t job_id, std::uint32_t step_id,
                                bool step_ending) {
  const std::string who = "rank " + std::to_string(rank);
  const std::string step = "step " + std::to_string(job_id) + "." + std::to_string(step_id);
  if (!is_bad_exit(wait_status)) return {TaskEnd::kClean, ""};
  if (is_peer_failure(wait_status)) {
    return {TaskEnd::kPeerFailed, who + " ended because another rank of its pool failed (exit code " +
                                      std::to_string(kPeerFailedExitCode) + "); the failing rank's own exit ends " +
                                      step + ", or this node does in " +
                                      seconds_text(std::chrono::duration<double>(kPeerGrace).count())};
  }
  const bool signaled = WIFSIGNALED(wait_status);
  const int signal_number = signaled ? WTERMSIG(wait_status) : 0;
  if (signaled && (signal_number == kStepEndSignal || (signal_number == SIGKILL && step_ending))) {
    return {TaskEnd::kStepEnding,
            who + " ended with " + describe_wait_status(wait_status) + ": " + step + " is ending"};
  }
  const std::string outside =
      signal_number == SIGKILL ? ", killed from outside the step (the OOM killer, kill -9)" : "";
  return {TaskEnd::kFailed, who + " ended with " + describe_wait_status(wait_status) + outside + "; ending " + step +
                                " (kill-on-bad-exit)"};
}

}  // namespace dew::spank
