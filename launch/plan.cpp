// dew launch's plan: the options checked, every process's environment and
// command line, --dry-run's lines, and srun's command for --slurm.
#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <set>

#include "dew/failure_record.h"
#include "dew/gpu_binding.h"
#include "dew/launch_plan.h"
#include "dew/task_contract.h"
#include "dew/text.h"

namespace dew::launch {
namespace {

// A name other hosts can resolve or an address: an IPv6 one bare or in
// brackets ("::1", "[::1]"), an IPv4 one, or DNS labels. Not a host:port
// (the port is --port), nothing half-bracketed, no empty label.
bool is_host_name_or_address(std::string_view host) {
  std::string text(host);
  if (text.size() > 2 && text.front() == '[' && text.back() == ']') text = text.substr(1, text.size() - 2);
  in6_addr v6{};
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) return true;
  if (text.size() != host.size()) return false;  // only an IPv6 address goes in brackets
  if (text.empty() || text.size() > 253) return false;
  for (const auto& label : split(text, '.')) {
    if (label.empty() || label.size() > 63 || label.front() == '-') return false;
    for (unsigned char c : label) {
      if (!std::isalnum(c) && c != '-' && c != '_') return false;
    }
  }
  return true;
}

// Variables the launcher sets itself; --env may not set them.
constexpr std::string_view kPoolVariables[] = {
    contract::kProcessId.name,         contract::kProcessCount.name,       contract::kLocalProcessId.name,
    contract::kLocalProcessCount.name, contract::kCoordinatorAddress.name, contract::kPoolSecret.name,
    contract::kLinesPrefixed.name,
};  // and kFrameworkVariableNames

Error range_error(const std::string& option, long long value, int low, int high) {
  return not_allowed(option, std::to_string(value),
                     "a whole number from " + std::to_string(low) + " to " + std::to_string(high));
}

// The plugin's rule over one host's GPUs: --devices-per-process N, else
// (unless off) the default share; the user's own --env CUDA_VISIBLE_DEVICES
// or JAX_LOCAL_DEVICE_IDS without --devices-per-process stands instead.
Result<GpuBinding> bind_host_gpus(const LaunchOptions& options, const std::vector<EnvVar>& env,
                                  const LaunchFacts& facts, const std::string& host, int local,
                                  std::vector<std::string>& notes) {
  const auto user_names_gpus = std::any_of(env.begin(), env.end(), [](const EnvVar& v) {
    return v.first == "CUDA_VISIBLE_DEVICES" || v.first == "JAX_LOCAL_DEVICE_IDS";
  });
  if (!options.devices_per_process && user_names_gpus) return GpuBinding{};
  const auto found = facts.devices.find(host);
  const HostDevices devices = found == facts.devices.end() ? HostDevices{} : found->second;
  GpuBindingInput input;
  input.visible_devices = devices.visible_devices;
  input.gpu_count = devices.gpu_count;
  input.local_process = static_cast<unsigned>(local);
  input.local_process_count = static_cast<unsigned>(options.processes_per_host);
  input.place = host == kLocalHost ? "this machine" : "host " + host;
  if (options.devices_per_process) {
    input.devices_per_process = static_cast<unsigned>(*options.devices_per_process);
  } else if (!options.every_device) {
    auto share = default_share(input);
    if (!share.ok()) return share.error().prefixed("--devices-per-process is not set and ");
    input.devices_per_process = share.value().devices_per_process;
    if (share.value().idle_note) notes.push_back(*share.value().idle_note);
  }
  auto binding = bind_gpus(input);
  if (!binding.ok()) return binding.error().prefixed("--devices-per-process: ");
  return binding;
}

// --private-dirs: the process starts in its own work directory with its own
// HOME, caches and TMPDIR.
void add_private_dirs(ProcessSpec& p, const std::string& base) {
  p.make_dirs = {base + "/work",      base + "/home", base + "/cache", base + "/cache/huggingface",
                 base + "/cache/jax", base + "/tmp"};
  p.cwd = base + "/work";
  p.env.insert(p.env.end(), {{"HOME", base + "/home"},
                             {contract::kCacheDir.name, base + "/cache"},
                             {"XDG_CACHE_HOME", base + "/cache"},
                             {"HF_HOME", base + "/cache/huggingface"},
                             {"JAX_COMPILATION_CACHE_DIR", base + "/cache/jax"},
                             {"TMPDIR", base + "/tmp"}});
}

// The user's --env values, with the watchdog's flag added to XLA_FLAGS (the
// user's own XLA_FLAGS kept, and its own watchdog value too), and the bound
// as DEW_WATCHDOG for libdew and Python (unless --env gives one).
void add_user_env(ProcessSpec& p, const std::vector<EnvVar>& env, const Watchdog& watchdog,
                  const std::optional<std::string>& inherited_xla_flags) {
  std::optional<std::string> xla_flags = inherited_xla_flags;
  bool own_bound = false;
  for (const auto& [name, value] : env) {
    own_bound = own_bound || name == contract::kWatchdog.name;
    if (name == "XLA_FLAGS") {
      xla_flags = value;
    } else {
      p.env.emplace_back(name, value);
    }
  }
  if (auto merged = merge_xla_flags(xla_flags, watchdog)) {
    p.env.emplace_back("XLA_FLAGS", *merged);
  } else if (xla_flags && xla_flags != inherited_xla_flags) {
    p.env.emplace_back("XLA_FLAGS", *xla_flags);
  }
  if (!own_bound) p.env.emplace_back(contract::kWatchdog.name, watchdog ? format_duration(*watchdog) : "off");
}

// A remote process gets the launcher's forwarded variables, unless --env
// gives them (a local one inherits them anyway).
void add_forwarded(ProcessSpec& p, const std::vector<EnvVar>& env, const std::vector<EnvVar>& forwarded) {
  for (const EnvVar& variable : forwarded) {
    const bool given = std::any_of(env.begin(), env.end(), [&](const EnvVar& v) { return v.first == variable.first; });
    if (!given) p.env.push_back(variable);
  }
}

}  // namespace

