// `dew launch`: the edge. Gathers the facts (a free port from the first
// host, a fresh secret, this directory), asks runtime/launch/launch_plan.h
// for every process's environment and command, starts them (local ones
// directly, remote ones through ssh, or all through srun with --slurm),
// prefixes their output lines with the rank, and stops them all at the first
// failure or at Ctrl-C / SIGTERM.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "launch_plan.h"

extern char** environ;

namespace dew::cli {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace rt = dew::runtime;

// SIGTERM, then SIGKILL this long after: short, so that a failed pool is
// gone at once (a stopped process gets this long to flush and exit).
constexpr auto kGrace = 1s;
// srun gets longer: it relays the signal to every node and cancels the step.
constexpr auto kSrunGrace = 10s;
// After the last process has ended, output still in flight (from children
// it left behind holding its pipes) is read for at most this long.
constexpr auto kDrain = 1s;
// The free-port query over ssh.
constexpr auto kQueryTimeout = 30s;
// How long a pool's "a peer failed" exit waits for the failure it reports.
constexpr auto kSettle = 200ms;

struct LaunchArgs {
  rt::LaunchOptions options;
  int processes_per_host = 1;
  int devices_per_process = 0;
  int port = 0;
  bool dry_run = false;
  std::string program;  // the command's first word; its arguments are the subcommand's remaining()
  CLI::App* app = nullptr;
  CLI::Option* devices_option = nullptr;
  CLI::Option* port_option = nullptr;
};

[[noreturn]] void finish(int code) {
  std::cout.flush();
  std::cerr.flush();
  std::exit(code);
}

// One whole line on a stream with a single write().
void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed terminal or pipe: the output is lost, the launch goes on
    done += static_cast<std::size_t>(n);
  }
}

void say(const std::string& message) { write_all(2, "dew launch: " + message + "\n"); }

std::string random_hex(std::size_t bytes) {
  std::vector<unsigned char> buffer(bytes);
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n = getrandom(buffer.data() + got, bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      say(std::string("getrandom failed: ") + std::strerror(errno));
      finish(1);
    }
    got += static_cast<std::size_t>(n);
  }
  return rt::hex(buffer.data(), bytes);
}

// The environment for a child: ours with `overrides` set on top.
std::vector<std::string> child_environment(const std::vector<rt::EnvVar>& overrides) {
  std::map<std::string, std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text(*entry);
    const auto equals = text.find('=');
    if (equals != std::string::npos) env[text.substr(0, equals)] = text.substr(equals + 1);
  }
  for (const auto& [name, value] : overrides) env[name] = value;
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [name, value] : env) out.push_back(name + "=" + value);
  return out;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

struct Spawned {
  pid_t pid = -1;
  int out = -1;
  int err = -1;
  int in = -1;  // the write end of the child's stdin, when it has one
};

