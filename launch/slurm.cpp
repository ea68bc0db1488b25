// --slurm: srun's command and the environment the launcher hands it.
#include <algorithm>
#include <cctype>
#include <cstring>

#include "dew/failure_record.h"
#include "dew/launch_plan.h"
#include "dew/task_contract.h"
#include "dew/text.h"

namespace dew::launch {

bool srun_has_dew_pool(std::string_view srun_help) {
  std::size_t at = 0;
  while ((at = srun_help.find("--dew-pool", at)) != std::string_view::npos) {
    const std::size_t end = at + std::strlen("--dew-pool");
    const bool word_end = end == srun_help.size() || !(std::isalnum(static_cast<unsigned char>(srun_help[end])) ||
                                                       srun_help[end] == '-' || srun_help[end] == '_');
    if (word_end) return true;
    at = end;
  }
  return false;
}

Result<std::vector<std::string>> srun_command(const LaunchOptions& options, bool plugin) {
  constexpr const char* kNoPlugin = " needs Dew's SPANK plugin (srun --dew-pool), which this srun does not load";
  if (!plugin) {
    if (options.devices_per_process) {
      return unsupported(std::string("--devices-per-process with --slurm") + kNoPlugin +
                         "; without it JAX gives each task the one GPU at SLURM_LOCALID, so run one task per GPU "
                         "(--processes-per-host = GPUs per node) instead");
    }
  }
  std::vector<std::string> argv{"srun", "--ntasks-per-node=" + std::to_string(options.processes_per_host)};
  // With the plugin, its kill-on-bad-exit ends the step and names the rank
  // that failed; srun's own would SIGKILL every task first.
  if (!plugin) argv.emplace_back("--kill-on-bad-exit=1");
  argv.insert(argv.end(), {"--export=ALL", "--label"});
  if (plugin) {
    argv.emplace_back("--dew-pool");
    if (options.watchdog) {
      argv.push_back("--dew-watchdog=" +
                     (*options.watchdog ? format_duration(**options.watchdog) : std::string("off")));
    }
    if (options.devices_per_process) {
      argv.push_back("--dew-devices-per-process=" + std::to_string(*options.devices_per_process));
    } else if (options.every_device) {
      argv.emplace_back("--dew-devices-per-process=off");
    }
    if (options.port) argv.push_back("--dew-port=" + std::to_string(*options.port));
    if (!options.coordinator.empty()) argv.push_back("--dew-coordinator=" + options.coordinator);
  }
  if (!options.cwd.empty()) argv.push_back("--chdir=" + options.cwd);
  argv.insert(argv.end(), options.command.begin(), options.command.end());
  return argv;
}

std::vector<EnvVar> slurm_environment(const LaunchOptions& options, bool plugin, const std::string& secret,
                                      const std::string& notice_tag, const std::optional<std::string>& first_node,
                                      std::uint16_t drawn_port, const std::optional<std::string>& xla_flags) {
  // srun --label puts "N: " before each line, which the launcher turns into
  // "[N] ": libdew leaves its own prefix off.
  std::vector<EnvVar> env{{contract::kLinesPrefixed.name, "1"}, {kNoticeTagVariable, notice_tag}};
  if (plugin) return env;
  env.emplace_back(contract::kPoolSecret.name, secret);
  if (!options.coordinator.empty() || options.port) {
    const std::string host = !options.coordinator.empty() ? options.coordinator : first_node.value_or("localhost");
    const auto port = options.port ? static_cast<std::uint16_t>(*options.port) : drawn_port;
    env.emplace_back(contract::kCoordinatorAddress.name, host_port(host, std::to_string(port)));
  }
  std::optional<std::string> flags = xla_flags;
  bool own_bound = false;
  for (const auto& entry : options.env) {
    if (entry.rfind("XLA_FLAGS=", 0) == 0) flags = entry.substr(10);
    own_bound = own_bound || entry.rfind("DEW_WATCHDOG=", 0) == 0;
  }
  const Watchdog watchdog = options.watchdog.value_or(kDefaultWatchdog);
  if (auto merged = merge_xla_flags(flags, watchdog)) env.emplace_back("XLA_FLAGS", *merged);
  // The bound for libdew's StepWatchdog, dew worker and Python too, as the
  // plugin's --dew-watchdog and a local launch give it (before, only XLA's
  // flag: `--watchdog 2h` left them at 30 min).
  if (!own_bound) env.emplace_back(contract::kWatchdog.name, watchdog ? format_duration(*watchdog) : "off");
  return env;
}

}  // namespace dew::launch
