// The subcommands of the `dew` command, one registration function each.
#pragma once

#include <CLI/CLI.hpp>

namespace dew::cli {

// `dew topo`: the node's GPU topology (runtime/dew/topo_command.cpp).
void add_topo_command(CLI::App& app);
// `dew mesh`: a device mesh for a MeshSpec (runtime/dew/mesh_command.cpp).
void add_mesh_command(CLI::App& app);
// `dew env`: the resolved pool identity and JAX variables (runtime/dew/env_command.cpp).
void add_env_command(CLI::App& app);
// `dew attention-plan`: the sequence-parallel exchange for an attention call (runtime/dew/attention_plan_command.cpp).
void add_attention_plan_command(CLI::App& app);
// `dew attention-check`: sequence-parallel attention across this pool, checked and timed
// (runtime/dew/attention_check_command.cpp).
void add_attention_check_command(CLI::App& app);
// `dew launch`: start a pool on hosts over ssh, locally or under srun (runtime/dew/launch_command.cpp).
void add_launch_command(CLI::App& app);

}  // namespace dew::cli