// Starts argv in a process group of its own, stdout and stderr into pipes;
// stdin from /dev/null or, with `stdin_pipe`, from a pipe we hold. The child
// gets SIGTERM when the launcher dies, and default signal handling.
Spawned spawn(const std::vector<std::string>& argv, const std::vector<rt::EnvVar>& env, const std::string& cwd,
              bool stdin_pipe) {
  int out[2], err[2], in[2] = {-1, -1}, exec_done[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || pipe2(exec_done, O_CLOEXEC) != 0 ||
      (stdin_pipe && pipe2(in, O_CLOEXEC) != 0)) {
    say(std::string("pipe failed: ") + std::strerror(errno));
    finish(1);
  }
  auto args = argv;
  auto c_args = c_strings(args);
  auto environment = child_environment(env);
  auto c_env = c_strings(environment);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    say(std::string("fork failed: ") + std::strerror(errno));
    finish(1);
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(143);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    const int null = open("/dev/null", O_RDONLY);
    dup2(stdin_pipe ? in[0] : null, 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    if (!cwd.empty() && chdir(cwd.c_str()) != 0) {
      dprintf(2, "dew launch: cannot change to directory %s: %s\n", cwd.c_str(), std::strerror(errno));
      _exit(126);
    }
    execvpe(c_args[0], c_args.data(), c_env.data());
    dprintf(2, "dew launch: cannot run %s: %s\n", c_args[0], std::strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
  }
  setpgid(pid, pid);
  // Wait until the child has called exec (the pipe closes) or died: no fd of
  // ours (the held port) lives on in it after this.
  close(exec_done[1]);
  char ignored;
  while (read(exec_done[0], &ignored, 1) < 0 && errno == EINTR) {
  }
  close(exec_done[0]);
  close(out[1]);
  close(err[1]);
  if (stdin_pipe) close(in[0]);
  return {pid, out[0], err[0], stdin_pipe ? in[1] : -1};
}

struct Captured {
  int status = -1;
  bool timed_out = false;
  std::string out, err;
};

// Runs argv to the end and returns its output (the port query, srun --help).
Captured capture(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  Spawned child = spawn(argv, {}, "", false);
  Captured result;
  pollfd fds[2] = {{child.out, POLLIN, 0}, {child.err, POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_streams = 2;
  const auto deadline = Clock::now() + timeout;
  while (open_streams > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      result.timed_out = true;
      kill(-child.pid, SIGKILL);
      break;
    }
    if (poll(fds, 2, static_cast<int>(left)) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buffer[4096];
      const ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_streams;
      }
    }
  }
  for (auto& fd : fds) {
    if (fd.fd >= 0) close(fd.fd);
  }
  while (waitpid(child.pid, &result.status, 0) < 0 && errno == EINTR) {
  }
  return result;
}

std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  const auto newline = t.rfind('\n');
  std::string line = newline == std::string::npos ? t : t.substr(newline + 1);
  std::erase(line, '\r');
  return line;
}

std::string ssh_hint(const std::string& host) {
  return "passwordless ssh must work: check that `ssh -o BatchMode=yes " + host + " true` succeeds";
}

// A port free on this machine: a random one of [kPortLow, kPortHigh] that
// binds (without SO_REUSEADDR, so no socket in any state uses it) and that
// no other dew launch has claimed. The TCP socket is held (close-on-exec)
// until just before rank 0 starts; the claim for the whole launch, so
// launches on one machine never draw the same port while either runs, even
// while rank 0 is still starting up.
int hold_local_port(int& held) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    unsigned random = 0;
    if (getrandom(&random, sizeof random, 0) != static_cast<ssize_t>(sizeof random)) continue;
    const int port = rt::port_candidate(random);
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
  say("cannot find a free port from " + std::to_string(rt::kPortLow) + " to " + std::to_string(rt::kPortHigh) +
      " on this machine (200 tries); give --port");
  finish(1);
}

// A port free on a remote first host: free_port_script() over ssh.
int ask_remote_port(const rt::LaunchOptions& options, const std::string& host) {
  auto argv = rt::ssh_prefix(options, host);
  argv.push_back(rt::free_port_script());
  const Captured reply = capture(argv, kQueryTimeout);
  if (reply.timed_out || !WIFEXITED(reply.status) || WEXITSTATUS(reply.status) != 0) {
    const std::string how = reply.timed_out ? "no answer in 30 s" : rt::describe_wait_status(reply.status);
    const std::string said = last_line(reply.err);
    say("cannot ask " + host + " for a free port over ssh (" + how + (said.empty() ? "" : ": " + said) + "); " +
        ssh_hint(host));
    finish(1);
  }
  auto port = rt::parse_port_reply(reply.out, host);
  if (!port.ok()) {
    say(port.error().message);
    finish(1);
  }
  return port.value();
}

// One started process and the state of its output.
struct Running {
  int rank = 0;  // -1: srun, whose lines carry their own labels
  std::string host;
  bool remote = false;
  Spawned io;
  bool alive = true;
  int status = 0;
  rt::LineSplitter out_lines, err_lines;
};

