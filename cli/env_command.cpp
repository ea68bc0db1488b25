// `dew env`: who this process would be in its pool, and what a JAX script
// here would be told: the first thing to run inside a misbehaving srun.
// It resolves the identity exactly as join() does (PMIx included) but
// starts no service and meets no peer.
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "dew/framework_env.h"
#include "dew/pool.h"
#include "dew/task_contract.h"
#include "dew/text.h"
#include "dew/watchdog.h"

namespace dew::cli {
namespace {

struct EnvOptions {
  bool json = false;
  bool multi_host = false;
  bool contract = false;
};

// Everything `dew env` shows, resolved.
struct Report {
  runtime::Identity id;
  runtime::Settings settings;
  bool has_secret = false;     // 64 hex digits, as the plugin and dew launch give
  std::string secret_problem;  // what is wrong with a DEW_POOL_SECRET that is there
  std::string backend = "none (one process alone)";
  std::string coordinator;                              // host:port, or empty
  std::string framework;                                // the framework's coordinator, or how it is chosen
  std::string problem;                                  // why join() would refuse, or empty
  nlohmann::json jax = nlohmann::json::object();        // jax.distributed.initialize's arguments
  nlohmann::json variables = nlohmann::json::object();  // the variables a JAX script sees
  bool grace_given = false;                             // DEW_FAILURE_GRACE_SECONDS is set
  Watchdog watchdog;                                    // the step bound every process would use
  bool watchdog_given = false;                          // from DEW_WATCHDOG, not the default
};

// The failure grace as it applies: dew worker and `import dew` end at once
// on a peer's failure unless DEW_FAILURE_GRACE_SECONDS says otherwise.
std::string grace_text(const Report& r, const std::string& grace) {
  if (r.grace_given) return "failure grace " + grace + " (DEW_FAILURE_GRACE_SECONDS)";
  return "failure grace " + grace + " for a libdew program; dew worker and import dew end at once";
}

std::string watchdog_text(const Report& r) {
  const std::string value = r.watchdog ? format_duration(*r.watchdog) : "off";
  return value + (r.watchdog_given ? " (DEW_WATCHDOG)" : " (the default; DEW_WATCHDOG is unset)") +
         ": StepWatchdog, dew worker, dew.StepWatchdog() and XLA's execution watchdog";
}

std::string seconds(std::chrono::milliseconds duration) {
  return seconds_text(std::chrono::duration<double>(duration).count());
}

bool shown_variable(const std::string& name) {
  return name.rfind("JAX_", 0) == 0 || name.rfind("DEW_", 0) == 0 || name == "XLA_FLAGS" ||
         name == "CUDA_VISIBLE_DEVICES" || name.rfind("NCCL_", 0) == 0;
}

Result<Report> resolve(const EnvOptions& options) {
  const auto env = runtime::current_environment();
  runtime::JoinOptions join;
  join.multi_host = options.multi_host;
  auto id = runtime::describe_identity(env, join);
  if (!id.ok()) return id.error();
  auto settings = runtime::resolve_settings(env, join);
  if (!settings.ok()) return settings.error();
  Report r;
  r.id = id.value();
  r.settings = settings.value();
  r.grace_given = env.count(contract::kFailureGrace.name) != 0;
  const auto bound = env.find(contract::kWatchdog.name);
  r.watchdog_given = bound != env.end();
  auto watchdog = chosen_watchdog("", "", r.watchdog_given ? std::optional<std::string>(bound->second) : std::nullopt);
  if (!watchdog.ok()) return watchdog.error();
  r.watchdog = watchdog.value();
  const runtime::Identity& i = r.id;
  const bool pooled = i.size > 1 && i.source != runtime::PoolSource::kAlone;
  if (const auto secret = env.find(contract::kPoolSecret.name); secret != env.end() && !secret->second.empty()) {
    r.has_secret = is_pool_secret(secret->second);
    if (!r.has_secret) r.secret_problem = runtime::pool_secret_problem(secret->second);
  }
  r.coordinator = i.coordinator ? i.coordinator->text() : "";
  r.framework = i.framework_coordinator
                    ? i.framework_coordinator->text() + " (from " + i.framework_coordinator_from + ")"
                    : "chosen by process 0 at the join: a free port from " + std::to_string(kFrameworkPortRange.low) +
                          " to " + std::to_string(kFrameworkPortRange.high);
  if (pooled) {
    r.backend = i.pmix ? "pmix+tcp: all_gather over PMIx fences; agreements, key-value and failures over process 0's "
                         "coordination service (address and secret shared over PMIx)"
                       : "tcp: process 0's coordination service";
    if (!i.pmix && !i.coordinator)
      r.problem = "no coordinator: join() will refuse; set DEW_COORDINATOR_ADDRESS=host:port";
    if (!i.pmix && !r.has_secret && r.secret_problem.empty()) {
      r.problem = "DEW_POOL_SECRET is not set: join() will refuse (srun --dew-pool and dew launch set it)";
    }
    if (!r.secret_problem.empty()) r.problem = r.secret_problem + ": join() will refuse";
    // Never Dew's own port: the framework's coordinator, or process 0's choice.
    r.jax["coordinator_address"] =
        i.framework_coordinator ? i.framework_coordinator->text() : std::string("(chosen by process 0 at the join)");
    r.jax["num_processes"] = i.size;
    r.jax["process_id"] = i.rank;
    // The plugin's per-task GPUs, as dew.Pool.jax_distributed_kwargs() gives them.
    if (const auto ids = env.find("JAX_LOCAL_DEVICE_IDS"); ids != env.end()) {
      // Not a list of indices (set by hand): left out, as JAX would refuse it.
      if (auto local = parse_index_list(ids->second)) r.jax["local_device_ids"] = *local;
    }
  }
  for (const auto& [name, value] : env) {
    if (!shown_variable(name)) continue;
    r.variables[name] =
        name == contract::kPoolSecret.name ? "(set, " + std::to_string(value.size()) + " characters)" : value;
  }
  return r;
}

void print_json(const Report& r) {
  const runtime::Identity& id = r.id;
  const nlohmann::json out = {
      {"source", std::string(runtime::source_name(id.source))},
      {"why", id.why},
      {"rank", id.rank},
      {"size", id.size},
      {"local_rank", id.local_rank},
      {"local_size", id.local_size},
      {"node", id.node},
      {"hostname", id.hostname},
      {"coordinator", r.coordinator.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.coordinator)},
      {"coordinator_from", id.coordinator_from},
      {"framework_coordinator",
       id.framework_coordinator ? nlohmann::json(id.framework_coordinator->text()) : nlohmann::json(nullptr)},
      {"backend", r.backend.substr(0, r.backend.find(':'))},
      {"pool_secret", r.has_secret},
      {"agreement_patience_seconds", r.settings.agreement_patience.count() / 1000.0},
      {"heartbeat_timeout_seconds", r.settings.heartbeat_timeout.count() / 1000.0},
      {"failure_grace_seconds", r.settings.failure_grace.count() / 1000.0},
      {"exit_bound_seconds", r.settings.exit_bound.count() / 1000.0},
      {"slow_after_seconds", r.settings.slow_after.count() / 1000.0},
      {"failure_grace_seconds_dew_worker_and_python", r.grace_given ? r.settings.failure_grace.count() / 1000.0 : 0.0},
      {"watchdog_seconds",
       r.watchdog ? nlohmann::json(static_cast<double>(r.watchdog->count())) : nlohmann::json(nullptr)},
      {"watchdog_from", r.watchdog_given ? contract::kWatchdog.name : "default"},
      {"jax_distributed_initialize", r.jax},
      {"variables", r.variables},
      {"problem", r.problem.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.problem)},
  };
  std::cout << out.dump(2) << "\n";
}

