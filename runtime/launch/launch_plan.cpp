#include "launch_plan.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <set>

namespace dew::runtime {
namespace {

// Variables the launcher sets itself; --env may not set them.
constexpr std::string_view kPoolVariables[] = {
    "DEW_PROCESS_ID",          "DEW_PROCESS_COUNT",       "DEW_LOCAL_PROCESS_ID", "DEW_LOCAL_PROCESS_COUNT",
    "DEW_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS", "DEW_POOL_SECRET", "DEW_LINES_PREFIXED",
};

std::string range_error(const std::string& option, long long value, int low, int high) {
  return option + ": '" + std::to_string(value) + "' is not allowed; allowed: a whole number from " +
         std::to_string(low) + " to " + std::to_string(high);
}

bool plain_word_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::strchr("_@%+=:,./-", c) != nullptr;
}

std::string devices_text(int first, int count) {
  std::string out;
  for (int d = first; d < first + count; ++d) out += (out.empty() ? "" : ",") + std::to_string(d);
  return out;
}

std::string join_words(const std::vector<std::string>& words, std::string (*quote)(std::string_view)) {
  std::string out;
  for (const auto& word : words) out += (out.empty() ? "" : " ") + quote(word);
  return out;
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
      return Error{"--env: " + shown(entry) + " is not allowed; allowed: NAME=VALUE, such as --env NCCL_P2P_DISABLE=1"};
    }
    std::string name = entry.substr(0, equals);
    if (!is_shell_name(name)) {
      return Error{"--env: the name " + shown(name) + " in " + shown(entry) +
                   " is not allowed; allowed: a shell variable name (letters, digits and _, not starting with a "
                   "digit)"};
    }
    bool reserved = std::find(std::begin(kPoolVariables), std::end(kPoolVariables), name) != std::end(kPoolVariables);
    const char* why = "dew launch sets it for every process";
    if (devices_per_process && (name == "CUDA_VISIBLE_DEVICES" || name == "JAX_LOCAL_DEVICE_IDS")) {
      reserved = true;
      why = "--devices-per-process sets it";
    }
    if (private_dirs && (name == "HOME" || name == "DEW_CACHE_DIR")) {
      reserved = true;
      why = "--private-dirs sets it";
    }
    if (reserved) {
      return Error{"--env: '" + name + "' is not allowed: " + why + "; allowed: any other shell variable name"};
    }
    if (!seen.insert(name).second) {
      return Error{"--env: '" + name + "' is given twice; allowed: each name once"};
    }
    out.emplace_back(std::move(name), entry.substr(equals + 1));
  }
  return out;
}

