#include "process.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "dew/exit_status.h"
#include "dew/process.h"

namespace dew::testing {
namespace {

// The tests' env maps: an empty value removes the variable.
SpawnOptions options_for(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  SpawnOptions options;
  options.argv = argv;
  for (const auto& [name, value] : env) {
    options.env.emplace_back(name, value.empty() ? std::nullopt : std::optional<std::string>(value));
  }
  return options;
}

int shell_code(int wait_status) { return exit_code_of(wait_status); }

std::string temp_file(const char* what) {
  std::string path = std::string("/tmp/dew-test-") + what + "-XXXXXX";
  const int fd = mkstemp(path.data());
  if (fd < 0) throw std::runtime_error("mkstemp: " + std::string(std::strerror(errno)));
  close(fd);
  return path;
}

}  // namespace

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

RunResult run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
              std::chrono::milliseconds timeout) {
  auto captured = capture(options_for(argv, env), timeout);
  if (!captured.ok()) throw std::runtime_error(captured.error().message);
  const Captured& c = captured.value();
  RunResult result;
  result.timed_out = c.timed_out;
  result.out = c.out;
  result.err = c.err;
  result.seconds = c.seconds;
  result.exit_code = shell_code(c.wait_status);
  return result;
}

Spawned::Spawned(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env)
    : out_path_(temp_file("out")), err_path_(temp_file("err")) {
  start_ = std::chrono::steady_clock::now();
  SpawnOptions options = options_for(argv, env);
  options.stdout_mode = Stdio::kFile;
  options.stdout_file = out_path_;
  options.stderr_mode = Stdio::kFile;
  options.stderr_file = err_path_;
  auto child = spawn(options);
  if (!child.ok()) throw std::runtime_error(child.error().message);
  pid_ = child.value().pid;
}

Spawned::~Spawned() {
  if (exit_code_ < 0 && pid_ > 0) {
    kill(-pid_, SIGKILL);
    wait_for_exit(pid_);
  }
  unlink(out_path_.c_str());
  unlink(err_path_.c_str());
}

int Spawned::wait(std::chrono::milliseconds timeout) {
  if (exit_code_ >= 0) return exit_code_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      exit_code_ = shell_code(status);
      return exit_code_;
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool Spawned::running() { return wait(std::chrono::milliseconds(0)) < 0; }

void Spawned::signal(int number) {
  if (exit_code_ < 0) kill(-pid_, number);
}

std::string Spawned::out() const { return slurp(out_path_); }
std::string Spawned::err() const { return slurp(err_path_); }

bool Spawned::wait_for_output(const std::string& text, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (out().find(text) != std::string::npos || err().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Drawn from 30000-32767: above Dew's own ranges (the framework's
// 10000-19999, the pool's 20000-29999) and below Linux's ephemeral ports
// (32768 on), which every outgoing connection of the tests running beside
// this one takes from: a port the kernel handed out as free (port 0) was
// once taken by such a connection before the pool's process 0 could bind it.
std::uint16_t free_loopback_port() {
  thread_local std::mt19937 draw(std::random_device{}());
  std::uniform_int_distribution<int> port(30000, 32767);
  for (int attempt = 0; attempt < 500; ++attempt) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<std::uint16_t>(port(draw)));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    close(fd);
    if (free) return ntohs(address.sin_port);
  }
  return 0;
}

std::vector<int> processes_with(const std::string& program, const std::set<std::string>& variables) {
  std::vector<int> found;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    const std::string path = entry.path();
    std::ifstream cmdline(path + "/cmdline"), environ(path + "/environ");
    std::string argv0, variable;
    if (!cmdline || !std::getline(cmdline, argv0, '\0') || argv0 != program) continue;
    std::size_t held = 0;
    while (std::getline(environ, variable, '\0')) held += variables.count(variable);
    if (held == variables.size()) found.push_back(std::stoi(entry.path().filename()));
  }
  return found;
}

int occurrences(const std::string& text, const std::string& needle) {
  int n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

std::vector<std::string> lines_starting_with(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) {
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
  }
  return out;
}

}  // namespace dew::testing
