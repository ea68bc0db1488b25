// `dew launch`: the edge. Gathers the facts (a free port from the first
// host, each host's GPUs with --devices-per-process, a fresh secret, this
// directory), asks runtime/launch for every process's environment and
// command, starts them (local ones directly, remote ones through ssh, or all
// through srun with --slurm) and hands them to the supervisor
// (launch_supervisor.cpp), which prefixes their output lines with the rank
// and stops them all at the first failure or at Ctrl-C / SIGTERM.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "commands.h"
#include "dew/coordinator_port.h"
#include "dew/exit_status.h"
#include "dew/hex.h"
#include "dew/launch_plan.h"
#include "dew/log.h"
#include "dew/process.h"
#include "dew/text.h"
#include "launch_supervisor.h"

namespace dew::cli {
namespace {

using namespace std::chrono_literals;

// SIGTERM, then SIGKILL this long after: short, so that a failed pool is
// gone at once (a stopped process gets this long to flush and exit).
constexpr auto kGrace = 1s;
// srun gets longer: it relays the signal to every node and cancels the step.
constexpr auto kSrunGrace = 10s;
// The query asked of a remote host over ssh.
constexpr auto kQueryTimeout = 30s;

struct LaunchArgs {
  launch::LaunchOptions options;
  int processes_per_host = 1;
  int devices_per_process = 0;
  int port = 0;
  bool dry_run = false;
  std::string program;  // the command's first word; its arguments are the subcommand's remaining()
  CLI::App* app = nullptr;
  CLI::Option* devices_option = nullptr;
  CLI::Option* port_option = nullptr;
};

// What ends the launch before any process runs: a line and an exit code.
struct Stop {
  std::string line;
  int code = 1;
};

template <typename T>
using OrStop = std::variant<T, Stop>;

std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  const auto newline = t.rfind('\n');
  std::string line = newline == std::string::npos ? t : t.substr(newline + 1);
  std::erase(line, '\r');
  return line;
}

// A port free on this machine: a random one of kPortRange that binds
// (without SO_REUSEADDR, so no socket in any state uses it) and that no
// other dew launch has claimed. The TCP socket is held (close-on-exec) until
// just before rank 0 starts; the claim for the whole launch, so launches on
// one machine never draw the same port while either runs, even while rank 0
// is still starting up.
std::optional<int> hold_local_port(int& held) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    auto random = random_u32();
    if (!random.ok()) return std::nullopt;
    const int port = port_from_random(random.value(), launch::kPortRange);
    // The claim: an abstract Unix socket named after the port (Linux: no file
    // to leave behind, gone when the launcher exits).
    const int lock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un name{};
    name.sun_family = AF_UNIX;
    const std::string label = "dew-launch-port-" + std::to_string(port);
    std::memcpy(name.sun_path + 1, label.data(), label.size());  // sun_path[0] == 0: abstract
    const auto name_size = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + label.size());
    if (lock < 0 || bind(lock, reinterpret_cast<sockaddr*>(&name), name_size) != 0) {
      if (lock >= 0) close(lock);
      continue;  // another launch has it
    }
    held = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    if (held >= 0 && bind(held, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
      return port;  // the claim stays open until the launcher exits
    }
    if (held >= 0) close(held);
    if (lock >= 0) close(lock);
    held = -1;
  }
  return std::nullopt;
}

// This machine's GPUs: the launcher's CUDA_VISIBLE_DEVICES, and the GPUs the
// driver shows (one entry each in /proc/driver/nvidia/gpus).
launch::HostDevices local_devices() {
  launch::HostDevices devices;
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) devices.visible_devices = visible;
  std::error_code error;
  for (std::filesystem::directory_iterator it("/proc/driver/nvidia/gpus", error), end; !error && it != end;
       it.increment(error)) {
    ++devices.gpu_count;
  }
  return devices;
}

