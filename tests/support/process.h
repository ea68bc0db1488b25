// Runs a real command with a deadline and captures both of its streams:
// what the integration tests use to drive srun, sbatch and scripts.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace dew::testing {

struct RunResult {
  int exit_code = -1;  // the code, or 128 + signal
  bool timed_out = false;
  std::string out;
  std::string err;
  double seconds = 0;
};

// Runs argv (argv[0] looked up in PATH) in its own process group with stdin
// from /dev/null; `env` entries override the inherited environment (an empty
// value removes the variable). After `timeout` the whole group is SIGKILLed.
RunResult run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
              std::chrono::milliseconds timeout = std::chrono::seconds(60));

// A process started in the background, in its own process group, its two
// streams going to temporary files: for tests that run several processes at
// once (a pool) and kill some of them.
class Spawned {
 public:
  Spawned(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {});
  ~Spawned();  // SIGKILLs the group if it still runs
  Spawned(const Spawned&) = delete;
  Spawned& operator=(const Spawned&) = delete;

  int pid() const { return pid_; }
  // The exit code (or 128 + signal) once it exits within `timeout`; -1 if not.
  int wait(std::chrono::milliseconds timeout);
  bool running();
  // Seconds from the start to the exit wait() saw.
  double seconds() const { return seconds_; }
  void signal(int number);  // to the whole group
  std::string out() const;
  std::string err() const;
  // Waits until `text` shows up on stdout or stderr, up to `timeout`.
  bool wait_for_output(const std::string& text, std::chrono::milliseconds timeout);

 private:
  int pid_ = -1;
  int exit_code_ = -1;
  double seconds_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::string out_path_;
  std::string err_path_;
};

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, read
// back, released): for tests that start their own servers.
std::uint16_t free_loopback_port();

// The processes on this machine whose first argument is `program` and whose
// environment holds every one of `variables` ("NAME=value"): a test's own
// among those of other tests and shards (namespaces share the process table).
std::vector<int> processes_with(const std::string& program, const std::set<std::string>& variables);

// The whole text of the file at `path` ("" when it cannot be read).
std::string slurp(const std::string& path);

// How many times `needle` occurs in `text`.
int occurrences(const std::string& text, const std::string& needle);

// The lines of `text` that start with `prefix`.
std::vector<std::string> lines_starting_with(const std::string& text, const std::string& prefix);

}  // namespace dew::testing
