// `dew env`: who this process would be in its pool, and what a JAX script
// here would be told: the first thing to run inside a misbehaving srun.
// It resolves the identity exactly as join() does (PMIx included) but
// starts no service and meets no peer.
#include <unistd.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "pmix_session.h"
#include "pool.h"

namespace dew::cli {
namespace {

struct EnvOptions {
  bool json = false;
  bool multi_host = false;
};

std::string seconds(std::chrono::milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", static_cast<double>(duration.count()) / 1000.0);
  return text;
}

int run(const EnvOptions& options) {
  const auto env = runtime::current_environment();
  runtime::JoinOptions join;
  join.multi_host = options.multi_host;
  auto resolved = runtime::resolve_identity(env, join);
  if (!resolved.ok()) {
    std::cerr << "dew env: " << resolved.error().message << "\n";
    return 1;
  }
  auto settings = runtime::resolve_settings(env, join);
  if (!settings.ok()) {
    std::cerr << "dew env: " << settings.error().message << "\n";
    return 1;
  }
  runtime::Identity id = resolved.value();
  std::string problem;
  if (id.source == runtime::PoolSource::kPmix) {
    auto pmix = runtime::PmixSession::init();
    if (!pmix.ok()) {
      std::cerr << "dew env: " << pmix.error().message << "\n";
      return 1;
    }
    pmix.value()->fill(id);
  }
  if (id.hostname.empty()) {
    char name[256] = {};
    if (gethostname(name, sizeof name - 1) == 0) id.hostname = name;
  }
  const bool pooled = id.size > 1 && id.source != runtime::PoolSource::kAlone;
  const bool has_secret = env.count("DEW_POOL_SECRET") && !env.at("DEW_POOL_SECRET").empty();
  std::string backend = "none (one process alone)";
  if (pooled) {
    backend = id.pmix ? "pmix+tcp: all_gather over PMIx fences; agreements, key-value and failures over process 0's "
                        "coordination service (address and secret shared over PMIx)"
                      : "tcp: process 0's coordination service";
    if (!id.pmix && !id.coordinator) problem = "no coordinator: join() will refuse; set DEW_COORDINATOR_ADDRESS=host:port";
    if (!id.pmix && !has_secret) {
      problem = "DEW_POOL_SECRET is not set: join() will refuse (srun --dew-pool and dew launch set it)";
    }
  }
  const std::string coordinator = id.coordinator ? id.coordinator->text() : "";

  // What jax.distributed.initialize would be given.
  nlohmann::json jax = nlohmann::json::object();
  if (pooled) {
    if (!coordinator.empty()) jax["coordinator_address"] = coordinator;
    jax["num_processes"] = id.size;
    jax["process_id"] = id.rank;
  }
  nlohmann::json variables = nlohmann::json::object();
  for (const auto& [name, value] : env) {
    const bool shown = name.rfind("JAX_", 0) == 0 || name.rfind("DEW_", 0) == 0 || name == "XLA_FLAGS" ||
                       name == "CUDA_VISIBLE_DEVICES" || name.rfind("NCCL_", 0) == 0;
    if (!shown) continue;
    variables[name] = name == "DEW_POOL_SECRET" ? "(set, " + std::to_string(value.size()) + " characters)" : value;
  }

  if (options.json) {
    nlohmann::json out = {
        {"source", std::string(runtime::source_name(id.source))},
        {"why", id.why},
        {"rank", id.rank},
        {"size", id.size},
        {"local_rank", id.local_rank},
        {"local_size", id.local_size},
        {"node", id.node},
        {"hostname", id.hostname},
        {"coordinator", coordinator.empty() ? nlohmann::json(nullptr) : nlohmann::json(coordinator)},
        {"coordinator_from", id.coordinator_from},
        {"backend", backend.substr(0, backend.find(':'))},
        {"pool_secret", has_secret},
        {"agreement_patience_seconds", settings.value().agreement_patience.count() / 1000.0},
        {"heartbeat_timeout_seconds", settings.value().heartbeat_timeout.count() / 1000.0},
        {"failure_grace_seconds", settings.value().failure_grace.count() / 1000.0},
        {"jax_distributed_initialize", jax},
        {"variables", variables},
        {"problem", problem.empty() ? nlohmann::json(nullptr) : nlohmann::json(problem)},
    };
    std::cout << out.dump(2) << "\n";
    return problem.empty() ? 0 : 1;
  }
  std::cout << "source:       " << runtime::source_name(id.source) << " (" << id.why << ")\n"
            << "process:      " << id.rank << " of " << id.size << "\n"
            << "local:        " << id.local_rank << " of " << id.local_size << " on node " << id.node << " ("
            << id.hostname << ")\n"
            << "coordinator:  " << (coordinator.empty() ? "none" : coordinator)
            << (id.coordinator_from.empty() ? "" : " (from " + id.coordinator_from + ")") << "\n"
            << "backend:      " << backend << "\n"
            << "pool secret:  " << (has_secret ? "set (DEW_POOL_SECRET)" : "not set") << "\n"
            << "patience:     agreements " << seconds(settings.value().agreement_patience) << ", heartbeats "
            << seconds(settings.value().heartbeat_timeout) << ", failure grace " << seconds(settings.value().failure_grace)
            << "\n"
            << "jax.distributed.initialize(" << (jax.empty() ? "): not called, one process alone" : "") ;
  if (!jax.empty()) {
    std::string args;
    for (const auto& [key, value] : jax.items()) args += (args.empty() ? "" : ", ") + key + "=" + value.dump();
    std::cout << args << ")";
  }
  std::cout << "\nvariables:\n";
  for (const auto& [name, value] : variables.items()) std::cout << "  " << name << "=" << value.get<std::string>() << "\n";
  if (!problem.empty()) {
    std::cerr << "dew env: " << problem << "\n";
    return 1;
  }
  return 0;
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
  command->callback([options] {
    if (const int code = run(*options); code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace dew::cli