class Supervisor {
 public:
  explicit Supervisor(std::chrono::milliseconds grace) : grace_(grace) {
    sigset_t set;
    sigemptyset(&set);
    for (const int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, s);
    sigprocmask(SIG_BLOCK, &set, nullptr);
    signal_fd_ = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (signal_fd_ < 0) {
      say(std::string("signalfd failed: ") + std::strerror(errno));
      finish(1);
    }
  }

  void add(Running process) { processes_.push_back(std::make_unique<Running>(std::move(process))); }

  // Runs until every process has ended; returns the launcher's exit code.
  int run() {
    std::optional<Clock::time_point> kill_at, drain_until;
    while (true) {
      if (any_alive()) {
        if (stopping_ && !kill_at) kill_at = Clock::now() + grace_;
      } else if (!drain_until) {
        drain_until = Clock::now() + kDrain;
      }
      if (drain_until && (open_streams() == 0 || Clock::now() >= *drain_until)) break;
      if (kill_at && Clock::now() >= *kill_at) {
        signal_all(SIGKILL);
        kill_at = Clock::now() + 24h;
      }

      std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
      std::vector<std::pair<Running*, bool>> owners{{nullptr, false}};
      for (auto& p : processes_) {
        if (p->io.out >= 0) fds.push_back({p->io.out, POLLIN, 0}), owners.emplace_back(p.get(), false);
        if (p->io.err >= 0) fds.push_back({p->io.err, POLLIN, 0}), owners.emplace_back(p.get(), true);
      }
      auto next = drain_until ? *drain_until : Clock::now() + 1h;
      if (kill_at && *kill_at < next) next = *kill_at;
      const auto wait_ms = std::max<long long>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count() + 1);
      if (poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(wait_ms, 1000000))) < 0) {
        if (errno == EINTR) continue;
        say(std::string("poll failed: ") + std::strerror(errno));
        signal_all(SIGKILL);
        return 1;
      }
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) pump(*owners[i].first, owners[i].second);
      }
      if ((fds[0].revents & POLLIN) != 0) handle_signals();
    }
    for (auto& p : processes_) {
      for (int* fd : {&p->io.out, &p->io.err, &p->io.in}) {
        if (*fd >= 0) close(*fd), *fd = -1;
      }
    }
    return exit_code_;
  }

 private:
  bool any_alive() const {
    for (const auto& p : processes_) {
      if (p->alive) return true;
    }
    return false;
  }

  int open_streams() const {
    int n = 0;
    for (const auto& p : processes_) n += (p->io.out >= 0) + (p->io.err >= 0);
    return n;
  }

  void emit(const Running& p, bool err, const std::string& line) {
    write_all(err ? 2 : 1, p.rank < 0 ? rt::relabel_srun_line(line) : rt::rank_line(p.rank, line));
  }

  void pump(Running& p, bool err) {
    int& fd = err ? p.io.err : p.io.out;
    rt::LineSplitter& lines = err ? p.err_lines : p.out_lines;
    char buffer[65536];
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n > 0) {
      for (const auto& line : lines.feed(std::string_view(buffer, static_cast<std::size_t>(n)))) emit(p, err, line);
      return;
    }
    if (auto rest = lines.finish()) emit(p, err, *rest);
    close(fd);
    fd = -1;
  }

  void handle_signals() {
    signalfd_siginfo info{};
    while (read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      const int signo = static_cast<int>(info.ssi_signo);
      if (signo == SIGCHLD) {
        reap();
      } else if (!stopping_) {
        exit_code_ = 128 + signo;
        say(std::string(strsignal(signo)) + " received: stopping every process");
        stop();
      } else {
        signal_all(SIGKILL);  // a second Ctrl-C does not wait for the grace
      }
    }
  }

  // Marks every process that has ended; returns those that failed while
  // the launcher was not stopping them.
  std::vector<Running*> collect() {
    std::vector<Running*> failed;
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (auto& p : processes_) {
        if (p->io.pid != pid || !p->alive) continue;
        p->alive = false;
        p->status = status;
        // Whatever else its group still runs goes with it.
        kill(-pid, stopping_ ? SIGKILL : 0);
        if (!stopping_ && status != 0) failed.push_back(p.get());
      }
    }
    return failed;
  }

  // At the first failure: names it and stops the rest. When every failure
  // seen is the runtime pool's "a peer failed" exit (75), the process that
  // failed first is usually a moment behind: wait up to kSettle for it.
  void reap() {
    std::vector<Running*> failed = collect();
    if (stopping_ || failed.empty()) return;
    auto statuses = [&failed] {
      std::vector<std::pair<int, int>> out;
      for (const Running* p : failed) out.emplace_back(p->rank, p->status);
      return out;
    };
    const auto settle_until = Clock::now() + kSettle;
    while (std::all_of(failed.begin(), failed.end(), [](const Running* p) { return rt::is_peer_failure(p->status); }) &&
           any_alive() && Clock::now() < settle_until) {
      std::this_thread::sleep_for(10ms);
      for (Running* p : collect()) failed.push_back(p);
    }
    const Running& p = *failed[rt::pick_failure(statuses())];
    exit_code_ = rt::exit_code_of(p.status);
    if (p.rank < 0) {
      say("srun " + rt::describe_wait_status(p.status));
    } else {
      std::string line = "rank " + std::to_string(p.rank) + " on " + p.host + " " + rt::describe_wait_status(p.status);
      if (p.remote && WIFEXITED(p.status) && WEXITSTATUS(p.status) == 255) {
        line += " (ssh's code for a failed connection or login; " + ssh_hint(p.host) + ")";
      }
      say(line + "; stopping the other processes");
    }
    stop();
  }

  void stop() {
    stopping_ = true;
    for (auto& p : processes_) {
      if (p->io.in >= 0) close(p->io.in), p->io.in = -1;  // EOF: the remote watcher ends the command
    }
    signal_all(SIGTERM);
  }

  void signal_all(int signo) {
    for (auto& p : processes_) {
      if (!p->alive) continue;
      // srun relays the signal to the step itself; anything else: its group.
      if (p->rank < 0) {
        kill(p->io.pid, signo);
      } else {
        kill(-p->io.pid, signo);
      }
    }
  }

  std::chrono::milliseconds grace_;
  int signal_fd_ = -1;
  bool stopping_ = false;
  int exit_code_ = 0;
  std::vector<std::unique_ptr<Running>> processes_;
};

