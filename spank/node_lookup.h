// Process 0's node as the other nodes reach it: an edge of the plugin that
// asks the resolver and, when the name does not resolve, Slurm itself (the
// node's NodeAddr). What to make of the answer is coordinator_host()'s, in
// the core (pool_plan.h).
#pragma once

#include <optional>
#include <string>

namespace dew::spank {

struct NodeLookup {
  bool name_resolves = true;
  std::optional<std::string> node_address;  // NodeAddr, asked only when the name does not resolve
  std::string why_none;                     // when Slurm gave no address: why
};

// Runs in srun, once per step (local_user_init). Not in slurmstepd: there,
// on Slurm 24.11, the RPC's auth lock is already held and the step dies.
NodeLookup look_up_node(const std::string& node);

}  // namespace dew::spank
