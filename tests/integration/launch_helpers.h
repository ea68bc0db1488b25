// What the `dew launch` integration tests share: running the launcher in
// the foreground or the background, temporary folders, pid files, and the
// identity lines that kPrintIdentity prints.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dew/process.h"
#include "process.h"
#include "test_paths.h"

namespace dew::testing {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline const std::string kHostile =
    "a b 'single' \"double\" $(touch /tmp/dew-launch-pwned) `id` ; rm -rf /nonexistent & | \\ $HOME\nsecond "
    "line\t*?[]{}!#~ -- --env X=1";

// A shell command printing the pool variables as `key=value` lines.
inline const std::string kPrintIdentity =
    "echo id=$DEW_PROCESS_ID count=$DEW_PROCESS_COUNT local=$DEW_LOCAL_PROCESS_ID "
    "local_count=$DEW_LOCAL_PROCESS_COUNT coord=$DEW_COORDINATOR_ADDRESS jax=$JAX_COORDINATOR_ADDRESS "
    "secret=$DEW_POOL_SECRET";

inline RunResult dew_launch(std::vector<std::string> args, std::map<std::string, std::string> env = {},
                            std::chrono::milliseconds timeout = 60s) {
  args.insert(args.begin(), {dew_exe(), "launch"});
  return run(args, env, timeout);
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Identity {
  int id = -1, count = -1, local = -1, local_count = -1;
  std::string coord, jax, secret;
};

// "[k] id=… count=…" lines of stdout, by rank.
inline std::map<int, Identity> identities(const std::string& out) {
  std::map<int, Identity> result;
  const std::regex line(
      R"(^\[(\d+)\] id=(\d+) count=(\d+) local=(\d+) local_count=(\d+) coord=(\S*) jax=(\S*) secret=(\S*)$)");
  std::istringstream stream(out);
  for (std::string text; std::getline(stream, text);) {
    std::smatch m;
    if (!std::regex_match(text, m, line)) continue;
    Identity& i = result[std::stoi(m[1])];
    i.id = std::stoi(m[2]);
    i.count = std::stoi(m[3]);
    i.local = std::stoi(m[4]);
    i.local_count = std::stoi(m[5]);
    i.coord = m[6];
    i.jax = m[7];
    i.secret = m[8];
  }
  return result;
}

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/dew-launch-test-XXXXXX";
    if (mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The root of the private directories `dew launch --private-dirs` said it
// made ("" if it said none), and removed: a test leaves nothing in /tmp.
inline std::string remove_private_dirs(const std::string& launcher_err) {
  std::smatch m;
  if (!std::regex_search(launcher_err, m, std::regex("private directories: (/tmp/dew-launch-[0-9a-f]{12})/"))) {
    return "";
  }
  std::error_code ignored;
  std::filesystem::remove_all(m[1].str(), ignored);
  return m[1];
}

inline bool alive(pid_t pid) { return kill(pid, 0) == 0; }

// Waits until every pid named in the files is gone; false after `limit`.
inline bool all_gone(const std::vector<pid_t>& pids, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    bool any = false;
    for (const pid_t pid : pids) any = any || alive(pid);
    if (!any) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

inline std::vector<pid_t> pids_in(const TempDir& dir, const std::string& prefix, int count) {
  std::vector<pid_t> pids;
  for (int k = 0; k < count; ++k) {
    const std::string text = read_text(dir / (prefix + std::to_string(k)));
    if (!text.empty()) pids.push_back(static_cast<pid_t>(std::stol(text)));
  }
  return pids;
}

inline bool wait_for_files(const TempDir& dir, const std::string& prefix, int count, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    int present = 0;
    for (int k = 0; k < count; ++k) present += !read_text(dir / (prefix + std::to_string(k))).empty();
    if (present == count) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// A launcher running in the background, its output into files.
class Background {
 public:
  Background(std::vector<std::string> args, const TempDir& dir, const std::string& name,
             std::map<std::string, std::string> env = {})
      : out_(dir / (name + ".out")), err_(dir / (name + ".err")) {
    args.insert(args.begin(), {dew_exe(), "launch"});
    dew::SpawnOptions options;
    options.argv = args;
    for (const auto& [name, value] : env) options.env.emplace_back(name, value);
    options.stdout_mode = options.stderr_mode = dew::Stdio::kFile;
    options.stdout_file = out_;
    options.stderr_file = err_;
    start_ = Clock::now();
    auto child = dew::spawn(options);
    pid_ = child.ok() ? child.value().pid : -1;
  }
  ~Background() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      wait();
    }
  }
  pid_t pid() const { return pid_; }
  // The exit code (128 + signal), or -1 after `limit`.
  int wait(std::chrono::milliseconds limit = 30s) {
    const auto deadline = Clock::now() + limit;
    int status = 0;
    while (true) {
      const pid_t done = waitpid(pid_, &status, WNOHANG);
      if (done == pid_) break;
      if (Clock::now() > deadline) return -1;
      std::this_thread::sleep_for(10ms);
    }
    reaped_ = true;
    seconds_ = std::chrono::duration<double>(Clock::now() - start_).count();
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  double seconds() const { return seconds_; }
  std::string out() const { return read_text(out_); }
  std::string err() const { return read_text(err_); }

 private:
  std::string out_, err_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  Clock::time_point start_;
  double seconds_ = 0;
};

}  // namespace dew::testing
