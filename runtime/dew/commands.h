// The subcommands of the `dew` command, one registration function each.
#pragma once

#include <CLI/CLI.hpp>

namespace dew::cli {

// `dew topo`: the node's GPU topology (runtime/dew/topo_command.cpp).
void add_topo_command(CLI::App& app);
// `dew mesh`: a device mesh for a MeshSpec (runtime/dew/mesh_command.cpp).
void add_mesh_command(CLI::App& app);

}  // namespace dew::cli