bool is_shell_name(std::string_view name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

Result<std::vector<EnvVar>> parse_env_options(const std::vector<std::string>& entries, bool devices_per_process,
                                              bool private_dirs) {
  std::vector<EnvVar> out;
  std::set<std::string> seen;
  for (const auto& entry : entries) {
    const auto equals = entry.find('=');
    if (equals == std::string::npos) {
      return invalid_argument("--env: " + shown(entry) +
                              " is not allowed; allowed: NAME=VALUE, such as --env NCCL_P2P_DISABLE=1");
    }
    std::string name = entry.substr(0, equals);
    if (!is_shell_name(name)) {
      return invalid_argument(
          "--env: the name " + shown(name) + " in " + shown(entry) +
          " is not allowed; allowed: a shell variable name (letters, digits and _, not starting with a "
          "digit)");
    }
    bool reserved = std::find(std::begin(kPoolVariables), std::end(kPoolVariables), name) != std::end(kPoolVariables) ||
                    std::find(std::begin(kFrameworkVariableNames), std::end(kFrameworkVariableNames), name) !=
                        std::end(kFrameworkVariableNames);
    const char* why = "dew launch sets it for every process";
    if (devices_per_process && (name == "CUDA_VISIBLE_DEVICES" || name == "JAX_LOCAL_DEVICE_IDS")) {
      reserved = true;
      why = "--devices-per-process sets it";
    }
    if (private_dirs && std::find(std::begin(kPrivateDirVariables), std::end(kPrivateDirVariables), name) !=
                            std::end(kPrivateDirVariables)) {
      reserved = true;
      why = "--private-dirs sets it";
    }
    if (reserved) {
      return invalid_argument("--env: '" + name + "' is not allowed: " + why +
                              "; allowed: any other shell variable name");
    }
    if (!seen.insert(name).second) {
      return invalid_argument("--env: '" + name + "' is given twice; allowed: each name once");
    }
    out.emplace_back(std::move(name), entry.substr(equals + 1));
  }
  return out;
}

Result<LaunchOptions> validate(LaunchOptions options) {
  if (options.command.empty()) {
    return invalid_argument(
        "no command: give it after --, such as: dew launch --hosts node0 node1 -- /usr/bin/python3 train.py");
  }
  if (options.processes_per_host < 1 || options.processes_per_host > kMaxProcessesPerHost) {
    return range_error("--processes-per-host", options.processes_per_host, 1, kMaxProcessesPerHost);
  }
  constexpr int kMaxDevices = static_cast<int>(kMaxDevicesPerProcess);
  if (options.devices_per_process && (*options.devices_per_process < 1 || *options.devices_per_process > kMaxDevices)) {
    return range_error("--devices-per-process", *options.devices_per_process, 1, kMaxDevices);
  }
  if (options.devices_per_process && options.every_device) {
    return invalid_argument("--devices-per-process: a number and off at once; allowed: one of them");
  }
  if (options.port && (*options.port < kLowestPort || *options.port > 65535)) {
    return range_error("--port", *options.port, kLowestPort, 65535);
  }
  if (options.hosts.size() > static_cast<std::size_t>(kMaxHosts)) {
    return invalid_argument("--hosts: " + std::to_string(options.hosts.size()) +
                            " hosts are not allowed; allowed: at most " + std::to_string(kMaxHosts));
  }
  std::set<std::string> seen;
  for (const auto& host : options.hosts) {
    // ssh's [user@]host: neither part empty (issue 26: "@host" reached ssh,
    // whose usage text was all the user saw).
    const auto at = host.rfind('@');
    const bool empty_part = at != std::string::npos && (at == 0 || at + 1 == host.size());
    const bool bad = host.empty() || host[0] == '-' || host.size() > 255 || empty_part ||
                     std::any_of(host.begin(), host.end(), [](unsigned char c) { return c <= ' ' || c == 0x7f; });
    if (bad) {
      return invalid_argument("--hosts: " + shown(host) +
                              " is not allowed; allowed: a host name or address as ssh takes it, [user@]host with "
                              "neither part empty (no spaces or control characters, not starting with -), or "
                              "localhost");
    }
    if (!seen.insert(host).second) {
      return invalid_argument("--hosts: '" + host +
                              "' is listed twice; allowed: each host once (use --processes-per-host N "
                              "for several processes on one host)");
    }
  }
  if (!options.coordinator.empty() && !is_host_name_or_address(options.coordinator)) {
    return invalid_argument("--coordinator: " + shown(options.coordinator) +
                            " is not allowed; allowed: a host name (letters, digits, '-', '_' and dots) or an IPv4 "
                            "or IPv6 address, without a port (that is --port)");
  }
  if (options.private_dirs && !options.cwd.empty()) {
    return invalid_argument(
        "--cwd is not allowed with --private-dirs: each process then starts in a directory of its own");
  }
  if (options.slurm) {
    if (!options.hosts.empty()) {
      return invalid_argument("--hosts is not allowed with --slurm: srun runs on the nodes of the allocation");
    }
    if (options.private_dirs) {
      return invalid_argument("--private-dirs is not allowed with --slurm: it is for rehearsals on plain machines");
    }
  }
  return options;
}

std::vector<std::string> effective_hosts(const LaunchOptions& options) {
  if (options.hosts.empty()) return {std::string(kLocalHost)};
  return options.hosts;
}

bool all_local(const LaunchOptions& options) {
  const auto hosts = effective_hosts(options);
  return std::all_of(hosts.begin(), hosts.end(), [](const std::string& h) { return h == kLocalHost; });
}

std::string coordinator_host(const LaunchOptions& options, const std::string& local_hostname) {
  if (!options.coordinator.empty()) return options.coordinator;
  std::string first = effective_hosts(options).front();
  if (first == kLocalHost) return all_local(options) ? "127.0.0.1" : local_hostname;
  // ssh's user@host: the host part.
  if (const auto at = first.rfind('@'); at != std::string::npos) first = first.substr(at + 1);
  return first;
}

std::string coordinator_address(const std::string& host, const std::string& port) {
  const bool ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  return (ipv6 ? "[" + host + "]" : host) + ":" + port;
}

Result<LaunchPlan> plan_launch(const LaunchOptions& options, const std::vector<EnvVar>& env, const LaunchFacts& facts) {
  LaunchPlan plan;
  const auto hosts = effective_hosts(options);
  const int per_host = options.processes_per_host;
  const int count = static_cast<int>(hosts.size()) * per_host;
  const std::string port_text = facts.port_text.empty() ? std::to_string(facts.port) : facts.port_text;
  const std::string host = coordinator_host(options, facts.local_hostname);
  plan.coordinator = host_port(host, port_text);
  const std::string framework_port =
      facts.framework_port_text.empty() ? std::to_string(facts.framework_port) : facts.framework_port_text;
  std::string cwd = options.cwd.empty() ? facts.launcher_cwd : options.cwd;
  if (!cwd.empty() && cwd[0] != '/') cwd = facts.launcher_cwd + "/" + cwd;

  for (std::size_t h = 0; h < hosts.size(); ++h) {
    for (int local = 0; local < per_host; ++local) {
      ProcessSpec p;
      p.rank = static_cast<int>(h) * per_host + local;
      p.local_rank = local;
      p.host = hosts[h];
      p.local = hosts[h] == kLocalHost;
      p.env = {{contract::kProcessId.name, std::to_string(p.rank)},
               {contract::kProcessCount.name, std::to_string(count)},
               {contract::kLocalProcessId.name, std::to_string(local)},
               {contract::kLocalProcessCount.name, std::to_string(per_host)},
               {contract::kCoordinatorAddress.name, plan.coordinator},
               {contract::kPoolSecret.name, facts.secret},
               // The launcher puts "[rank] " before every line: libdew then
               // leaves its own prefix off.
               {contract::kLinesPrefixed.name, "1"},
               // The records of failures the launcher decides blame from.
               {kNoticeTagVariable, facts.notice_tag}};
      // torchrun's contract and JAX's address, at a port of their own.
      const FrameworkPlace place{static_cast<std::uint32_t>(p.rank),
                                 static_cast<std::uint32_t>(count),
                                 static_cast<std::uint32_t>(local),
                                 static_cast<std::uint32_t>(per_host),
                                 static_cast<std::uint32_t>(h),
                                 host,
                                 0};
      for (auto& variable : framework_variables(place)) {
        if (variable.first == "MASTER_PORT") variable.second = framework_port;
        if (variable.first == "JAX_COORDINATOR_ADDRESS" || variable.first == contract::kFrameworkCoordinator.name) {
          variable.second = host_port(host, framework_port);
        }
        p.env.push_back(std::move(variable));
      }
      {
        auto binding = bind_host_gpus(options, env, facts, p.host, local, plan.notes);
        if (!binding.ok()) return binding.error();
        if (binding.value().visible_devices)
          p.env.emplace_back("CUDA_VISIBLE_DEVICES", *binding.value().visible_devices);
        if (binding.value().local_device_ids)
          p.env.emplace_back("JAX_LOCAL_DEVICE_IDS", *binding.value().local_device_ids);
      }
      p.cwd = cwd;
      if (options.private_dirs) add_private_dirs(p, facts.private_root + "/" + std::to_string(p.rank));
      add_user_env(p, env, options.watchdog.value_or(kDefaultWatchdog), facts.xla_flags);
      if (!p.local) add_forwarded(p, env, facts.forwarded);
      if (p.local) p.unset = facts.inherited_task_variables;
      if (p.local) {
        p.argv = options.command;
      } else {
        p.argv = ssh_prefix(options, p.host);
        // Run by sh whatever the user's login shell is (bash, zsh, ksh, dash).
        p.argv.push_back("sh -c " + shell_quote(remote_script(p.env, p.cwd, p.make_dirs, options.command)));
      }
      plan.processes.push_back(std::move(p));
    }
  }
  return plan;
}

std::string dry_run_line(const ProcessSpec& process) {
  std::string line = std::to_string(process.rank) + " " + process.host + ": ";
  if (!process.local) return line + display_words(process.argv);
  std::vector<std::string> words{"env"};
  for (const auto& name : process.unset) words.insert(words.end(), {"-u", name});
  words.insert(words.end(), {"-C", process.cwd});
  for (const auto& [name, value] : process.env) words.push_back(name + "=" + value);
  words.insert(words.end(), process.argv.begin(), process.argv.end());
  return line + display_words(words);
}

std::string private_root_for(std::string_view id) {
  return "/tmp/dew-launch-" + std::string(id.substr(0, std::min<std::size_t>(12, id.size())));
}

}  // namespace dew::launch
