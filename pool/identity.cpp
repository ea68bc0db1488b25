// The pure half of join(): which source says who this process is, and the
// settings. No I/O here besides reading the process's environment in
// current_environment().
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "dew/coordinator_port.h"
#include "dew/hostlist.h"
#include "dew/pool.h"
#include "dew/slurm_step.h"
#include "dew/task_contract.h"
#include "dew/text.h"

extern char** environ;

namespace dew::runtime {
namespace {

std::optional<std::string> lookup(const Environment& env, const std::string& name) {
  auto found = env.find(name);
  if (found == env.end()) return std::nullopt;
  return found->second;
}

Result<int> parse_count(const std::string& value, const std::string& name) {
  const auto number = parse_whole<int>(value);
  if (!number) return not_allowed(name, value, "a whole number (0, 1, 2, ...)");
  return *number;
}

// A rank/size pair from two variables, both or neither.
struct RankSize {
  int rank = 0;
  int size = 1;
};

Result<RankSize> rank_and_size(const Environment& env, const std::string& rank_name, const std::string& size_name) {
  const auto rank_text = lookup(env, rank_name);
  const auto size_text = lookup(env, size_name);
  if (!rank_text) return invalid_argument(size_name + " is set but " + rank_name + " is not: both or neither");
  if (!size_text) return invalid_argument(rank_name + " is set but " + size_name + " is not: both or neither");
  auto rank = parse_count(*rank_text, rank_name);
  if (!rank.ok()) return rank.error();
  auto size = parse_count(*size_text, size_name);
  if (!size.ok()) return size.error();
  if (size.value() == 0) return invalid_argument(size_name + "=0: a pool has at least one process");
  if (rank.value() >= size.value()) {
    return invalid_argument(rank_name + "=" + *rank_text + " is not below " + size_name + "=" + *size_text +
                            " (ranks are 0.." + std::to_string(size.value() - 1) + ")");
  }
  return RankSize{rank.value(), size.value()};
}

// An optional local rank/size pair; defaults when neither is set.
Result<RankSize> local_rank_and_size(const Environment& env, const std::string& rank_name, const std::string& size_name,
                                     RankSize fallback) {
  if (!lookup(env, rank_name) && !lookup(env, size_name)) return fallback;
  return rank_and_size(env, rank_name, size_name);
}

Result<int> optional_count(const Environment& env, const std::string& name, int fallback) {
  const auto text = lookup(env, name);
  if (!text) return fallback;
  return parse_count(*text, name);
}

// DEW_COORDINATOR_ADDRESS, else JAX_COORDINATOR_ADDRESS.
Result<std::optional<Address>> coordinator_from_env(const Environment& env, std::string& from) {
  for (const char* name : {contract::kCoordinatorAddress.name, "JAX_COORDINATOR_ADDRESS"}) {
    if (auto text = lookup(env, name)) {
      auto address = parse_address(*text, name);
      if (!address.ok()) return address.error();
      from = name;
      return std::optional<Address>(address.value());
    }
  }
  return std::optional<Address>();
}

Result<Identity> from_slurm(const Environment& env, const JoinOptions& options) {
  auto pair = rank_and_size(env, "SLURM_PROCID", "SLURM_NTASKS");
  if (!pair.ok()) return pair.error();
  Identity id;
  id.source = PoolSource::kSlurm;
  id.rank = pair.value().rank;
  id.size = pair.value().size;
  auto local_rank = optional_count(env, "SLURM_LOCALID", 0);
  if (!local_rank.ok()) return local_rank.error();
  auto node = optional_count(env, "SLURM_NODEID", 0);
  if (!node.ok()) return node.error();
  id.local_rank = local_rank.value();
  id.node = node.value();
  id.local_size = 1;
  if (auto layout = lookup(env, "SLURM_STEP_TASKS_PER_NODE")) {
    if (auto tasks = tasks_on_node(*layout, id.node)) id.local_size = *tasks;
  }
  if (id.local_rank >= id.local_size) id.local_size = id.local_rank + 1;
  if (id.size == 1 && !options.multi_host) {
    id.source = PoolSource::kAlone;
    id.why = "SLURM_NTASKS=1 forms no pool unless multi_host is set";
    return id;
  }
  id.why = "SLURM_PROCID and SLURM_STEP_NODELIST are set (a Slurm step)";
  auto coordinator = coordinator_from_env(env, id.coordinator_from);
  if (!coordinator.ok()) return coordinator.error();
  if (coordinator.value()) {
    id.coordinator = coordinator.value();
    return id;
  }
  // Without the SPANK plugin: rank 0's node by the plugin's own rule and its
  // port formula over its default range, as jax.distributed does.
  auto first = rank0_node(lookup(env, "SLURM_STEP_NODELIST"), lookup(env, "SLURM_DISTRIBUTION"));
  if (!first.ok()) {
    if (first.error().code == ErrorCode::kInvalidArgument) return first.error();
    return Error{first.error().code, first.error().message + "; or give it with DEW_COORDINATOR_ADDRESS=HOST:PORT"};
  }
  auto job = optional_count(env, "SLURM_JOB_ID", 0);
  if (!job.ok()) return job.error();
  auto step = optional_count(env, "SLURM_STEP_ID", 0);
  if (!step.ok()) return step.error();
  id.coordinator = Address{
      first.value(), derive_port(static_cast<std::uint32_t>(job.value()), static_cast<std::uint32_t>(step.value()))};
  id.coordinator_from = "rank 0's node of SLURM_STEP_NODELIST, port from SLURM_JOB_ID and SLURM_STEP_ID";
  return id;
}

// The variables of a launcher that names rank, size and local rank/size.
struct LauncherVariables {
  PoolSource source;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
  const char* why;
};

constexpr LauncherVariables kDewVariables = {
    PoolSource::kDew,
    contract::kProcessId.name,
    contract::kProcessCount.name,
    contract::kLocalProcessId.name,
    contract::kLocalProcessCount.name,
    "DEW_PROCESS_ID and DEW_PROCESS_COUNT are set (srun --dew-pool or dew launch)"};
constexpr LauncherVariables kOpenMpiVariables = {
    PoolSource::kOpenMpi,         "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",       "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE are set (mpirun)"};

Result<Identity> from_launcher(const Environment& env, const LauncherVariables& names) {
  auto pair = rank_and_size(env, names.rank, names.size);
  if (!pair.ok()) return pair.error();
  Identity id;
  id.source = names.source;
  id.why = names.why;
  id.rank = pair.value().rank;
  id.size = pair.value().size;
  auto local = local_rank_and_size(env, names.local_rank, names.local_size, {0, 1});
  if (!local.ok()) return local.error();
  id.local_rank = local.value().rank;
  id.local_size = local.value().size;
  auto coordinator = coordinator_from_env(env, id.coordinator_from);
  if (!coordinator.ok()) return coordinator.error();
  id.coordinator = coordinator.value();
  return id;
}

Result<Identity> from_dew(const Environment& env) {
  auto found = from_launcher(env, kDewVariables);
  if (!found.ok()) return found;
  Identity& id = found.value();
  auto node = optional_count(env, contract::kNodeId.name, 0);
  if (!node.ok()) return node.error();
  id.node = node.value();
  if (!id.coordinator && id.size > 1) {
    return invalid_argument(
        "DEW_PROCESS_ID is set but neither DEW_COORDINATOR_ADDRESS nor JAX_COORDINATOR_ADDRESS "
        "is: a pool of " +
        std::to_string(id.size) + " needs its coordinator's host:port");
  }
  return found;
}

Result<std::chrono::milliseconds> seconds_setting(const Environment& env, const char* name,
                                                  std::optional<std::chrono::milliseconds> option,
                                                  std::chrono::milliseconds fallback) {
  if (option) {
    if (option->count() <= 0) return invalid_argument(std::string(name) + ": the option must be positive");
    return *option;
  }
  const auto text = lookup(env, name);
  if (!text) return fallback;
  char* end = nullptr;
  const double seconds = std::strtod(text->c_str(), &end);
  if (text->empty() || end != text->c_str() + text->size() || !std::isfinite(seconds) || seconds <= 0 ||
      seconds > 1e9) {
    return invalid_argument(std::string(name) + "='" + *text +
                            "' is not a positive number of seconds (e.g. 30 or 0.5)");
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(seconds * 1000)));
}

}  // namespace

