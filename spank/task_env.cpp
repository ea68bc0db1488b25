// The environment of one task of a pool step, from the facts slurmstepd knows.
#include <cctype>
#include <csignal>
#include <cstring>
#include <sys/wait.h>

#include "pool_plan.h"

namespace dew::spank {
namespace {

bool sets_flag(const std::string& flags, std::string_view flag) {
  for (auto at = flags.find(flag); at != std::string::npos; at = flags.find(flag, at + 1)) {
    const bool starts_word = at == 0 || std::isspace(static_cast<unsigned char>(flags[at - 1]));
    const auto after = at + flag.size();
    const bool ends_word = after == flags.size() || flags[after] == '=' ||
                           std::isspace(static_cast<unsigned char>(flags[after]));
    if (starts_word && ends_word) return true;
  }
  return false;
}

// The distributions that put task 0 on the first node of the step's nodelist.
bool first_node_runs_rank0(const std::optional<std::string>& distribution) {
  if (!distribution || distribution->empty()) return true;  // srun's default: block
  const auto kind = distribution->substr(0, distribution->find_first_of(":,"));
  return kind == "block" || kind == "cyclic" || kind == "plane" || kind == "*";
}

std::string host_port(const std::string& host, std::uint16_t port) {
  const bool bare_ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  return (bare_ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace

std::optional<std::string> merge_xla_flags(const std::optional<std::string>& xla_flags,
                                           const Watchdog& watchdog) {
  if (!watchdog) return std::nullopt;
  const std::string flag = std::string(kXlaWatchdogFlag) + "=" + format_duration(*watchdog);
  if (!xla_flags || xla_flags->find_first_not_of(" \t\n") == std::string::npos) return flag;
  if (sets_flag(*xla_flags, kXlaWatchdogFlag)) return std::nullopt;
  return *xla_flags + " " + flag;
}

Result<std::string> coordinator_host(const TaskFacts& facts, const PoolOptions& options) {
  if (options.coordinator) return *options.coordinator;
  if (!first_node_runs_rank0(facts.distribution)) {
    return Error{"the distribution '" + facts.distribution.value_or("") +
                 "' does not tell which node runs rank 0; use block, cyclic or plane, or name the "
                 "host with --dew-coordinator=HOST"};
  }
  if (!facts.step_nodelist) {
    return Error{"SLURM_STEP_NODELIST is not set, so the node of rank 0 is unknown; name it with "
                 "--dew-coordinator=HOST"};
  }
  auto hosts = expand_hostlist(*facts.step_nodelist);
  if (!hosts.ok()) return Error{"SLURM_STEP_NODELIST: " + hosts.error().message};
  return hosts.value().front();
}

Result<EnvPlan> plan_task_environment(const TaskFacts& facts, const PoolOptions& options,
                                      const PlugstackConfig& config) {
  if (facts.task_count == 0 || facts.global_task >= facts.task_count ||
      facts.local_task_count == 0 || facts.local_task >= facts.local_task_count) {
    return Error{"inconsistent task numbers from Slurm: task " + std::to_string(facts.global_task) +
                 " of " + std::to_string(facts.task_count) + ", local task " +
                 std::to_string(facts.local_task) + " of " + std::to_string(facts.local_task_count)};
  }
  EnvPlan plan;
  auto set = [&plan](std::string name, std::string value) {
    plan.set.emplace_back(std::move(name), std::move(value));
  };
  // One task forms no pool unless asked (the seed's multi_host): it runs alone.
  const bool pool = facts.task_count > 1 || options.multi_host;
  set("DEW_PROCESS_ID", pool ? std::to_string(facts.global_task) : "0");
  set("DEW_PROCESS_COUNT", pool ? std::to_string(facts.task_count) : "1");
  set("DEW_LOCAL_PROCESS_ID", pool ? std::to_string(facts.local_task) : "0");
  set("DEW_LOCAL_PROCESS_COUNT", pool ? std::to_string(facts.local_task_count) : "1");
  set("DEW_NODE_ID", pool ? std::to_string(facts.node_id) : "0");
  if (pool) {
    auto host = coordinator_host(facts, options);
    if (!host.ok()) return host.error();
    const auto port = options.port.value_or(derive_port(facts.job_id, facts.step_id, config.port_range));
    const auto address = host_port(host.value(), port);
    set("DEW_COORDINATOR_ADDRESS", address);
    set("JAX_COORDINATOR_ADDRESS", address);
    if (!facts.pool_secret || facts.pool_secret->empty()) {
      return Error{"no pool secret reached this task from srun; is spank_dew.so listed in the "
                   "plugstack.conf that srun reads (SLURM_CONF)?"};
    }
    set("DEW_POOL_SECRET", *facts.pool_secret);
  } else {
    // A coordinator inherited from the caller's environment would mislead
    // the process into waiting for peers that do not exist.
    plan.unset = {"DEW_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS", "DEW_POOL_SECRET"};
  }

  GpuBindingInput gpus;
  gpus.visible_devices = facts.visible_devices;
  gpus.bound_by_slurm = slurm_bound_gpus(facts.tres_bind, facts.gpus_per_task);
  gpus.local_task = facts.local_task;
  gpus.local_task_count = facts.local_task_count;
  gpus.devices_per_process = options.devices_per_process ? options.devices_per_process
                                                         : config.devices_per_process;
  auto binding = bind_gpus(gpus);
  if (!binding.ok()) return binding.error();
  if (binding.value().visible_devices) set("CUDA_VISIBLE_DEVICES", *binding.value().visible_devices);
  if (binding.value().local_device_ids) set("JAX_LOCAL_DEVICE_IDS", *binding.value().local_device_ids);

  const Watchdog watchdog = options.watchdog ? *options.watchdog : config.watchdog;
  if (auto flags = merge_xla_flags(facts.xla_flags, watchdog)) set("XLA_FLAGS", *flags);
  return plan;
}

std::string describe_wait_status(int wait_status) {
  if (WIFEXITED(wait_status)) return "exit code " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int signal = WTERMSIG(wait_status);
    const char* name = sigabbrev_np(signal);
    return "signal " + std::to_string(signal) + (name ? " (SIG" + std::string(name) + ")" : "");
  }
  return "wait status " + std::to_string(wait_status);
}

bool is_bad_exit(int wait_status) {
  return !(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0);
}

std::optional<BadExitReport> report_bad_exit(int wait_status, std::uint32_t rank, std::uint32_t job_id,
                                             std::uint32_t step_id) {
  if (!is_bad_exit(wait_status)) return std::nullopt;
  BadExitReport report;
  report.line = "rank " + std::to_string(rank) + " ended with " + describe_wait_status(wait_status) +
                "; ending step " + std::to_string(job_id) + "." + std::to_string(step_id) + " (kill-on-bad-exit)";
  report.tell_srun = !(WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == SIGKILL);
  return report;
}

std::string to_hex(const unsigned char* bytes, std::size_t count) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(count * 2);
  for (std::size_t i = 0; i < count; ++i) {
    out += kDigits[bytes[i] >> 4];
    out += kDigits[bytes[i] & 0xf];
  }
  return out;
}

}  // namespace dew::spank
