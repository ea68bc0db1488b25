// The `dew` command: one binary, one subcommand per job.
#include <CLI/CLI.hpp>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"Dew: start, lay out and fail well on multi-node training pools", "dew"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("dew ") + DEW_VERSION);
  dew::cli::add_topo_command(app);
  dew::cli::add_mesh_command(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