std::string_view source_name(PoolSource source) {
  switch (source) {
    case PoolSource::kExplicit:
      return "explicit";
    case PoolSource::kPmix:
      return "pmix";
    case PoolSource::kOpenMpi:
      return "openmpi";
    case PoolSource::kSlurm:
      return "slurm";
    case PoolSource::kDew:
      return "dew";
    case PoolSource::kAlone:
      return "alone";
  }
  return "unknown";
}

std::string Address::text() const { return host_port(host, std::to_string(port)); }

Result<Address> parse_address(std::string_view text, std::string_view name) {
  const std::string quoted = std::string(name) + "='" + std::string(text) + "'";
  std::string_view host;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos)
      return invalid_argument(quoted + " has no closing ']' (expected [v6 address]:port)");
    host = text.substr(1, close - 1);
    if (close + 1 >= text.size() || text[close + 1] != ':')
      return invalid_argument(quoted + " has no port (expected [v6 address]:port)");
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return invalid_argument(quoted + " has no port (expected host:port)");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return invalid_argument(quoted + ": write an IPv6 address in brackets, [addr]:port");
    }
  }
  if (host.empty()) return invalid_argument(quoted + " has no host (expected host:port)");
  unsigned number = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), number);
  if (port.empty() || ec != std::errc() || ptr != port.data() + port.size() || number == 0 || number > 65535) {
    return invalid_argument(quoted + ": port '" + std::string(port) + "' is not 1-65535");
  }
  return Address{std::string(host), static_cast<std::uint16_t>(number)};
}

