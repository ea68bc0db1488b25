// `dew launch`'s edge, shared by its files: the parsed arguments, what ends
// a launch before it starts, and the two ways of gathering and starting
// (hosts over ssh or locally: launch_hosts.cpp; srun: launch_slurm.cpp).
// Private to cli/.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "dew/launch_plan.h"

namespace dew::cli {

struct LaunchArgs {
  launch::LaunchOptions options;
  int processes_per_host = 1;
  std::string devices_per_process;  // --devices-per-process N|off, parsed into options
  int port = 0;
  std::string watchdog;  // --watchdog, parsed into options.watchdog
  bool dry_run = false;
  std::string program;  // the command's first word; its arguments are the subcommand's remaining()
  CLI::App* app = nullptr;
  CLI::Option* devices_option = nullptr;
  CLI::Option* port_option = nullptr;
  CLI::Option* watchdog_option = nullptr;
};

// What ends the launch before any process runs: a line and an exit code.
struct Stop {
  std::string line;
  int code = 1;
};

// The launch's tag of failure records (DEW_NOTICE_TAG): 16 fresh hex
// digits, or the placeholder a dry run shows.
Result<std::string> draw_notice_tag(bool dry_run);

// The last line of a command's output, without its line break.
std::string last_line(const std::string& text);

// The variables in the form the spawner takes.
inline std::vector<std::pair<std::string, std::optional<std::string>>> env_changes(
    const std::vector<launch::EnvVar>& env) {
  return {env.begin(), env.end()};
}

// The port and the hosts' GPUs, asked of remote hosts in parallel; a given
// --port is checked free on the first host (held here until rank 0 starts
// when that is this machine: `held`).
std::optional<Stop> gather_host_facts(const LaunchArgs& args, launch::LaunchFacts& facts, std::vector<int>& held);

// --slurm: the whole launch through srun; returns the exit code.
int run_slurm(const launch::LaunchOptions& options, const std::vector<launch::EnvVar>& env, bool dry_run);

}  // namespace dew::cli
