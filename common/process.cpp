#include "dew/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>

extern char** environ;

namespace dew {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Both ends of a pipe, close-on-exec; -1 where the stream needs none.
struct Pipe {
  int read = -1;
  int write = -1;
  void close_both() {
    for (int* fd : {&read, &write}) {
      if (*fd >= 0) ::close(*fd), *fd = -1;
    }
  }
};

bool open_pipe(Pipe& pipe) {
  int ends[2];
  if (pipe2(ends, O_CLOEXEC) != 0) return false;
  pipe.read = ends[0];
  pipe.write = ends[1];
  return true;
}

// In the child, before exec: only async-signal-safe calls. Reports errno on
// `report` and exits when a step fails.
[[noreturn]] void child_fail(int report) {
  const int error = errno;
  [[maybe_unused]] ssize_t ignored = ::write(report, &error, sizeof error);
  _exit(127);
}

int open_for(Stdio mode, const std::string& file, int fd) {
  const int flags = fd == 0 ? O_RDONLY : O_WRONLY;
  if (mode != Stdio::kFile) return ::open("/dev/null", flags);
  return fd == 0 ? ::open(file.c_str(), flags) : ::open(file.c_str(), flags | O_CREAT | O_TRUNC, 0644);
}

[[noreturn]] void run_child(const SpawnOptions& o, Pipe& in, Pipe& out, Pipe& err, int report, pid_t parent,
                            char* const* argv, char* const* envp) {
  setpgid(0, 0);
  if (o.die_with_parent) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(143);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int s = 1; s < NSIG; ++s) {
    if (s != SIGKILL && s != SIGSTOP) signal(s, SIG_DFL);
  }
  const struct {
    Stdio mode;
    int pipe_end;
    int fd;
    const std::string& file;
  } streams[] = {{o.stdin_mode, in.read, 0, o.stdin_file},
                 {o.stdout_mode, out.write, 1, o.stdout_file},
                 {o.stderr_mode, err.write, 2, o.stderr_file}};
  for (const auto& s : streams) {
    if (s.mode == Stdio::kInherit) continue;
    // stderr into the file stdout already opened: share it.
    if (s.fd == 2 && s.mode == Stdio::kFile && o.stdout_mode == Stdio::kFile && o.stderr_file == o.stdout_file) {
      if (dup2(1, 2) < 0) child_fail(report);
      continue;
    }
    const int source = s.mode == Stdio::kPipe ? s.pipe_end : open_for(s.mode, s.file, s.fd);
    if (source < 0 || dup2(source, s.fd) < 0) child_fail(report);
  }
  if (!o.cwd.empty() && chdir(o.cwd.c_str()) != 0) child_fail(report);
  execvpe(argv[0], argv, envp);
  child_fail(report);
}

}  // namespace

std::vector<std::string> environment_with(
    const std::vector<std::pair<std::string, std::optional<std::string>>>& changes) {
  std::map<std::string, std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const auto equals = text.find('=');
    if (equals != std::string_view::npos)
      env[std::string(text.substr(0, equals))] = std::string(text.substr(equals + 1));
  }
  for (const auto& [name, value] : changes) {
    if (value) {
      env[name] = *value;
    } else {
      env.erase(name);
    }
  }
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [name, value] : env) out.push_back(name + "=" + value);
  return out;
}