Result<LaunchOptions> validate(LaunchOptions options) {
  if (options.command.empty()) {
    return Error{"no command: give it after --, such as: dew launch --hosts node0 node1 -- /usr/bin/python3 train.py"};
  }
  if (options.processes_per_host < 1 || options.processes_per_host > kMaxProcessesPerHost) {
    return Error{range_error("--processes-per-host", options.processes_per_host, 1, kMaxProcessesPerHost)};
  }
  if (options.devices_per_process &&
      (*options.devices_per_process < 1 || *options.devices_per_process > kMaxDevicesPerProcess)) {
    return Error{range_error("--devices-per-process", *options.devices_per_process, 1, kMaxDevicesPerProcess)};
  }
  if (options.port && (*options.port < 1 || *options.port > 65535)) {
    return Error{range_error("--port", *options.port, 1, 65535)};
  }
  if (options.hosts.size() > static_cast<std::size_t>(kMaxHosts)) {
    return Error{"--hosts: " + std::to_string(options.hosts.size()) + " hosts are not allowed; allowed: at most " +
                 std::to_string(kMaxHosts)};
  }
  std::set<std::string> seen;
  for (const auto& host : options.hosts) {
    const bool bad = host.empty() || host[0] == '-' || host.size() > 255 ||
                     std::any_of(host.begin(), host.end(), [](unsigned char c) { return c <= ' ' || c == 0x7f; });
    if (bad) {
      return Error{"--hosts: " + shown(host) +
                   " is not allowed; allowed: a host name or address as ssh takes it (no spaces or control "
                   "characters, not starting with -), or localhost"};
    }
    if (!seen.insert(host).second) {
      return Error{"--hosts: '" + host +
                   "' is listed twice; allowed: each host once (use --processes-per-host N "
                   "for several processes on one host)"};
    }
  }
  if (!options.coordinator.empty()) {
    const auto& host = options.coordinator;
    if (host[0] == '-' || std::any_of(host.begin(), host.end(), [](unsigned char c) { return c <= ' '; })) {
      return Error{"--coordinator: " + shown(host) + " is not allowed; allowed: a host name or address"};
    }
  }
  if (options.private_dirs && !options.cwd.empty()) {
    return Error{"--cwd is not allowed with --private-dirs: each process then starts in a directory of its own"};
  }
  if (options.slurm) {
    if (!options.hosts.empty()) {
      return Error{"--hosts is not allowed with --slurm: srun runs on the nodes of the allocation"};
    }
    if (options.private_dirs) {
      return Error{"--private-dirs is not allowed with --slurm: it is for rehearsals on plain machines"};
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

std::string shell_quote(std::string_view word) {
  if (!word.empty() && std::all_of(word.begin(), word.end(), [](char c) { return plain_word_char(c); })) {
    return std::string(word);
  }
  std::string out = "'";
  for (const char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string display_quote(std::string_view word) {
  const bool control = std::any_of(word.begin(), word.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
  if (!control) return shell_quote(word);
  std::string out = "$'";
  for (const char c : word) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\'':
        out += "\\'";
        break;
      default:
        if (u < 0x20 || u == 0x7f) {
          static constexpr char kDigits[] = "0123456789abcdef";
          out += "\\x";
          out += kDigits[u >> 4];
          out += kDigits[u & 15];
        } else {
          out += c;
        }
    }
  }
  return out + "'";
}

std::string shown(std::string_view value) {
  const std::string quoted = display_quote(value);
  return quoted.rfind("$'", 0) == 0 ? quoted : "'" + std::string(value) + "'";
}

std::vector<std::string> ssh_prefix(const LaunchOptions& options, const std::string& host) {
  std::vector<std::string> argv{"ssh", "-o", "BatchMode=yes"};
  if (!options.ssh_config.empty()) argv.insert(argv.end(), {"-F", options.ssh_config});
  for (const auto& option : options.ssh_options) argv.insert(argv.end(), {"-o", option});
  argv.insert(argv.end(), {"--", host});
  return argv;
}

std::string remote_script(const std::vector<EnvVar>& env, const std::string& cwd,
                          const std::vector<std::string>& make_dirs, const std::vector<std::string>& command) {
  std::string script;
  // The secret comes as the first line of stdin, never on a command line.
  script += "IFS= read -r DEW_POOL_SECRET || exit 126; export DEW_POOL_SECRET; ";
  if (!make_dirs.empty()) script += "mkdir -p -- " + join_words(make_dirs, shell_quote) + " || exit 126; ";
  script += "cd -- " + shell_quote(cwd) + " || exit 126; ";
  for (const auto& [name, value] : env) {
    if (name == "DEW_POOL_SECRET") continue;
    script += "export " + name + "=" + shell_quote(value) + "; ";
  }
  script += "exec 3<&0; setsid " + join_words(command, shell_quote) + " </dev/null & p=$!; ";
  script +=
      "{ while read -r _ <&3; do :; done; kill -TERM -$p 2>/dev/null || kill -TERM $p 2>/dev/null; sleep 1; "
      "kill -KILL -$p 2>/dev/null; } </dev/null >/dev/null 2>&1 & w=$!; ";
  script += "wait $p; s=$?; kill $w 2>/dev/null; exit $s";
  return script;
}

LaunchPlan plan_launch(const LaunchOptions& options, const std::vector<EnvVar>& env, const LaunchFacts& facts) {
  LaunchPlan plan;
  const auto hosts = effective_hosts(options);
  const int per_host = options.processes_per_host;
  const int count = static_cast<int>(hosts.size()) * per_host;
  const std::string port_text = facts.port_text.empty() ? std::to_string(facts.port) : facts.port_text;
  plan.coordinator = coordinator_address(coordinator_host(options, facts.local_hostname), port_text);
  std::string cwd = options.cwd.empty() ? facts.launcher_cwd : options.cwd;
  if (!cwd.empty() && cwd[0] != '/') cwd = facts.launcher_cwd + "/" + cwd;

  for (std::size_t h = 0; h < hosts.size(); ++h) {
    for (int local = 0; local < per_host; ++local) {
      ProcessSpec p;
      p.rank = static_cast<int>(h) * per_host + local;
      p.local_rank = local;
      p.host = hosts[h];
      p.local = hosts[h] == kLocalHost;
      p.env = {{"DEW_PROCESS_ID", std::to_string(p.rank)},
               {"DEW_PROCESS_COUNT", std::to_string(count)},
               {"DEW_LOCAL_PROCESS_ID", std::to_string(local)},
               {"DEW_LOCAL_PROCESS_COUNT", std::to_string(per_host)},
               {"DEW_COORDINATOR_ADDRESS", plan.coordinator},
               {"JAX_COORDINATOR_ADDRESS", plan.coordinator},
               {"DEW_POOL_SECRET", facts.secret},
               // The launcher puts "[rank] " before every line: libdew then
               // leaves its own prefix off.
               {"DEW_LINES_PREFIXED", "1"}};
      if (options.devices_per_process) {
        const int n = *options.devices_per_process;
        p.env.emplace_back("CUDA_VISIBLE_DEVICES", devices_text(local * n, n));
        p.env.emplace_back("JAX_LOCAL_DEVICE_IDS", devices_text(0, n));
      }
      p.cwd = cwd;
      if (options.private_dirs) {
        const std::string base = facts.private_root + "/" + std::to_string(p.rank);
        p.make_dirs = {base + "/work", base + "/home", base + "/cache"};
        p.cwd = base + "/work";
        p.env.emplace_back("HOME", base + "/home");
        p.env.emplace_back("DEW_CACHE_DIR", base + "/cache");
      }
      p.env.insert(p.env.end(), env.begin(), env.end());
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
  if (!process.local) return line + join_words(process.argv, display_quote);
  std::vector<std::string> words{"env", "-C", process.cwd};
  for (const auto& [name, value] : process.env) words.push_back(name + "=" + value);
  words.insert(words.end(), process.argv.begin(), process.argv.end());
  return line + join_words(words, display_quote);
}

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
      return Error{std::string("--devices-per-process with --slurm") + kNoPlugin +
                   "; without it JAX gives each task the one GPU at SLURM_LOCALID, so run one task per GPU "
                   "(--processes-per-host = GPUs per node) instead"};
    }
    if (options.port) return Error{std::string("--port with --slurm") + kNoPlugin};
    if (!options.coordinator.empty()) return Error{std::string("--coordinator with --slurm") + kNoPlugin};
  }
  std::vector<std::string> argv{"srun", "--ntasks-per-node=" + std::to_string(options.processes_per_host),
                                "--kill-on-bad-exit=1", "--export=ALL", "--label"};
  if (plugin) {
    argv.emplace_back("--dew-pool");
    if (options.devices_per_process) {
      argv.push_back("--dew-devices-per-process=" + std::to_string(*options.devices_per_process));
    }
    if (options.port) argv.push_back("--dew-port=" + std::to_string(*options.port));
    if (!options.coordinator.empty()) argv.push_back("--dew-coordinator=" + options.coordinator);
  }
  if (!options.cwd.empty()) argv.push_back("--chdir=" + options.cwd);
  argv.insert(argv.end(), options.command.begin(), options.command.end());
  return argv;
}

int port_candidate(unsigned random) { return kPortLow + static_cast<int>(random % (kPortHigh - kPortLow + 1)); }

std::string free_port_script() {
  return "awk -v seed=\"$(od -An -N4 -tu4 /dev/urandom)\" '"
         "function hex(s, i, n) { n = 0; for (i = 1; i <= length(s); i++) "
         "n = n * 16 + index(\"0123456789ABCDEF\", toupper(substr(s, i, 1))) - 1; return n } "
         "BEGIN { lo = " +
         std::to_string(kPortLow) + "; hi = " + std::to_string(kPortHigh) +
         "; "
         "for (f = 0; f < 2; f++) { file = f ? \"/proc/net/tcp6\" : \"/proc/net/tcp\"; "
         "while ((getline line < file) > 0) { split(line, x); n = split(x[2], y, \":\"); if (n > 1) used[hex(y[n])] = "
         "1 } } "
         "srand(seed % 2147483647); for (t = 0; t < 1000; t++) { p = lo + int(rand() * (hi - lo + 1)); "
         "if (!(p in used)) { print p; exit 0 } } exit 1 }'";
}

Result<int> parse_port_reply(std::string_view reply, const std::string& host) {
  std::string_view text = reply;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.remove_suffix(1);
  int port = 0;
  bool digits = !text.empty() && text.size() <= 5;
  for (const char c : text) {
    digits = digits && c >= '0' && c <= '9';
    if (digits) port = port * 10 + (c - '0');
  }
  if (!digits || port < 1 || port > 65535) {
    return Error{"the free-port query on " + host + " answered " + shown(text.substr(0, 200)) +
                 "; expected a port number from 1 to 65535 (give --port to skip the query)"};
  }
  return port;
}

std::string private_root_for(std::string_view id) {
  return "/tmp/dew-launch-" + std::string(id.substr(0, std::min<std::size_t>(12, id.size())));
}

std::string hex(const unsigned char* bytes, std::size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (std::size_t i = 0; i < size; ++i) {
    out += kDigits[bytes[i] >> 4];
    out += kDigits[bytes[i] & 15];
  }
  return out;
}

std::vector<std::string> LineSplitter::feed(std::string_view chunk) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < chunk.size()) {
    const std::size_t newline = chunk.find('\n', start);
    const std::size_t end = newline == std::string_view::npos ? chunk.size() : newline;
    std::size_t take = end - start;
    const std::size_t room = max_line_ - pending_.size();
    if (take >= room) {  // too long: cut here
      pending_.append(chunk.substr(start, room));
      lines.push_back(std::move(pending_));
      pending_.clear();
      start += room;
      continue;
    }
    pending_.append(chunk.substr(start, take));
    if (newline == std::string_view::npos) break;
    lines.push_back(std::move(pending_));
    pending_.clear();
    start = newline + 1;
  }
  return lines;
}

std::optional<std::string> LineSplitter::finish() {
  if (pending_.empty()) return std::nullopt;
  std::string rest = std::move(pending_);
  pending_.clear();
  return rest;
}

std::string rank_line(int rank, std::string_view line) {
  std::string out = "[" + std::to_string(rank) + "] ";
  out.reserve(out.size() + line.size() + 1);
  out.append(line);
  out += '\n';
  return out;
}

std::string relabel_srun_line(std::string_view line) {
  std::size_t i = 0;
  while (i < line.size() && line[i] == ' ') ++i;
  const std::size_t digits = i;
  while (i < line.size() && line[i] >= '0' && line[i] <= '9') ++i;
  if (i > digits && i - digits <= 9 && line.substr(i, 2) == ": ") {
    return rank_line(std::stoi(std::string(line.substr(digits, i - digits))), line.substr(i + 2));
  }
  if (i > digits && i - digits <= 9 && line.substr(i) == ":") {  // an empty labelled line
    return rank_line(std::stoi(std::string(line.substr(digits, i - digits))), "");
  }
  std::string out(line);
  out += '\n';
  return out;
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    const char* name = strsignal(signal);
    return "was killed by signal " + std::to_string(signal) + (name != nullptr ? " (" + std::string(name) + ")" : "");
  }
  return "ended with wait status " + std::to_string(status);
}

bool is_peer_failure(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == kPeerFailedCode; }

std::size_t pick_failure(const std::vector<std::pair<int, int>>& failures) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < failures.size(); ++i) {
    const auto key = [&](std::size_t k) { return std::pair(is_peer_failure(failures[k].second), failures[k].first); };
    if (key(i) < key(best)) best = i;
  }
  return best;
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace dew::runtime
