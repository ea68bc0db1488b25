// The `dew` command: one binary, one subcommand per job.
#include <CLI/CLI.hpp>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"Dew: start, lay out and fail well on multi-node training pools", "dew"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("dew ") + DEW_VERSION);
  dew::cli::add_topo_command(app);
  dew::cli::add_mesh_command(app);
  dew::cli::add_env_command(app);
  dew::cli::add_attention_plan_command(app);
  dew::cli::add_attention_check_command(app);
  dew::cli::add_launch_command(app);
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