void print_text(const Report& r) {
  const runtime::Identity& id = r.id;
  std::cout << "source:       " << runtime::source_name(id.source) << " (" << id.why << ")\n"
            << "process:      " << id.rank << " of " << id.size << "\n"
            << "local:        " << id.local_rank << " of " << id.local_size << " on node " << id.node << " ("
            << id.hostname << ")\n"
            << "coordinator:  " << (r.coordinator.empty() ? "none" : r.coordinator)
            << (id.coordinator_from.empty() ? "" : " (from " + id.coordinator_from + ")") << "\n"
            << "framework:    " << r.framework << " (MASTER_ADDR/MASTER_PORT, JAX_COORDINATOR_ADDRESS)\n"
            << "backend:      " << r.backend << "\n"
            << "pool secret:  "
            << (r.has_secret               ? "set (DEW_POOL_SECRET, 64 hex digits)"
                : r.secret_problem.empty() ? "not set"
                                           : "not usable: " + r.secret_problem)
            << "\n"
            << "patience:     agreements " << seconds(r.settings.agreement_patience) << ", heartbeats "
            << seconds(r.settings.heartbeat_timeout) << ", " << grace_text(r, seconds(r.settings.failure_grace))
            << "; waits said after " << seconds(r.settings.slow_after) << " (DEW_SLOW_SECONDS)\n"
            << "exit bound:   " << seconds(r.settings.exit_bound)
            << " to flush and run finally:/atexit before a failed process ends hard (DEW_EXIT_BOUND_SECONDS)\n"
            << "watchdog:     " << watchdog_text(r) << "\n"
            << "jax.distributed.initialize(" << (r.jax.empty() ? "): not called, one process alone" : "");
  if (!r.jax.empty()) {
    std::vector<std::string> args;
    for (const auto& [key, value] : r.jax.items()) args.push_back(key + "=" + value.dump());
    std::cout << join(args, ", ") << ")";
  }
  std::cout << "\nvariables:\n";
  for (const auto& [name, value] : r.variables.items())
    std::cout << "  " << name << "=" << value.get<std::string>() << "\n";
}

