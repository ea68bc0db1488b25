// Reading what srun printed, shared by the integration suites.
#pragma once

#include <filesystem>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "slurm_cluster.h"

namespace dew::testing {

// `srun -l env` output: task number -> its environment.
inline std::map<int, std::map<std::string, std::string>> task_environments(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> tasks;
  const std::regex line(R"(^\s*(\d+): ([A-Za-z_][A-Za-z0-9_]*)=(.*)$)");
  std::istringstream stream(out);
  for (std::string text; std::getline(stream, text);) {
    std::smatch match;
    if (std::regex_match(text, match, line)) tasks[std::stoi(match[1])][match[2]] = match[3];
  }
  return tasks;
}

inline std::string describe(const RunResult& r) {
  return "exit " + std::to_string(r.exit_code) + (r.timed_out ? " (timed out)" : "") + "\n--- stdout\n" + r.out +
         "--- stderr\n" + r.err;
}

// Runs `srun ARGS -l env` against the test cluster and returns each task's
// environment; a failed srun fails the test, with srun's output.
inline std::map<int, std::map<std::string, std::string>> srun_task_environments(
    std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
  args.insert(args.end(), {"-l", "env"});
  auto r = cluster().srun(args, std::move(env), std::chrono::seconds(30));
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  return task_environments(r.out);
}

inline std::string marker_path(const std::string& name) {
  auto path = cluster().dir() + "/markers/" + name;
  std::filesystem::create_directories(cluster().dir() + "/markers");
  std::filesystem::remove(path);
  return path;
}

}  // namespace dew::testing
