// Runs a real command with a deadline and captures both of its streams:
// what the integration tests use to drive srun, sbatch and scripts.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace dew::testing {

struct RunResult {
  int exit_code = -1;    // the code, or 128 + signal
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

// The lines of `text` that start with `prefix`.
std::vector<std::string> lines_starting_with(const std::string& text, const std::string& prefix);

}  // namespace dew::testing