// The words after the first "--" that follows the `launch` word of this
// process's own command line (Linux: /proc/self/cmdline), if there is one.
// CLI11 takes a "--" that ends a list option (--hosts a b -- CMD) as the
// list's end, and then may read the command's first options as its own; the
// command line itself tells what the user wrote.
std::optional<std::vector<std::string>> command_after_separator() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> words;
  for (std::string word; std::getline(in, word, '\0');) words.push_back(word);
  auto launch = std::find(words.begin(), words.end(), "launch");
  if (launch == words.end()) return std::nullopt;
  auto separator = std::find(launch, words.end(), "--");
  if (separator == words.end()) return std::nullopt;
  return std::vector<std::string>(separator + 1, words.end());
}

std::string current_directory() {
  std::error_code error;
  auto path = std::filesystem::current_path(error);
  if (error) {
    say("cannot read the current directory: " + error.message() + " (give --cwd)");
    finish(1);
  }
  return path.string();
}

std::string local_hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

int run_slurm(const rt::LaunchOptions& options, const std::vector<rt::EnvVar>& env, bool dry_run) {
  const Captured help = capture({"srun", "--help"}, 30s);
  if (!WIFEXITED(help.status) || WEXITSTATUS(help.status) != 0) {
    say("--slurm: `srun --help` failed (" + rt::describe_wait_status(help.status) + ": " + last_line(help.err) +
        "); is Slurm's srun on PATH?");
    return 1;
  }
  auto argv = rt::srun_command(options, rt::srun_has_dew_pool(help.out));
  if (!argv.ok()) {
    say(argv.error().message);
    return 2;
  }
  if (dry_run) {
    std::vector<std::string> words;
    if (!env.empty()) words.emplace_back("env");
    for (const auto& [name, value] : env) words.push_back(name + "=" + value);
    words.insert(words.end(), argv.value().begin(), argv.value().end());
    std::string line;
    for (const auto& word : words) line += (line.empty() ? "" : " ") + rt::display_quote(word);
    write_all(1, "slurm: " + line + "\n");
    return 0;
  }
  Supervisor supervisor(std::chrono::duration_cast<std::chrono::milliseconds>(kSrunGrace));
  Running srun;
  srun.rank = -1;
  srun.host = "srun";
  srun.io = spawn(argv.value(), env, "", false);
  supervisor.add(std::move(srun));
  return supervisor.run();
}