// The query of a remote host over ssh (host_query_script).
Result<launch::HostAnswer> ask_host(const launch::LaunchOptions& options, const std::string& host, bool port,
                                    bool devices) {
  SpawnOptions query;
  query.argv = launch::ssh_prefix(options, host);
  query.argv.push_back(launch::host_query_script(port, devices));
  auto reply = capture(query, kQueryTimeout);
  if (!reply.ok()) return reply.error();
  const auto& r = reply.value();
  if (r.timed_out || !WIFEXITED(r.wait_status) || WEXITSTATUS(r.wait_status) != 0) {
    const std::string how = r.timed_out ? "no answer in 30 s" : "ended with " + describe_wait_status(r.wait_status);
    const std::string said = last_line(r.err);
    return unavailable("cannot ask " + host + " for " + (port ? "a free port" : "its GPUs") + " over ssh (" + how +
                       (said.empty() ? "" : ": " + said) + "); " + ssh_hint(host));
  }
  return launch::parse_host_reply(r.out, host, port, devices);
}

// The port and the hosts' GPUs, asked of remote hosts in parallel.
std::optional<Stop> gather_host_facts(const LaunchArgs& args, launch::LaunchFacts& facts, int& held) {
  const launch::LaunchOptions& o = args.options;
  const auto hosts = launch::effective_hosts(o);
  const bool devices = o.devices_per_process.has_value();
  const bool ask_port = !o.port && hosts.front() != launch::kLocalHost;
  if (o.port) {
    facts.port = *o.port;
  } else if (!ask_port) {
    auto port = hold_local_port(held);
    if (!port) {
      return Stop{"cannot find a free port from " + std::to_string(launch::kPortRange.low) + " to " +
                  std::to_string(launch::kPortRange.high) + " on this machine (200 tries); give --port"};
    }
    facts.port = *port;
  }
  if (args.dry_run) {
    if (ask_port) facts.port_text = "PORT";
    if (ask_port || (devices && !launch::all_local(o))) {
      log_info("--dry-run: remote hosts are not asked; the port shows as PORT and their GPUs as indices");
    }
  }
  std::vector<std::pair<std::string, std::future<Result<launch::HostAnswer>>>> asked;
  for (const auto& host : hosts) {
    if (host == launch::kLocalHost) {
      if (devices) facts.devices[host] = local_devices();
      continue;
    }
    const bool port = ask_port && host == hosts.front();
    if (args.dry_run) {
      if (devices) facts.devices[host] = {std::nullopt, static_cast<unsigned>(o.processes_per_host * *o.devices_per_process)};
      continue;
    }
    if (port || devices) asked.emplace_back(host, std::async(std::launch::async, ask_host, o, host, port, devices));
  }
  for (auto& [host, answer] : asked) {
    auto got = answer.get();
    if (!got.ok()) return Stop{got.error().message};
    if (got.value().port) facts.port = *got.value().port;
    if (got.value().devices) facts.devices[host] = *got.value().devices;
  }
  return std::nullopt;
}

// The words after the first "--" that follows the `launch` word of this
// process's own command line (Linux: /proc/self/cmdline), if there is one.
// CLI11 takes a "--" that ends a list option (--hosts a b -- CMD) as the
// list's end, and then may read the command's first options as its own; the
// command line itself tells what the user wrote.
std::optional<std::vector<std::string>> command_after_separator() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> words;
  for (std::string word; std::getline(in, word, '\0');) words.push_back(word);
  auto launch_word = std::find(words.begin(), words.end(), "launch");
  if (launch_word == words.end()) return std::nullopt;
  auto separator = std::find(launch_word, words.end(), "--");
  if (separator == words.end()) return std::nullopt;
  return std::vector<std::string>(separator + 1, words.end());
}

std::string local_hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

std::vector<std::pair<std::string, std::optional<std::string>>> env_changes(const std::vector<launch::EnvVar>& env) {
  return {env.begin(), env.end()};
}

