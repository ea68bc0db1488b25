// `dew launch`, the pure part: from the options and a few facts gathered by
// the edge (the port, the secret, this machine's directory) to the exact
// environment and command line of every process, the srun command of
// --slurm, and the splitting of the processes' output into whole lines.
// Nothing here starts a process or touches a file; cli/launch_command.cpp
// does that. Namespace dew::launch.
#pragma once

#include <array>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dew/coordinator_port.h"
#include "dew/framework_env.h"
#include "dew/result.h"
#include "dew/task_contract.h"
#include "dew/watchdog.h"

namespace dew::launch {

// The limits the options are checked against.
inline constexpr int kMaxProcessesPerHost = 1024;
inline constexpr int kMaxHosts = 4096;

// The host name that runs its processes directly, without ssh.
inline constexpr std::string_view kLocalHost = "localhost";

struct LaunchOptions {
  std::vector<std::string> hosts;  // empty: localhost
  int processes_per_host = 1;
  // --devices-per-process N; unset (and every_device false): the default
  // share (dew/gpu_binding.h default_share), as srun --dew-pool gives.
  std::optional<int> devices_per_process;
  bool every_device = false;  // --devices-per-process off: every process sees every GPU
  std::optional<int> port;
  std::string coordinator;       // empty: the first host
  std::vector<std::string> env;  // NAME=VALUE, as given
  std::string cwd;               // empty: the launcher's directory
  bool private_dirs = false;
  // --watchdog: the XLA execution watchdog appended to XLA_FLAGS, as srun
  // --dew-pool does (an inner nullopt: off). Not given: kDefaultWatchdog, or
  // under --slurm with the plugin the plugin's (its admin's) default.
  std::optional<Watchdog> watchdog;
  bool slurm = false;
  std::string ssh_config;                // ssh -F FILE
  std::vector<std::string> ssh_options;  // ssh -o OPTION each
  std::vector<std::string> command;
};

using EnvVar = std::pair<std::string, std::string>;

// True for a shell variable name: [A-Za-z_][A-Za-z0-9_]*.
bool is_shell_name(std::string_view name);

// What --private-dirs gives each process of its own: HOME, the caches
// (DEW_CACHE_DIR, XDG_CACHE_HOME, HF_HOME, JAX_COMPILATION_CACHE_DIR) and
// TMPDIR, all under <private_root>/<rank>/.
inline constexpr std::string_view kPrivateDirVariables[] = {"HOME",    contract::kCacheDir.name,    "XDG_CACHE_HOME",
                                                            "HF_HOME", "JAX_COMPILATION_CACHE_DIR", "TMPDIR"};

// What --dry-run shows for the pool's secret: a live secret is never printed.
inline constexpr std::string_view kSecretPlaceholder = "<64 hex digits, drawn at launch>";
// And for the launch's tag of failure records (DEW_NOTICE_TAG).
inline constexpr std::string_view kNoticeTagPlaceholder = "<16 hex digits, drawn at launch>";

// Every `--env NAME=VALUE`, split at the first '='. An entry without '=', a
// name that is not a shell variable name, a name given twice or one the
// launcher sets itself is an error naming it.
Result<std::vector<EnvVar>> parse_env_options(const std::vector<std::string>& entries, bool devices_per_process,
                                              bool private_dirs);

// Checks every option against the others and the limits; the error names
// the option, its value and what is allowed.
Result<LaunchOptions> validate(LaunchOptions options);

// The hosts to run on: the given ones, or localhost.
std::vector<std::string> effective_hosts(const LaunchOptions& options);

// True when every host is localhost (nothing goes over ssh).
bool all_local(const LaunchOptions& options);

// The host name the other processes reach process 0 at: --coordinator, else
// the first host; when that is localhost, 127.0.0.1 if every process is local
// and `local_hostname` (this machine's name) if some are remote.
std::string coordinator_host(const LaunchOptions& options, const std::string& local_hostname);

// POSIX shell quoting: the word unchanged when it holds only characters no
// shell treats specially, else in single quotes (' written as '\'').
// Byte-exact through any POSIX shell, newlines included.
std::string shell_quote(std::string_view word);

// Quoting for display on one line: shell_quote, except that a word holding a
// newline or another control character is written in bash's $'…' form.
std::string display_quote(std::string_view word);

// Words joined by spaces, each with shell_quote (for sh -c) or
// display_quote (for a line a person reads and pastes into bash).
std::string shell_words(const std::vector<std::string>& words);
std::string display_words(const std::vector<std::string>& words);

// A value inside an error message, on one line: 'value', or display_quote's
// $'…' form when it holds a newline or another control character.
std::string shown(std::string_view value);

// `ssh`'s arguments up to and including the host: BatchMode, the config
// file and options, `--`, the host.
std::vector<std::string> ssh_prefix(const LaunchOptions& options, const std::string& host);

// The remote side: POSIX sh, run as `sh -c SCRIPT` by the user's login
// shell through ssh (which must understand POSIX single quotes: bash, zsh,
// ksh, dash). It makes
// the private directories, changes to the working directory, exports the
// variables, then starts the command in its own session (setsid) with stdin
// from /dev/null and waits for it; a watcher reading the ssh channel's
// stdin ends the command's whole process group (SIGTERM, then SIGKILL one
// second later) when that stdin reaches end of file, which is what happens
// when the launcher stops it or the ssh connection drops. Exits with the
// command's status (128 + signal when it was killed).
std::string remote_script(const std::vector<EnvVar>& env, const std::string& cwd,
                          const std::vector<std::string>& make_dirs, const std::vector<std::string>& command);

struct ProcessSpec {
  int rank = 0;
  int local_rank = 0;
  std::string host;
  bool local = true;
  std::vector<EnvVar> env;  // set on top of the inherited environment
  // Removed from the inherited environment (a local process): the task
  // variables of the launcher's own launcher (LaunchFacts).
  std::vector<std::string> unset;
  std::string cwd;                     // where it starts
  std::vector<std::string> make_dirs;  // directories made before it starts (--private-dirs)
  // What the launcher executes: the command itself for a local process
  // (with `env` added and `cwd` as its directory), ssh for a remote one
  // (ending in `sh -c '<remote_script>'`).
  std::vector<std::string> argv;
};

struct LaunchPlan {
  std::string coordinator;  // host:port
  std::vector<ProcessSpec> processes;
  std::vector<std::string> notes;  // for the user, once each (GPUs left idle by the default share)
};

// What a host says about its GPUs, for its processes' share: its
// CUDA_VISIBLE_DEVICES (the launcher's own for localhost, the remote shell's
// for a remote host) and how many GPUs its driver shows.
struct HostDevices {
  std::optional<std::string> visible_devices;
  unsigned gpu_count = 0;
};

// Facts the edge gathers before planning.
struct LaunchFacts {
  int port = 0;           // the coordinator's port (--port or asked)
  std::string port_text;  // shown instead of the number when set (a dry run that asks no host)
  // The framework's coordinator port on the first host (MASTER_PORT,
  // JAX_COORDINATOR_ADDRESS): from kFrameworkPortRange, free there.
  int framework_port = 0;
  std::string framework_port_text;
  std::string secret;          // DEW_POOL_SECRET: 64 hex digits
  std::string notice_tag;      // DEW_NOTICE_TAG: the launch's tag of failure records (dew/failure_record.h)
  std::string launcher_cwd;    // the launcher's current directory
  std::string local_hostname;  // this machine's name
  std::string private_root;    // --private-dirs: each process gets private_root/<rank>/{work,home,cache,tmp}
  // XLA_FLAGS as each process would inherit it (the launcher's own), for
  // the watchdog's flag; an --env XLA_FLAGS=... stands instead.
  std::optional<std::string> xla_flags;
  // Each host's GPUs, by host name as given (none asked with --devices-per-process off).
  std::map<std::string, HostDevices> devices;
  // What a remote process gets of the launcher's own environment, which an
  // ssh command does not carry: kForwardedToRemoteHosts that are set.
  std::vector<EnvVar> forwarded;
  // The launcher's own variables that another launcher set to say who its
  // task is (dew/slurm_step.h is_task_identity_variable: inside `srun --pty
  // bash`, SLURM_PROCID=0 SLURM_NTASKS=1 ...). A local process does not
  // inherit them: what this launcher sets for it is its identity, not the
  // interactive step's (which made each process "alone, rank 0 of 1").
  std::vector<std::string> inherited_task_variables;
};

// The launcher's variables a remote process gets too (ssh carries none):
// where Python finds modules such as `import dew`, and the virtualenv the
// launch ran in (the interpreter is still given as an absolute path).
inline constexpr std::array<const char*, 2> kForwardedToRemoteHosts = {"PYTHONPATH", "VIRTUAL_ENV"};

// The environment and command of every process, rank by rank: host h's
// local process l is rank h × processes_per_host + l. With
// --devices-per-process, each process's GPUs follow the plugin's binding rule
// (dew/gpu_binding.h) over its host's devices: too few is an Error
// (kInvalidArgument) giving the counts. Expects validated options and parsed
// env.
Result<LaunchPlan> plan_launch(const LaunchOptions& options, const std::vector<EnvVar>& env, const LaunchFacts& facts);

// One line for --dry-run: `<rank> <host>: <command>`, where the command is
// `env -C DIR NAME=VALUE… CMD ARGS…` for a local process and the ssh command
// for a remote one, quoted with display_quote so that it is one line and
// pastes into bash as the same arguments.
std::string dry_run_line(const ProcessSpec& process);

// --slurm: true when `srun --help` lists our SPANK plugin's --dew-pool.
bool srun_has_dew_pool(std::string_view srun_help);

// --slurm: the srun command: srun --ntasks-per-node=N --export=ALL --label,
// with the plugin --dew-pool (and --dew-devices-per-process, --dew-port,
// --dew-coordinator, --dew-watchdog when given; the plugin ends the step when
// a task fails), without it --kill-on-bad-exit=1; --chdir with --cwd, then
// the command. --devices-per-process without the plugin is an error giving
// the reason.
Result<std::vector<std::string>> srun_command(const LaunchOptions& options, bool plugin);

// --slurm: what the launcher adds to srun's environment (never to its
// command line): DEW_LINES_PREFIXED=1 (srun's labels are the prefix),
// DEW_NOTICE_TAG=`notice_tag` (the plugin's and the pool's failure
// records), and
// without the plugin what it would have given every task: DEW_POOL_SECRET,
// XLA_FLAGS with the watchdog, and with --coordinator or --port the
// coordinator (the host defaults to `first_node`, the allocation's first
// node; the port to `drawn_port`). Without either, libdew finds the
// coordinator by the plugin's own rule (the step's first node, the port
// from its job and step ids).
std::vector<EnvVar> slurm_environment(const LaunchOptions& options, bool plugin, const std::string& secret,
                                      const std::string& notice_tag, const std::optional<std::string>& first_node,
                                      std::uint16_t drawn_port, const std::optional<std::string>& xla_flags);

// Where the coordinator's port is drawn from when --port is not given: the
// SPANK plugin's default range (dew/coordinator_port.h), outside Linux's
// ephemeral ports (32768-60999), so that no client's outgoing connection
// holds it (a client retrying a connect to a port in the ephemeral range can
// even connect to itself).
inline constexpr PortRange kPortRange{};

// POSIX sh (with awk, od and Linux's /proc) run over ssh on a remote host
// before the launch: with `port`, prints "port=P", a random TCP port from
// kPortRange that no TCP socket (v4 or v6, any state) uses, or with
// `wanted_port` (--port) "port=P" if no socket uses that one and
// "port-busy=P" if one does, and "framework-port=F", a free one from
// kFrameworkPortRange for the framework's coordinator; with `devices`, prints
// "visible=<CUDA_VISIBLE_DEVICES>" (or "visible-unset") and "gpus=<entries
// of /proc/driver/nvidia/gpus>". The remote side needs nothing but its shell.
std::string host_query_script(bool port, bool devices, int wanted_port = 0);

// What the query printed.
struct HostAnswer {
  std::optional<int> port;
  std::optional<int> framework_port;
  std::optional<HostDevices> devices;
};

// The script's reply, or an error quoting it; `port` and `devices` say what
// was asked.
Result<HostAnswer> parse_host_reply(std::string_view reply, const std::string& host, bool port, bool devices);

// The first 12 hex digits of a hash-free id: the name of a launch's private
// root, /tmp/dew-launch-<id>.
std::string private_root_for(std::string_view id);

// Splits a byte stream into whole lines (without their '\n'). A line longer
// than `max_line` bytes is cut there so memory stays bounded.
class LineSplitter {
 public:
  explicit LineSplitter(std::size_t max_line = 1 << 20) : max_line_(max_line) {}
  // The lines completed by this chunk.
  std::vector<std::string> feed(std::string_view chunk);
  // The unterminated rest at end of stream, if any.
  std::optional<std::string> finish();