Environment current_environment() {
  Environment env;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string_view text(*entry);
    const auto equals = text.find('=');
    if (equals == std::string_view::npos) continue;
    env.emplace(std::string(text.substr(0, equals)), std::string(text.substr(equals + 1)));
  }
  return env;
}

namespace {

// torchrun (any torch elastic agent) starts each worker with
// TORCHELASTIC_RUN_ID beside its own RANK and WORLD_SIZE: the worker belongs
// to torchrun's rendezvous. A pool formed from any other fact would be
// wrong: from none, "alone" (one pool a worker, each rewriting torchrun's
// RANK to 0); from a Slurm step, one SLURM_PROCID for all the workers of a
// task. So the join refuses, naming torchrun's facts and the launcher's
// that disagree, and nothing is rewritten.
std::optional<Error> refusal_under_torchrun(const Environment& env, RankSource source) {
  const auto run_id = lookup(env, "TORCHELASTIC_RUN_ID");
  if (!run_id) return std::nullopt;
  const auto fact = [&env](const std::string& name) { return name + "=" + lookup(env, name).value_or("(unset)"); };
  std::string message = "this process is a worker of torchrun (TORCHELASTIC_RUN_ID=" + quoted(*run_id) + ", " +
                        fact("RANK") + ", " + fact("WORLD_SIZE") + ", " + fact("LOCAL_RANK") + ")";
  if (const char* rank_name = rank_variable(source)) {
    message += ", started by a launcher whose " + fact(rank_name) +
               " counts torchrun's agents, not its workers, so the two disagree";
  }
  return unsupported(message +
                     "; Dew forms its pool from the launcher that starts each process of the script: run "
                     "`srun --dew-pool ... python SCRIPT` or `dew launch ... python SCRIPT` instead of torchrun "
                     "(both set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT as torchrun does)");
}

// DEW_PROCESS_ID and DEW_PROCESS_COUNT beside a Slurm step's or mpirun's
// task variables that say otherwise: one of the two was inherited (a
// process started by something that is not a Dew launcher, inside a task of
// one that is, or by one that handed down its own task's variables). The
// join refuses naming both; neither is picked in silence.
std::optional<Error> disagreement_with_dew(const Environment& env, RankSource source) {
  const char* rank_name = source == RankSource::kSlurm     ? "SLURM_PROCID"
                          : source == RankSource::kOpenMpi ? "OMPI_COMM_WORLD_RANK"
                                                           : nullptr;
  const char* size_name = source == RankSource::kSlurm ? "SLURM_NTASKS" : "OMPI_COMM_WORLD_SIZE";
  if (!rank_name) return std::nullopt;
  auto dew = rank_and_size(env, contract::kProcessId.name, contract::kProcessCount.name);
  auto theirs = rank_and_size(env, rank_name, size_name);
  if (!dew.ok() || !theirs.ok()) return std::nullopt;  // none of Dew's, or a bad value said elsewhere
  if (dew.value().rank == theirs.value().rank && dew.value().size == theirs.value().size) return std::nullopt;
  const auto pair = [&env](const char* rank, const char* size) {
    return std::string(rank) + "=" + lookup(env, rank).value_or("") + " " + size + "=" + lookup(env, size).value_or("");
  };
  return invalid_argument(
      "this process has two identities that disagree: " +
      pair(contract::kProcessId.name, contract::kProcessCount.name) + " (a Dew launcher's) and " +
      pair(rank_name, size_name) + (source == RankSource::kSlurm ? " (a Slurm step's)" : " (mpirun's)") +
      "; one of them was inherited from the process that started this one. Start it with one launcher: "
      "`dew launch` hands its processes its own variables only, `srun --dew-pool` sets Dew's to match Slurm's");
}

Result<Identity> identity_of_source(const Environment& env, const JoinOptions& options) {
  if (options.rank || options.size) {
    if (!options.rank || !options.size)
      return invalid_argument("JoinOptions: rank and size go together: set both or neither");
    if (*options.size <= 0)
      return invalid_argument("JoinOptions: size=" + std::to_string(*options.size) +
                              ": a pool has at least one process");
    if (*options.rank < 0 || *options.rank >= *options.size) {
      return invalid_argument("JoinOptions: rank=" + std::to_string(*options.rank) + " is not in 0.." +
                              std::to_string(*options.size - 1));
    }
    Identity id;
    id.source = PoolSource::kExplicit;
    id.why = "rank and size given to join()";
    id.rank = *options.rank;
    id.size = *options.size;
    id.local_rank = id.rank;
    id.local_size = id.size;
    if (options.coordinator) {
      auto address = parse_address(*options.coordinator, "JoinOptions.coordinator");
      if (!address.ok()) return address.error();
      id.coordinator = address.value();
      id.coordinator_from = "JoinOptions.coordinator";
    } else {
      auto coordinator = coordinator_from_env(env, id.coordinator_from);
      if (!coordinator.ok()) return coordinator.error();
      id.coordinator = coordinator.value();
    }
    if (!id.coordinator && id.size > 1)
      return invalid_argument("JoinOptions: a pool of " + std::to_string(id.size) + " needs a coordinator (host:port)");
    return id;
  }

  Result<Identity> found = Identity{};
  const RankSource source = rank_source(env);
  if (auto refusal = refusal_under_torchrun(env, source)) return *refusal;
  if (auto disagreement = disagreement_with_dew(env, source)) return *disagreement;
  if (source == RankSource::kPmix) {
    Identity id;
    id.source = PoolSource::kPmix;
    id.why = "PMIX_NAMESPACE and a PMIX_SERVER_URI variable are set (srun --mpi=pmix, prterun, mpirun)";
    id.pmix = true;
    found = id;
  } else if (source == RankSource::kOpenMpi) {
    // Before Slurm: mpirun inside an allocation inherits SLURM_*.
    found = from_launcher(env, kOpenMpiVariables);
  } else if (source == RankSource::kSlurm) {
    // srun --dew-pool --dew-multi-host sets DEW_MULTI_HOST=1 in every task.
    JoinOptions slurm_options = options;
    if (auto multi = lookup(env, contract::kMultiHost.name)) {
      if (*multi != "0" && *multi != "1") {
        return invalid_argument("DEW_MULTI_HOST=" + quoted(*multi) +
                                " is not allowed; allowed: 1 (a one-task step forms a pool of one) or 0");
      }
      slurm_options.multi_host = options.multi_host || *multi == "1";
    }
    found = from_slurm(env, slurm_options);
  } else if (source == RankSource::kDew) {
    found = from_dew(env);
  } else {
    Identity id;
    id.why = "no PMIx, Open MPI, Slurm step or DEW_PROCESS_ID variables: one process alone";
    found = id;
  }
  return found;
}

}  // namespace