// Every DEW_* variable (dew/task_contract.h) and its value here; the secret
// only as set or not.
int print_contract(bool json) {
  nlohmann::json rows = nlohmann::json::array();
  for (const contract::Variable* v : contract::kAll) {
    const char* value = std::getenv(v->name);
    nlohmann::json shown = nullptr;
    if (value != nullptr) {
      shown = v == &contract::kPoolSecret ? "(set, " + std::to_string(std::strlen(value)) + " characters)"
                                          : std::string(value);
    }
    rows.push_back({{"name", v->name},
                    {"meaning", v->meaning},
                    {"when_unset", v->when_unset},
                    {"written_by", v->written_by},
                    {"value", shown}});
  }
  if (json) {
    std::cout << rows.dump(2) << "\n";
    return 0;
  }
  for (const auto& row : rows) {
    std::cout << row["name"].get<std::string>() << " = "
              << (row["value"].is_null() ? "(unset: " + row["when_unset"].get<std::string>() + ")"
                                         : row["value"].get<std::string>())
              << "\n  " << row["meaning"].get<std::string>() << "; written by " << row["written_by"].get<std::string>()
              << "\n";
  }
  return 0;
}

int run(const EnvOptions& options) {
  if (options.contract) return print_contract(options.json);
  auto report_or = resolve(options);
  if (!report_or.ok()) return report(report_or.error());
  const Report& r = report_or.value();
  if (options.json) {
    print_json(r);
  } else {
    print_text(r);
  }
  if (r.problem.empty()) return 0;
  // The JSON carries it too; people reading the text get the line.
  if (!options.json) report(invalid_argument(r.problem));
  return 1;
}

}  // namespace

void add_env_command(CLI::App& app) {
  auto options = std::make_shared<EnvOptions>();
  CLI::App* command = app.add_subcommand(
      "env",
      "Show who this process is in its pool (rank, size, source: PMIx, Open MPI, Slurm, dew variables), its "
      "coordinator, and what jax.distributed would be given; joins nothing. Exits 1 when join() would refuse");
  command->add_flag("--multi-host", options->multi_host, "Treat a one-task Slurm step as a pool of one (multi_host)");
  command->add_flag("--json", options->json, "Print JSON for programs");
  command->add_flag("--contract", options->contract,
                    "Print every DEW_* variable Dew hands a task or reads: its value here (or what holds when it is "
                    "unset), what it means and who writes it");
  command->callback([options] { run_subcommand("env", [&] { return run(*options); }); });
}

}  // namespace dew::cli
