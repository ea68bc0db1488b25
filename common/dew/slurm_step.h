// The Slurm-step rules, once (the plugin, the pool's identity and its
// failure path all use them):
//
//   rank_source     which launcher's variables say this process's rank, in
//                   the pool's precedence: a PMIx server's, Open MPI's (an
//                   mpirun inside an allocation inherits SLURM_*), a Slurm
//                   step's, Dew's own
//   rank_variable   the variable that holds the rank for a source
//   rank0_node      the node that runs rank 0, from the step's nodelist and
//                   distribution
//   tasks_on_node   a node's task count from SLURM_STEP_TASKS_PER_NODE
//   is_task_identity_variable
//                   whether a variable is one a launcher sets in each of its
//                   tasks to say who that task is (what a process that
//                   launches processes of its own must not hand them down)
//
// Pure: each takes the environment or the values; nothing here reads the
// process's own environment.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "dew/export.h"
#include "dew/result.h"
#include "dew/task_contract.h"

namespace dew {

// A process's environment, name to value.
using Environment = std::map<std::string, std::string>;

enum class RankSource { kNone, kPmix, kOpenMpi, kSlurm, kDew };

// PMIX_NAMESPACE and a PMIX_SERVER_URI* variable: a PMIx server is there
// (srun --mpi=pmix, prterun, mpirun).
DEW_API bool has_pmix_server(const Environment& env);

DEW_API RankSource rank_source(const Environment& env);

// "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "DEW_PROCESS_ID";
// nullptr for kNone.
DEW_API const char* rank_variable(RankSource source);

// The node that runs rank 0: the nodelist's first node for srun's default
// distribution and for block, cyclic, plane and "*" (whatever follows ':', '='
// or ','). Any other distribution (arbitrary, or one Slurm adds later) does not
// say which: kUnsupported naming it and the allowed ones; the caller adds
// how to name the host instead. A bad nodelist is kInvalidArgument, a
// missing one kNotFound, both prefixed "SLURM_STEP_NODELIST".
DEW_API Result<std::string> rank0_node(const std::optional<std::string>& step_nodelist,
                                       const std::optional<std::string>& distribution);

// Tasks on node `node` (0-based) from SLURM_STEP_TASKS_PER_NODE ("3,1",
// "2(x2),1"); nullopt when the layout is malformed or has no such node.
DEW_API std::optional<int> tasks_on_node(const std::string& layout, int node);

// A Slurm step's task variables (SLURM_PROCID, SLURM_NTASKS,
// SLURM_STEP_NODELIST, ...), PMIx's and PMI's (PMIX_RANK, PMIX_NAMESPACE,
// PMIX_SERVER_URI*, PMI_RANK, ...), Open MPI's OMPI_COMM_WORLD_*, and the
// plugin's per-task DEW_NODE_ID and DEW_MULTI_HOST. Job-wide variables
// (SLURM_JOB_ID, SLURM_JOB_NODELIST, ...) are not: they stay true for a
// process started inside the job by another launcher.
DEW_API bool is_task_identity_variable(std::string_view name);

}  // namespace dew