int run_launch(LaunchArgs& args) {
  rt::LaunchOptions& o = args.options;
  if (auto written = command_after_separator(); written && *written != o.command) {
    say("cannot tell the command from dew launch's own options: CLI11 ended --hosts at -- and then read the "
        "command's first words as options; put another option between the last host and --, such as "
        "--hosts node0 node1 --processes-per-host 1 -- CMD");
    return 2;
  }
  o.processes_per_host = args.processes_per_host;
  if (args.devices_option->count() > 0) o.devices_per_process = args.devices_per_process;
  if (args.port_option->count() > 0) o.port = args.port;
  auto validated = rt::validate(o);
  if (!validated.ok()) {
    say(validated.error().message);
    return 2;
  }
  auto env = rt::parse_env_options(o.env, o.devices_per_process.has_value(), o.private_dirs);
  if (!env.ok()) {
    say(env.error().message);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  if (o.slurm) return run_slurm(o, env.value(), args.dry_run);

  rt::LaunchFacts facts;
  facts.launcher_cwd = current_directory();
  facts.local_hostname = local_hostname();
  facts.secret = random_hex(32);
  if (o.private_dirs) facts.private_root = rt::private_root_for(random_hex(6));
  const std::string first = rt::effective_hosts(o).front();
  int held = -1;
  if (o.port) {
    facts.port = *o.port;
  } else if (first == rt::kLocalHost) {
    facts.port = hold_local_port(held);
  } else if (args.dry_run) {
    facts.port_text = "PORT";
    say("--dry-run: the port is asked from " + first + " when the launch starts; shown as PORT");
  } else {
    facts.port = ask_remote_port(o, first);
  }
  const rt::LaunchPlan plan = rt::plan_launch(o, env.value(), facts);

  if (args.dry_run) {
    std::string out;
    for (const auto& p : plan.processes) out += rt::dry_run_line(p) + "\n";
    write_all(1, out);
    return 0;
  }
  if (!o.cwd.empty()) {
    const std::string& cwd = plan.processes.front().cwd;
    std::error_code error;
    if (rt::all_local(o) && !std::filesystem::is_directory(cwd, error)) {
      say("--cwd: " + rt::shown(o.cwd) + " is not a directory here; allowed: a directory that exists on every host");
      return 2;
    }
  }
  if (o.private_dirs) say("private directories: " + facts.private_root + "/<rank>/{work,home,cache} on each host");

  Supervisor supervisor(std::chrono::duration_cast<std::chrono::milliseconds>(kGrace));
  // Rank 0 starts last: the port stays held while the others start, and is
  // let go just before the process that listens on it starts.
  std::vector<const rt::ProcessSpec*> order;
  for (std::size_t k = 1; k < plan.processes.size(); ++k) order.push_back(&plan.processes[k]);
  order.push_back(&plan.processes.front());
  for (const rt::ProcessSpec* spec : order) {
    const rt::ProcessSpec& p = *spec;
    if (p.rank == 0 && held >= 0) close(held);
    if (p.local) {
      for (const auto& dir : p.make_dirs) {
        std::error_code error;
        std::filesystem::create_directories(dir, error);
        if (error) {
          say("--private-dirs: cannot make " + dir + ": " + error.message());
          return 1;
        }
      }
    }
    Running running;
    running.rank = p.rank;
    running.host = p.host;
    running.remote = !p.local;
    running.io = p.local ? spawn(p.argv, p.env, p.cwd, false) : spawn(p.argv, {}, "", true);
    // The remote script reads the secret as the first line of its stdin.
    if (running.io.in >= 0) write_all(running.io.in, facts.secret + "\n");
    supervisor.add(std::move(running));
  }
  return supervisor.run();
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
  launch
      ->add_option("--hosts", args->options.hosts,
                   "Hosts in rank order, process 0's first; localhost runs without ssh (default: localhost). "
                   "Remote hosts run the command in the user's shell without a login profile: give the program "
                   "as an absolute path")
      ->type_name("HOST ...");
  launch->add_option("--processes-per-host", args->processes_per_host, "Processes on each host (1-1024; default 1)")
      ->type_name("N");
  args->devices_option =
      launch
          ->add_option("--devices-per-process", args->devices_per_process,
                       "Local process k takes devices [kN, (k+1)N): CUDA_VISIBLE_DEVICES=kN,... and "
                       "JAX_LOCAL_DEVICE_IDS=0,...,N-1 (1-1024; default: every process sees every device)")
          ->type_name("N");
  args->port_option =
      launch
          ->add_option("--port", args->port,
                       "Coordinator port (1-65535; default: a random one from 20000-29999 that is free on the first "
                       "host when the launch starts, asked over ssh with a POSIX sh + awk query for a remote first "
                       "host)")
          ->type_name("PORT");
  launch
      ->add_option("--coordinator", args->options.coordinator,
                   "The name other hosts reach the first host by (default: the first host; this machine's "
                   "name when that is localhost and other hosts are remote)")
      ->type_name("HOST");
  launch
      ->add_option("--env", args->options.env,
                   "Set NAME=VALUE for every process (repeatable); NAME must be a shell variable name; the value "
                   "arrives byte for byte, whatever quotes, $(), ; or newlines it holds")
      ->type_name("NAME=VALUE")
      ->allow_extra_args(false);
  launch
      ->add_option("--cwd", args->options.cwd,
                   "Start every process in DIR, which must exist at that path on every host (default: the "
                   "current directory)")
      ->type_name("DIR");
  launch->add_flag("--private-dirs", args->options.private_dirs,
                   "Rehearsal: every process starts in a directory of its own, /tmp/dew-launch-<id>/<rank>/work, "
                   "with its own HOME (…/home) and DEW_CACHE_DIR (…/cache)");
  launch->add_flag("--slurm", args->options.slurm,
                   "Inside an allocation, hand the launch to srun --ntasks-per-node=N --kill-on-bad-exit=1 "
                   "--export=ALL (--env variables in srun's environment), with --dew-pool when Dew's SPANK plugin "
                   "is loaded (srun --help lists --dew-pool); --devices-per-process, --port and --coordinator "
                   "become --dew-* options and are refused without the plugin");
  launch
      ->add_option("--ssh-config", args->options.ssh_config,
                   "ssh -F FILE for every ssh the launcher runs (default: $DEW_LAUNCH_SSH_CONFIG, else ssh's own)")
      ->envname("DEW_LAUNCH_SSH_CONFIG")
      ->type_name("FILE");
  launch->add_option("--ssh-option", args->options.ssh_options, "ssh -o OPTION for every ssh (repeatable)")
      ->type_name("OPTION")
      ->allow_extra_args(false);
  launch->add_flag("--dry-run", args->dry_run,
                   "Print the exact command of every process, one per line (`RANK HOST: env -C DIR VAR=VALUE... "
                   "CMD` or the ssh command, in bash quoting), and run nothing");
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
    int code = 1;
    try {
      code = run_launch(*args);
    } catch (const std::exception& e) {  // out of memory and the like: one line
      say(e.what());
    }
    if (code != 0) finish(code);  // the process's own code, not CLI11's
  });
}

}  // namespace dew::cli