int run_slurm(const launch::LaunchOptions& options, const std::vector<launch::EnvVar>& env, bool dry_run) {
  SpawnOptions help_options;
  help_options.argv = {"srun", "--help"};
  auto help = capture(help_options, 30s);
  if (!help.ok() || !WIFEXITED(help.value().wait_status) || WEXITSTATUS(help.value().wait_status) != 0) {
    const std::string why = help.ok() ? "ended with " + describe_wait_status(help.value().wait_status) + ": " +
                                            last_line(help.value().err)
                                      : help.error().message;
    log_error("--slurm: `srun --help` failed (" + why + "); is Slurm's srun on PATH?");
    return 1;
  }
  auto argv = launch::srun_command(options, launch::srun_has_dew_pool(help.value().out));
  if (!argv.ok()) {
    log_error(argv.error().message);
    return 2;
  }
  if (dry_run) {
    std::vector<std::string> words;
    if (!env.empty()) words.emplace_back("env");
    for (const auto& [name, value] : env) words.push_back(name + "=" + value);
    words.insert(words.end(), argv.value().begin(), argv.value().end());
    write_all(1, "slurm: " + launch::display_words(words) + "\n");
    return 0;
  }
  Supervisor supervisor(std::chrono::duration_cast<std::chrono::milliseconds>(kSrunGrace));
  SpawnOptions srun_options;
  srun_options.argv = argv.value();
  srun_options.env = env_changes(env);
  srun_options.die_with_parent = true;
  auto srun = spawn(srun_options);
  if (!srun.ok()) {
    log_error(srun.error().message);
    return exit_code_of(127 << 8);
  }
  Running running;
  running.rank = -1;
  running.host = "srun";
  running.io = srun.value();
  supervisor.add(std::move(running));
  return supervisor.run();
}

// The options as the user gave them, checked: the plan's options and --env.
OrStop<std::vector<launch::EnvVar>> checked_options(LaunchArgs& args) {
  launch::LaunchOptions& o = args.options;
  if (auto written = command_after_separator(); written && *written != o.command) {
    return Stop{"cannot tell the command from dew launch's own options: CLI11 ended --hosts at -- and then read "
                "the command's first words as options; put another option between the last host and --, such as "
                "--hosts node0 node1 --processes-per-host 1 -- CMD",
                2};
  }
  o.processes_per_host = args.processes_per_host;
  if (args.devices_option->count() > 0) o.devices_per_process = args.devices_per_process;
  if (args.port_option->count() > 0) o.port = args.port;
  auto validated = launch::validate(o);
  if (!validated.ok()) return Stop{validated.error().message, 2};
  auto env = launch::parse_env_options(o.env, o.devices_per_process.has_value(), o.private_dirs);
  if (!env.ok()) return Stop{env.error().message, 2};
  return env.value();
}

// Starts every process, rank 0 last: the port stays held while the others
// start, and is let go just before the process that listens on it starts.
std::optional<Stop> start_all(const launch::LaunchPlan& plan, const std::string& secret, int held,
                              Supervisor& supervisor) {
  std::vector<const launch::ProcessSpec*> order;
  for (std::size_t k = 1; k < plan.processes.size(); ++k) order.push_back(&plan.processes[k]);
  order.push_back(&plan.processes.front());
  for (const launch::ProcessSpec* p : order) {
    if (p->rank == 0 && held >= 0) close(held);
    for (const auto& dir : p->local ? p->make_dirs : std::vector<std::string>{}) {
      std::error_code error;
      std::filesystem::create_directories(dir, error);
      if (error) return Stop{"--private-dirs: cannot make " + dir + ": " + error.message()};
    }
    SpawnOptions options;
    options.argv = p->argv;
    options.die_with_parent = true;
    if (p->local) {
      options.env = env_changes(p->env);
      options.cwd = p->cwd;
    } else {
      options.stdin_mode = Stdio::kPipe;  // the remote script reads the secret as its first line
    }
    auto child = spawn(options);
    if (!child.ok()) {
      return Stop{"cannot start rank " + std::to_string(p->rank) + " on " + p->host + ": " + child.error().message,
                  child.error().code == ErrorCode::kNotFound ? 127 : 126};
    }
    if (child.value().in >= 0) write_all(child.value().in, secret + "\n");
    Running running;
    running.rank = p->rank;
    running.host = p->host;
    running.remote = !p->local;
    running.io = child.value();
    supervisor.add(std::move(running));
  }
  return std::nullopt;
}