Result<Child> spawn(const SpawnOptions& options) {
  if (options.argv.empty()) return invalid_argument("spawn: no program to run (an empty command)");
  Pipe in, out, err, report;
  const bool piped = open_pipe(report) && (options.stdin_mode != Stdio::kPipe || open_pipe(in)) &&
                     (options.stdout_mode != Stdio::kPipe || open_pipe(out)) &&
                     (options.stderr_mode != Stdio::kPipe || open_pipe(err));
  if (!piped) {
    const std::string why = std::strerror(errno);
    for (Pipe* p : {&in, &out, &err, &report}) p->close_both();
    return system_error("cannot start " + options.argv[0] + ": pipe failed: " + why);
  }
  auto args = options.argv;
  auto c_args = c_strings(args);
  auto environment = environment_with(options.env);
  auto c_env = c_strings(environment);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const std::string why = std::strerror(errno);
    for (Pipe* p : {&in, &out, &err, &report}) p->close_both();
    return system_error("cannot start " + options.argv[0] + ": fork failed: " + why);
  }
  if (pid == 0) run_child(options, in, out, err, report.write, parent, c_args.data(), c_env.data());
  setpgid(pid, pid);  // also here, so the group exists before the caller signals it
  ::close(report.write);
  report.write = -1;
  // The report pipe closes at exec; an errno arrives when a step failed.
  int child_errno = 0;
  ssize_t got = 0;
  do {
    got = ::read(report.read, &child_errno, sizeof child_errno);
  } while (got < 0 && errno == EINTR);
  report.close_both();
  ::close(in.read);
  ::close(out.write);
  ::close(err.write);
  if (got == static_cast<ssize_t>(sizeof child_errno)) {
    wait_for_exit(pid);
    ::close(in.write);
    ::close(out.read);
    ::close(err.read);
    const std::string what = "cannot run " + options.argv[0] +
                             (options.cwd.empty() ? std::string() : " in " + options.cwd) + ": " +
                             std::strerror(child_errno);
    return child_errno == ENOENT ? not_found(what) : system_error(what);
  }
  return Child{pid, in.write, out.read, err.read};
}

std::optional<int> wait_for_exit(pid_t pid) {
  int status = 0;
  for (;;) {
    if (waitpid(pid, &status, 0) == pid) return status;
    if (errno != EINTR) return std::nullopt;
  }
}

Result<Captured> capture(SpawnOptions options, std::chrono::milliseconds timeout) {
  options.stdout_mode = Stdio::kPipe;
  options.stderr_mode = Stdio::kPipe;
  const auto start = Clock::now();
  auto child = spawn(options);
  if (!child.ok()) return child.error();
  if (child.value().in >= 0) ::close(child.value().in);
  Captured result;
  pollfd fds[2] = {{child.value().out, POLLIN, 0}, {child.value().err, POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_streams = 2;
  const auto deadline = start + timeout;
  while (open_streams > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      result.timed_out = true;
      kill(-child.value().pid, SIGKILL);
      break;
    }
    if (poll(fds, 2, static_cast<int>(std::min<long long>(left, 1 << 30))) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buffer[65536];
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_streams;
      }
    }
  }
  for (auto& fd : fds) {
    if (fd.fd >= 0) ::close(fd.fd);
  }
  result.wait_status = wait_for_exit(child.value().pid).value_or(0);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

std::optional<char> state_in_stat_line(std::string_view line) {
  const auto name_end = line.rfind(')');
  if (name_end == std::string_view::npos || line.find('(') > name_end) return std::nullopt;
  const auto state = line.find_first_not_of(' ', name_end + 1);
  if (state == std::string_view::npos || state == name_end + 1) return std::nullopt;
  const char letter = line[state];
  if (letter < 'A' || letter > 'z') return std::nullopt;
  return letter;
}

int runnable_threads_besides_caller() {
  DIR* tasks = opendir("/proc/self/task");
  if (!tasks) return 0;
  const std::string caller = std::to_string(static_cast<long>(syscall(SYS_gettid)));
  int runnable = 0;
  while (const dirent* entry = readdir(tasks)) {
    const std::string tid = entry->d_name;
    if (tid == "." || tid == ".." || tid == caller) continue;
    std::ifstream stat("/proc/self/task/" + tid + "/stat");
    const std::string line{std::istreambuf_iterator<char>(stat), {}};
    if (state_in_stat_line(line) == 'R') ++runnable;
  }
  closedir(tasks);
  return runnable;
}

}  // namespace dew
