// What runs on a remote host: ssh's arguments, the script that starts a
// process there, and the query asked of a host before the launch.
#include "dew/launch_plan.h"
#include "dew/task_contract.h"
#include "dew/text.h"

namespace dew::launch {

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
  if (!make_dirs.empty()) script += "mkdir -p -- " + shell_words(make_dirs) + " || exit 126; ";
  script += "cd -- " + shell_quote(cwd) + " || exit 126; ";
  for (const auto& [name, value] : env) {
    if (name == contract::kPoolSecret.name) continue;
    script += "export " + name + "=" + shell_quote(value) + "; ";
  }
  script += "exec 3<&0; setsid " + shell_words(command) + " </dev/null & p=$!; ";
  script +=
      "{ while read -r _ <&3; do :; done; kill -TERM -$p 2>/dev/null || kill -TERM $p 2>/dev/null; sleep 1; "
      "kill -KILL -$p 2>/dev/null; } </dev/null >/dev/null 2>&1 & w=$!; ";
  script += "wait $p; s=$?; kill $w 2>/dev/null; exit $s";
  return script;
}

namespace {

// awk: used[] filled with every TCP port (v4 and v6, any state) on the host.
constexpr std::string_view kUsedPorts =
    "function hex(s, i, n) { n = 0; for (i = 1; i <= length(s); i++) "
    "n = n * 16 + index(\"0123456789ABCDEF\", toupper(substr(s, i, 1))) - 1; return n } "
    "function scan(f, file, line, x, y, n) { for (f = 0; f < 2; f++) { file = f ? \"/proc/net/tcp6\" : "
    "\"/proc/net/tcp\"; while ((getline line < file) > 0) { split(line, x); n = split(x[2], y, \":\"); "
    "if (n > 1) used[hex(y[n])] = 1 } } } "
    "function pick(label, lo, hi, t, p) { for (t = 0; t < 1000; t++) { p = lo + int(rand() * (hi - lo + 1)); "
    "if (!(p in used)) { print label \"=\" p; used[p] = 1; return 1 } } return 0 } ";

std::string range_args(PortRange range) { return std::to_string(range.low) + ", " + std::to_string(range.high); }

}  // namespace

std::string host_query_script(bool port, bool devices, int wanted_port) {
  std::string script;
  if (port) {
    const std::string want = std::to_string(wanted_port);
    // A given port: is any socket on the host using it? Otherwise a free one;
    // and always a free framework port beside it.
    const std::string dew_port = wanted_port > 0
                                     ? "if (" + want + " in used) { print \"port-busy=" + want +
                                           "\"; exit 0 } print \"port=" + want + "\"; used[" + want + "] = 1; "
                                     : "if (!pick(\"port\", " + range_args(kPortRange) + ")) exit 1; ";
    script += "awk -v seed=\"$(od -An -N4 -tu4 /dev/urandom)\" '" + std::string(kUsedPorts) +
              "BEGIN { scan(); srand(seed % 2147483647); " + dew_port + "if (!pick(\"framework-port\", " +
              range_args(kFrameworkPortRange) + ")) exit 1; exit 0 }' || exit 1; ";
  }
  if (devices) {
    script +=
        "if [ \"${CUDA_VISIBLE_DEVICES+set}\" = set ]; then echo \"visible=$CUDA_VISIBLE_DEVICES\"; "
        "else echo visible-unset; fi; "
        "n=0; for g in /proc/driver/nvidia/gpus/*; do [ -e \"$g\" ] && n=$((n + 1)); done; echo \"gpus=$n\"; ";
  }
  return script + "exit 0";
}

Result<HostAnswer> parse_host_reply(std::string_view reply, const std::string& host, bool port, bool devices) {
  const auto bad = [&](const std::string& what) {
    return invalid_argument(
        "the query on " + host + " answered " + what +
        "; expected the lines port=N, framework-port=N, visible=LIST or visible-unset, gpus=N (give --port to "
        "skip the port query)");
  };
  HostAnswer answer;
  HostDevices found;
  bool saw_visible = false;
  bool saw_gpus = false;
  for (auto line : split(reply, '\n')) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (line.rfind("port-busy=", 0) == 0) {
      return unavailable("--port " + printable(line.substr(10)) + ": the port is in use on " + host +
                         "; allowed: a port no socket uses there (or leave --port out for a free one)");
    }
    if (line.rfind("port=", 0) == 0 || line.rfind("framework-port=", 0) == 0) {
      const bool framework = line[0] == 'f';
      const auto number = parse_whole<int>(line.substr(line.find('=') + 1));
      if (!number || *number < 1 || *number > 65535) return bad(shown(line) + ", not a port from 1 to 65535");
      (framework ? answer.framework_port : answer.port) = *number;
    } else if (line == "visible-unset") {
      saw_visible = true;
    } else if (line.rfind("visible=", 0) == 0) {
      saw_visible = true;
      found.visible_devices = line.substr(8);
    } else if (line.rfind("gpus=", 0) == 0) {
      const auto number = parse_whole<unsigned>(line.substr(5));
      if (!number) return bad(shown(line) + ", not a GPU count");
      saw_gpus = true;
      found.gpu_count = *number;
    } else {
      return bad("an unexpected line " + shown(line));
    }
  }
  if (port && (!answer.port || !answer.framework_port)) return bad("no port");
  if (devices && !(saw_visible && saw_gpus)) return bad("no GPU facts");
  if (devices) answer.devices = found;
  return answer;
}

}  // namespace dew::launch
