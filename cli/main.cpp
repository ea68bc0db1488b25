// The `dew` command: one binary, one subcommand per job.
#include <cblas.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "commands.h"
#include "dew/log.h"
#include "dew/text.h"

namespace dew::cli {

void run_subcommand(std::string_view name, const std::function<int()>& body) {
  set_log_prefix("dew " + std::string(name) + ": ");
  int code = 1;
  try {
    code = body();
  } catch (const std::exception& e) {  // out of memory, a stream failure: one line, not an abort
    report(internal_error(e.what()));
  }
  if (code != 0) finish(code);
}

Result<runtime::Pool> join_pool(const runtime::JoinOptions& options) { return runtime::try_join(options); }

Result<runtime::Pool> join_with_cpu_devices() {
  openblas_set_num_threads(1);
  // Dew owns this process: a write to a peer or a pipe that has closed is an
  // error to report (or a failure already on its way), never a death by
  // SIGPIPE that hides the rank's own exit code. Children get it back.
  std::signal(SIGPIPE, SIG_IGN);
  // Their devices wait in collectives, not at agreements: a peer's failure
  // ends the process as soon as it is heard (unless the user set a grace).
  runtime::JoinOptions options;
  options.failure_grace_fallback = std::chrono::milliseconds(1);
  return join_pool(options);
}

int report(const Error& error, int code) {
  log_error(error.message);
  return code;
}

void finish(int code) {
  std::cout.flush();
  std::cerr.flush();
  std::exit(code);
}

CLI::Validator finite_number(double lowest, bool above) {
  char bound[32];
  std::snprintf(bound, sizeof bound, "%g", lowest);
  const std::string allowed = std::string("a finite number ") + (above ? "above " : "from ") + bound;
  return CLI::Validator(
      [lowest, above, allowed](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        const bool whole = !text.empty() && end == text.c_str() + text.size();
        const bool ok = whole && std::isfinite(value) && (above ? value > lowest : value >= lowest);
        return ok ? std::string() : dew::quoted(text) + " is not allowed; allowed: " + allowed;
      },
      allowed);
}

}  // namespace dew::cli

int main(int argc, char** argv) {
  dew::set_log_prefix("dew: ");
  // A bad DEW_LOG_LEVEL is a usage error before anything runs.
  if (auto level = dew::configure_log_level_from_env(); !level.ok()) return dew::cli::report(level.error(), 2);
  CLI::App app{"Dew: start, lay out and fail well on multi-node training pools", "dew"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("dew ") + DEW_VERSION);
  app.footer(
      "Environment: DEW_LOG_LEVEL=trace|debug|info|warn|error|off sets which lines dew and libdew write "
      "to stderr (default info).");
  dew::cli::add_topo_command(app);
  dew::cli::add_mesh_command(app);
  dew::cli::add_env_command(app);
  dew::cli::add_attention_plan_command(app);
  dew::cli::add_attention_check_command(app);
  dew::cli::add_launch_command(app);
  dew::cli::add_worker_command(app);
  dew::cli::add_layout_parity_command(app);
  // CLI11 calls an unknown first word "A subcommand is required": name it.
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const CLI::App* command : app.get_subcommands([](CLI::App*) { return true; })) {
      names.push_back(command->get_name());
    }
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      return dew::cli::report(dew::invalid_argument(dew::quoted(argv[1]) + " is not a dew command; allowed: " +
                                                    dew::join(names, ", ") + " (dew --help lists them)"),
                              2);
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help and version are 0 and a subcommand's own failure is 1 (its line
    // is already printed); every usage error is 2, whatever CLI11 numbers it.
    const int code = app.exit(e);
    return code == 0 || code == 1 ? code : 2;
  }
  return 0;
}