 private:
  std::size_t max_line_;
  std::string pending_;
};

// "[rank] line\n": one write for one line.
std::string rank_line(int rank, std::string_view line);

// srun --label output "   3: text" as "[3] text\n"; any other line (srun's
// own messages) unchanged, with its newline.
std::string relabel_srun_line(std::string_view line);

// Which of the failures seen at one moment (rank, wait status) the launcher
// names and returns: one that is not a peer-failed exit before one that is,
// then the lowest rank. Expects at least one.
std::size_t pick_failure(const std::vector<std::pair<int, int>>& failures);

// The process the launch's failure records named as failed
// (dew/failure_record.h: a pool's peers, or the plugin's verdict under
// srun): how the launcher learns the cause when the failing process itself
// has not ended (frozen, found by its peers' heartbeats).
struct PeerBlame {
  int rank = 0;
  std::string why;
  std::optional<int> exit_code;  // its own, once a record says it (the plugin's verdict, its own record)
  std::string node;              // likewise; empty until then
};

// srun's own line about tasks that ended ("srun: error: n1: tasks 0,2-3:
// Exited with exit code 75", "...: task 1: Killed"): the tasks, and the code
// a shell would give (the exit code, or 128 + signal).
struct SrunTaskEnd {
  std::vector<int> tasks;
  int code = 0;
};
std::optional<SrunTaskEnd> srun_task_end(std::string_view line);

// What `dew launch --slurm` exits with: the named rank's own exit code as a
// record said it; else (no record had it: srun without the plugin, a rank
// that died without a word) from srun's exit code and its lines: the
// blamed rank's code, else the first task that ended with neither 0 nor
// 75; never kPeerFailedExitCode.
int slurm_exit_code(int srun_code, const std::vector<SrunTaskEnd>& ends, const std::optional<PeerBlame>& blame);

}  // namespace dew::launch