int run_launch(LaunchArgs& args) {
  const auto fail = [](const Stop& stop) {
    log_error(stop.line);
    return stop.code;
  };
  auto env = checked_options(args);
  if (auto* stop = std::get_if<Stop>(&env)) return fail(*stop);
  const launch::LaunchOptions& o = args.options;
  signal(SIGPIPE, SIG_IGN);
  if (o.slurm) return run_slurm(o, std::get<0>(env), args.dry_run);

  launch::LaunchFacts facts;
  std::error_code error;
  facts.launcher_cwd = std::filesystem::current_path(error).string();
  if (error) return fail(Stop{"cannot read the current directory: " + error.message() + " (give --cwd)"});
  facts.local_hostname = local_hostname();
  auto secret = random_hex(32);
  auto private_id = random_hex(6);
  if (!secret.ok() || !private_id.ok()) return fail(Stop{(secret.ok() ? private_id : secret).error().message});
  facts.secret = secret.value();
  if (o.private_dirs) facts.private_root = launch::private_root_for(private_id.value());
  int held = -1;
  if (auto stop = gather_host_facts(args, facts, held)) return fail(*stop);
  auto plan = launch::plan_launch(o, std::get<0>(env), facts);
  if (!plan.ok()) return fail(Stop{plan.error().message, 2});

  if (args.dry_run) {
    std::string out;
    for (const auto& p : plan.value().processes) out += launch::dry_run_line(p) + "\n";
    write_all(1, out);
    return 0;
  }
  if (!o.cwd.empty() && launch::all_local(o) &&
      !std::filesystem::is_directory(plan.value().processes.front().cwd, error)) {
    return fail(Stop{"--cwd: " + launch::shown(o.cwd) +
                         " is not a directory here; allowed: a directory that exists on every host",
                     2});
  }
  if (o.private_dirs) log_info("private directories: " + facts.private_root + "/<rank>/{work,home,cache} on each host");
  Supervisor supervisor(std::chrono::duration_cast<std::chrono::milliseconds>(kGrace));
  if (auto stop = start_all(plan.value(), facts.secret, held, supervisor)) {
    log_error(stop->line + "; stopping the other processes");
    supervisor.stop();
    supervisor.run();
    return stop->code;
  }
  return supervisor.run();
}

