#include "dew/slurm_step.h"

#include <cstdio>

#include "dew/hostlist.h"
#include "dew/task_contract.h"
#include "dew/text.h"

namespace dew {
namespace {

bool has(const Environment& env, const char* name) { return env.count(name) != 0; }

}  // namespace

bool has_pmix_server(const Environment& env) {
  if (!has(env, "PMIX_NAMESPACE")) return false;
  const auto uri = env.lower_bound("PMIX_SERVER_URI");
  return uri != env.end() && uri->first.rfind("PMIX_SERVER_URI", 0) == 0;
}

RankSource rank_source(const Environment& env) {
  if (has_pmix_server(env)) return RankSource::kPmix;
  if (has(env, "OMPI_COMM_WORLD_RANK") || has(env, "OMPI_COMM_WORLD_SIZE")) return RankSource::kOpenMpi;
  if (has(env, "SLURM_STEP_NODELIST") && (has(env, "SLURM_PROCID") || has(env, "SLURM_NTASKS"))) {
    return RankSource::kSlurm;
  }
  if (has(env, contract::kProcessId.name) || has(env, contract::kProcessCount.name)) return RankSource::kDew;
  return RankSource::kNone;
}

const char* rank_variable(RankSource source) {
  switch (source) {
    case RankSource::kPmix:
      return "PMIX_RANK";
    case RankSource::kOpenMpi:
      return "OMPI_COMM_WORLD_RANK";
    case RankSource::kSlurm:
      return "SLURM_PROCID";
    case RankSource::kDew:
      return contract::kProcessId.name;
    case RankSource::kNone:
      break;
  }
  return nullptr;
}

Result<std::string> rank0_node(const std::optional<std::string>& step_nodelist,
                               const std::optional<std::string>& distribution) {
  if (distribution && !distribution->empty()) {
    const auto kind = distribution->substr(0, distribution->find_first_of(":,="));
    if (kind != "block" && kind != "cyclic" && kind != "plane" && kind != "*") {
      return unsupported("the distribution " + dew::quoted(*distribution) +
                         " does not tell which node runs rank 0; allowed: block, cyclic, plane (srun's default is "
                         "block)");
    }
  }
  if (!step_nodelist) return not_found("SLURM_STEP_NODELIST is not set, so the node of rank 0 is unknown");
  auto hosts = expand_hostlist(*step_nodelist);
  if (!hosts.ok()) return hosts.error().prefixed("SLURM_STEP_NODELIST: ");
  return hosts.value().front();
}

std::optional<int> tasks_on_node(const std::string& layout, int node) {
  int index = 0;
  std::size_t at = 0;
  while (at < layout.size()) {
    std::size_t comma = layout.find(',', at);
    if (comma == std::string::npos) comma = layout.size();
    const std::string part = layout.substr(at, comma - at);
    int tasks = 0;
    int repeat = 1;
    if (std::sscanf(part.c_str(), "%d(x%d)", &tasks, &repeat) < 1 || tasks < 0 || repeat < 1) return std::nullopt;
    if (node < index + repeat) return tasks;
    index += repeat;
    at = comma + 1;
  }
  return std::nullopt;
}

bool is_task_identity_variable(std::string_view name) {
  static constexpr std::string_view kNames[] = {"SLURM_PROCID",
                                                "SLURM_LOCALID",
                                                "SLURM_NODEID",
                                                "SLURM_NTASKS",
                                                "SLURM_NPROCS",
                                                "SLURM_GTIDS",
                                                "SLURM_STEP_ID",
                                                "SLURM_STEPID",
                                                "SLURM_STEP_NODELIST",
                                                "SLURM_STEP_NUM_NODES",
                                                "SLURM_STEP_NUM_TASKS",
                                                "SLURM_STEP_TASKS_PER_NODE",
                                                "SLURM_TASK_PID",
                                                "SLURM_SRUN_COMM_HOST",
                                                "SLURM_SRUN_COMM_PORT",
                                                "SLURM_STEP_LAUNCHER_PORT",
                                                "SLURM_LAUNCH_NODE_IPADDR",
                                                "SLURM_DISTRIBUTION",
                                                "PMIX_RANK",
                                                "PMIX_NAMESPACE",
                                                "PMIX_ID",
                                                "PMI_RANK",
                                                "PMI_SIZE",
                                                "PMI_FD",
                                                contract::kNodeId.name,
                                                contract::kMultiHost.name};
  for (const auto known : kNames) {
    if (name == known) return true;
  }
  return name.rfind("PMIX_SERVER_URI", 0) == 0 || name.rfind("OMPI_COMM_WORLD_", 0) == 0;
}

}  // namespace dew
