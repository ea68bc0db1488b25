// The subcommands of the `dew` command, one registration function each, and
// what they share.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string_view>

#include "dew/pool.h"
#include "dew/result.h"

namespace dew::cli {

// `dew topo`: the node's GPU topology (topo_command.cpp).
void add_topo_command(CLI::App& app);
// `dew mesh`: a device mesh for a MeshSpec (mesh_command.cpp).
void add_mesh_command(CLI::App& app);
// `dew env`: the resolved pool identity and JAX variables (env_command.cpp).
void add_env_command(CLI::App& app);
// `dew attention-plan`: the sequence-parallel exchange for an attention call (attention_plan_command.cpp).
void add_attention_plan_command(CLI::App& app);
// `dew attention-check`: sequence-parallel attention across this pool, checked and timed
// (attention_check_command.cpp).
void add_attention_check_command(CLI::App& app);
// `dew launch`: start a pool on hosts over ssh, locally or under srun (launch_command.cpp,
// launch_supervisor.cpp).
void add_launch_command(CLI::App& app);

// `dew worker`: the distribution worker, a small transformer trained over this
// pool's layout (worker_command.cpp).
void add_worker_command(CLI::App& app);
// `dew layout-parity`: every layout of a device count against one device
// (layout_parity_command.cpp).
void add_layout_parity_command(CLI::App& app);

// A subcommand's body, run from its CLI11 callback: its lines start with
// "dew <name>: ", an exception that escapes it is one line (exit 1), and a
// non-zero code it returns is the process's exit code as it is.
void run_subcommand(std::string_view name, const std::function<int()>& body);

// An option's check: a finite number of at least `lowest` (above it when
// `above`). CLI11's PositiveNumber and Range let nan through and print the
// range's bounds in full ("0.000000 to 1797693...").
CLI::Validator finite_number(double lowest, bool above);

// Joins this process's pool; a failed join is the pool's error.
Result<runtime::Pool> join_pool(const runtime::JoinOptions& options = {});

// Joins this process's pool for a command whose devices are CPU threads
// (worker, layout-parity, attention-check): OpenBLAS gets one thread per
// device, as one accelerator each, and a peer's failure ends the process as
// soon as it is heard. A failed join is the pool's error.
Result<runtime::Pool> join_with_cpu_devices();

// Logs the error's line and returns `code` (1: the command failed; 2: bad usage).
int report(const Error& error, int code = 1);

// Flushes and exits with `code`: a subcommand's own exit code, not CLI11's.
[[noreturn]] void finish(int code);

}  // namespace dew::cli
