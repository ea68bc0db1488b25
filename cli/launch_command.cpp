// `dew launch`: the edge. Gathers the facts (a free port from the first
// host, each host's GPUs with --devices-per-process, a fresh secret, this
// directory), asks launch/ for every process's environment and
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
#include "dew/failure_timings.h"
#include "dew/gpu_binding.h"
#include "dew/hex.h"
#include "dew/launch_plan.h"
#include "dew/log.h"
#include "dew/process.h"
#include "dew/slurm_step.h"
#include "dew/supervisor.h"
#include "dew/task_contract.h"
#include "dew/text.h"
#include "dew/watchdog.h"
#include "launch_edge.h"

namespace dew::cli {
namespace {

template <typename T>
using OrStop = std::variant<T, Stop>;

using namespace std::chrono_literals;
// SIGTERM, then SIGKILL this long after: short, so that a failed pool is
// gone at once (a stopped process gets this long to flush and exit).
constexpr auto kGrace = timings::kLaunchStopGrace;

// The names in this launcher's environment that its own launcher set to say
// who its task is (launch_plan.h LaunchFacts::inherited_task_variables).
std::vector<std::string> inherited_task_variables() {
  std::vector<std::string> names;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const auto name = text.substr(0, text.find('='));
    if (is_task_identity_variable(name)) names.emplace_back(name);
  }
  return names;
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

// The options as the user gave them, checked: the plan's options and --env.
OrStop<std::vector<launch::EnvVar>> checked_options(LaunchArgs& args) {
  launch::LaunchOptions& o = args.options;
  if (auto written = command_after_separator(); written && *written != o.command) {
    return Stop{
        "cannot tell the command from dew launch's own options: CLI11 ended --hosts at -- and then read "
        "the command's first words as options; put another option between the last host and --, such as "
        "--hosts node0 node1 --processes-per-host 1 -- CMD",
        2};
  }
  o.processes_per_host = args.processes_per_host;
  if (args.watchdog_option->count() > 0) {
    auto watchdog = parse_watchdog(args.watchdog, "--watchdog");
    if (!watchdog.ok()) return Stop{watchdog.error().message, 2};
    o.watchdog = watchdog.value();
  }
  if (args.devices_option->count() > 0) {
    auto devices = parse_devices_per_process_choice(args.devices_per_process, "--devices-per-process");
    if (!devices.ok()) return Stop{devices.error().message, 2};
    if (devices.value()) o.devices_per_process = static_cast<int>(*devices.value());
    o.every_device = !devices.value();
  }
  if (args.port_option->count() > 0) o.port = args.port;
  auto validated = launch::validate(o);
  if (!validated.ok()) return Stop{validated.error().message, 2};
  auto env = launch::parse_env_options(o.env, o.devices_per_process.has_value(), o.private_dirs);
  if (!env.ok()) return Stop{env.error().message, 2};
  return env.value();
}

// --private-dirs replaces what the launcher's own environment says of these
// (HOME always is): said once, so that nobody wonders where a cache went.
void note_private_overrides() {
  std::vector<std::string> replaced;
  for (const auto name : launch::kPrivateDirVariables) {
    if (name != "HOME" && std::getenv(std::string(name).c_str()) != nullptr) replaced.emplace_back(name);
  }
  if (!replaced.empty()) {
    log_info("--private-dirs: " + join(replaced, ", ") +
             " from this environment replaced by each process's own (under its private directory)");
  }
}

// Starts every process, rank 0 last: the ports stay held while the others
// start, and are let go just before the process that listens on them starts.
std::optional<Stop> start_all(const launch::LaunchPlan& plan, const std::string& secret, const std::vector<int>& held,
                              launch::Supervisor& supervisor) {
  std::vector<const launch::ProcessSpec*> order;
  for (std::size_t k = 1; k < plan.processes.size(); ++k) order.push_back(&plan.processes[k]);
  order.push_back(&plan.processes.front());
  for (const launch::ProcessSpec* p : order) {
    if (p->rank == 0) {
      for (const int fd : held) {
        if (fd >= 0) close(fd);
      }
    }
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
      for (const auto& name : p->unset) options.env.emplace_back(name, std::nullopt);
      options.cwd = p->cwd;
    } else {
      options.stdin_mode = Stdio::kPipe;  // the remote script reads the secret as its first line
    }
    auto child = spawn(options);
    if (!child.ok()) {
      return Stop{"cannot start rank " + std::to_string(p->rank) + " on " + p->host + ": " + child.error().message,
                  child.error().code == ErrorCode::kNotFound ? 127 : 126};
    }
    if (child.value().in >= 0) launch::write_all(child.value().in, secret + "\n");
    launch::Running running;
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
  // A dry run shows a placeholder: a live secret is never printed.
  facts.secret = args.dry_run ? std::string(launch::kSecretPlaceholder) : secret.value();
  auto tag = draw_notice_tag(args.dry_run);
  if (!tag.ok()) return fail(Stop{tag.error().message});
  facts.notice_tag = tag.value();
  if (const char* flags = std::getenv("XLA_FLAGS")) facts.xla_flags = flags;
  facts.inherited_task_variables = inherited_task_variables();
  for (const char* name : launch::kForwardedToRemoteHosts) {
    if (const char* value = std::getenv(name)) facts.forwarded.emplace_back(name, value);
  }
  if (o.private_dirs) note_private_overrides();
  if (o.private_dirs) facts.private_root = launch::private_root_for(private_id.value());
  std::vector<int> held;
  if (auto stop = gather_host_facts(args, facts, held)) return fail(*stop);
  auto plan = launch::plan_launch(o, std::get<0>(env), facts);
  if (!plan.ok()) return fail(Stop{plan.error().message, 2});
  for (const auto& note : plan.value().notes) log_info("dew launch: " + note);

  if (args.dry_run) {
    std::string out;
    for (const auto& p : plan.value().processes) out += launch::dry_run_line(p) + "\n";
    launch::write_all(1, out);
    return 0;
  }
  if (!o.cwd.empty() && launch::all_local(o) &&
      !std::filesystem::is_directory(plan.value().processes.front().cwd, error)) {
    return fail(Stop{
        "--cwd: " + launch::shown(o.cwd) + " is not a directory here; allowed: a directory that exists on every host",
        2});
  }
  if (o.private_dirs) log_info("private directories: " + facts.private_root + "/<rank>/{work,home,cache} on each host");
  launch::Supervisor supervisor(std::chrono::duration_cast<std::chrono::milliseconds>(kGrace), facts.notice_tag);
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
                       "(1-1024). Default, as under srun --dew-pool: several processes on a host share its GPUs "
                       "evenly (more processes than GPUs is an error), one keeps them all; off: every process sees "
                       "every GPU; an --env CUDA_VISIBLE_DEVICES or JAX_LOCAL_DEVICE_IDS of your own stands")
          ->type_name("N|off");
  args.port_option =
      launch
          ->add_option("--port", args.port,
                       "Coordinator port (1024-65535; default: a random one from 20000-29999 that is free on the first "
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
                   "with its own HOME (…/home), DEW_CACHE_DIR and XDG_CACHE_HOME (…/cache), HF_HOME "
                   "(…/cache/huggingface), JAX_COMPILATION_CACHE_DIR (…/cache/jax) and TMPDIR (…/tmp), "
                   "replacing the values in this environment");
  args.watchdog_option =
      launch
          ->add_option("--watchdog", args.watchdog,
                       "XLA execution watchdog appended to every process's XLA_FLAGS (" +
                           std::string(kXlaWatchdogFlag) +
                           "), as srun --dew-watchdog does: a duration such as 30m, 1h30m or 90s, or off; a value "
                           "already in XLA_FLAGS stands (default: 30m; under --slurm with the plugin, its default)")
          ->type_name("DURATION|off");
  launch->add_flag("--slurm", args.options.slurm,
                   "Inside an allocation, hand the launch to srun --ntasks-per-node=N --export=ALL --label "
                   "(--env variables in srun's environment): with --dew-pool when Dew's SPANK plugin is loaded "
                   "(srun --help lists --dew-pool; --devices-per-process, --port, --coordinator and --watchdog "
                   "become --dew-* options); without it with --kill-on-bad-exit=1, and the launcher gives srun's "
                   "environment the pool's secret, the watchdog and, with --coordinator or --port, the "
                   "coordinator (--devices-per-process N needs the plugin)");
  launch
      ->add_option("--ssh-config", args.options.ssh_config,
                   "ssh -F FILE for every ssh the launcher runs (default: $DEW_LAUNCH_SSH_CONFIG, else ssh's own)")
      ->envname(contract::kLaunchSshConfig.name)
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
      "DEW_LOCAL_PROCESS_COUNT, DEW_COORDINATOR_ADDRESS, a fresh DEW_POOL_SECRET, and torchrun's RANK, WORLD_SIZE, "
      "LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT with JAX_COORDINATOR_ADDRESS (the "
      "framework's coordinator: a second free port on the first host). "
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
    if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
    args->options.command.clear();
    if (!args->program.empty()) args->options.command.push_back(args->program);
    args->options.command.insert(args->options.command.end(), rest.begin(), rest.end());
    run_subcommand("launch", [&] { return run_launch(*args); });
  });
}

}  // namespace dew::cli