Result<Identity> resolve_identity(const Environment& env, const JoinOptions& options) {
  auto found = identity_of_source(env, options);
  if (!found.ok()) return found;
  // The framework's coordinator, when a launcher chose it (the plugin, dew
  // launch); else process 0 chooses one at the join.
  if (auto text = lookup(env, contract::kFrameworkCoordinator.name)) {
    auto address = parse_address(*text, contract::kFrameworkCoordinator.name);
    if (!address.ok()) return address.error();
    found.value().framework_coordinator = address.value();
    found.value().framework_coordinator_from = contract::kFrameworkCoordinator.name;
  }
  return found;
}

Result<Settings> resolve_settings(const Environment& env, const JoinOptions& options) {
  Settings settings;
  auto patience =
      seconds_setting(env, contract::kAgreementPatience.name, options.agreement_patience, settings.agreement_patience);
  if (!patience.ok()) return patience.error();
  auto heartbeat =
      seconds_setting(env, contract::kHeartbeatTimeout.name, options.heartbeat_timeout, settings.heartbeat_timeout);
  if (!heartbeat.ok()) return heartbeat.error();
  auto grace = seconds_setting(env, contract::kFailureGrace.name, options.failure_grace,
                               options.failure_grace_fallback.value_or(settings.failure_grace));
  if (!grace.ok()) return grace.error();
  auto join_timeout = seconds_setting(env, contract::kJoinTimeout.name, options.join_timeout, settings.join_timeout);
  if (!join_timeout.ok()) return join_timeout.error();
  settings.agreement_patience = patience.value();
  settings.heartbeat_timeout = heartbeat.value();
  settings.failure_grace = grace.value();
  settings.join_timeout = join_timeout.value();
  auto exit_bound = seconds_setting(env, contract::kExitBound.name, options.exit_bound, settings.exit_bound);
  if (!exit_bound.ok()) return exit_bound.error();
  settings.exit_bound = exit_bound.value();
  auto slow_after = seconds_setting(env, contract::kSlowSeconds.name, options.slow_after, settings.slow_after);
  if (!slow_after.ok()) return slow_after.error();
  settings.slow_after = slow_after.value();
  return settings;
}

}  // namespace dew::runtime