void add_launch_options(CLI::App* launch, LaunchArgs& args) {
  launch
      ->add_option("--hosts", args.options.hosts,
                   "Hosts in rank order, process 0's first; localhost runs without ssh (default: localhost). "
                   "Remote hosts run the command in the user's shell without a login profile: give the program "
                   "as an absolute path")
      ->type_name("HOST ...");
  launch->add_option("--processes-per-host", args.processes_per_host, "Processes on each host (1-1024; default 1)")
      ->type_name("N");
  args.devices_option =
      launch
          ->add_option("--devices-per-process", args.devices_per_process,
                       "Local process k takes the host's GPUs [kN, (k+1)N), as srun --dew-devices-per-process does: "
                       "its CUDA_VISIBLE_DEVICES (sliced from the host's own, else indices) and "
                       "JAX_LOCAL_DEVICE_IDS=0,...,N-1; too few GPUs on a host is an error giving the counts "
                       "(1-1024; default: every process sees every device)")
          ->type_name("N");
  args.port_option =
      launch
          ->add_option("--port", args.port,
                       "Coordinator port (1-65535; default: a random one from 20000-29999 that is free on the first "
                       "host when the launch starts, asked over ssh with a POSIX sh + awk query for a remote first "
                       "host)")
          ->type_name("PORT");
  launch
      ->add_option("--coordinator", args.options.coordinator,
                   "The name other hosts reach the first host by (default: the first host; this machine's "
                   "name when that is localhost and other hosts are remote)")
      ->type_name("HOST");
  launch
      ->add_option("--env", args.options.env,
                   "Set NAME=VALUE for every process (repeatable); NAME must be a shell variable name; the value "
                   "arrives byte for byte, whatever quotes, $(), ; or newlines it holds")
      ->type_name("NAME=VALUE")
      ->allow_extra_args(false);
  launch
      ->add_option("--cwd", args.options.cwd,
                   "Start every process in DIR, which must exist at that path on every host (default: the "
                   "current directory)")
      ->type_name("DIR");
  launch->add_flag("--private-dirs", args.options.private_dirs,
                   "Rehearsal: every process starts in a directory of its own, /tmp/dew-launch-<id>/<rank>/work, "
                   "with its own HOME (…/home) and DEW_CACHE_DIR (…/cache)");
  launch->add_flag("--slurm", args.options.slurm,
                   "Inside an allocation, hand the launch to srun --ntasks-per-node=N --kill-on-bad-exit=1 "
                   "--export=ALL (--env variables in srun's environment), with --dew-pool when Dew's SPANK plugin "
                   "is loaded (srun --help lists --dew-pool); --devices-per-process, --port and --coordinator "
                   "become --dew-* options and are refused without the plugin");
  launch
      ->add_option("--ssh-config", args.options.ssh_config,
                   "ssh -F FILE for every ssh the launcher runs (default: $DEW_LAUNCH_SSH_CONFIG, else ssh's own)")
      ->envname("DEW_LAUNCH_SSH_CONFIG")
      ->type_name("FILE");
  launch->add_option("--ssh-option", args.options.ssh_options, "ssh -o OPTION for every ssh (repeatable)")
      ->type_name("OPTION")
      ->allow_extra_args(false);
  launch->add_flag("--dry-run", args.dry_run,
                   "Print the exact command of every process, one per line (`RANK HOST: env -C DIR VAR=VALUE... "
                   "CMD` or the ssh command, in bash quoting), and run nothing");
}

}  // namespace

void add_launch_command(CLI::App& app) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* launch = app.add_subcommand(
      "launch",
      "Start a pool: the command after -- on every host (ssh -o BatchMode=yes; localhost directly), "
      "processes-per-host times each, with DEW_PROCESS_ID, DEW_PROCESS_COUNT, DEW_LOCAL_PROCESS_ID, "
      "DEW_LOCAL_PROCESS_COUNT, DEW_COORDINATOR_ADDRESS, JAX_COORDINATOR_ADDRESS and a fresh DEW_POOL_SECRET. "
      "Every output line starts with [rank]. When a process fails the others get SIGTERM, then SIGKILL after "
      "1 s, and dew launch exits with its code; Ctrl-C or SIGTERM stops every process, remote ones too");
  add_launch_options(launch, *args);
  // The program is one positional and everything after it is left unparsed
  // (prefix_command), so the command's own options never reach CLI11.
  launch
      ->add_option("command", args->program,
                   "The program and its arguments, after --, such as -- /opt/venv/bin/python train.py")
      ->type_name("CMD [ARGS...]");
  launch->prefix_command();
  args->app = launch;
  launch->callback([args] {
    // remaining() starts with the -- separator when it came before the
    // program (CLI11 keeps it there); after --hosts, CLI11 has taken it.
    auto rest = args->app->remaining();
    if (!rest.empty() && rest.front() == "--" && !args->program.empty()) rest.erase(rest.begin());
    args->options.command.clear();
    if (!args->program.empty()) args->options.command.push_back(args->program);
    args->options.command.insert(args->options.command.end(), rest.begin(), rest.end());
    run_subcommand("launch", [&] { return run_launch(*args); });
  });
}

}  // namespace dew::cli
