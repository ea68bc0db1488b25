// srun's side of spank_dew.so, and what it carries to the nodes: edges
// that call Slurm (node lookups) and the environment. The carriers are
// SLURM_* variables because srun passes those to the tasks even with
// --export=NONE (SPANK_* it drops, measured on Slurm 22.05).
#pragma once

#include <cstddef>

#include "verdict_channel.h"

namespace dew::spank {

// The step's secret travels from srun to the tasks in a SLURM_* variable:
// srun 22.05 passes those even with --export=NONE (SPANK_* it drops).
inline constexpr const char* kSecretCarrier = "SLURM_DEW_POOL_SECRET";
// srun's word on process 0's node, "NODE=ADDRESS", when its name does not
// resolve where srun runs: that node's NodeAddr, from Slurm.
inline constexpr const char* kRank0AddressCarrier = "SLURM_DEW_RANK0_NODE_ADDR";
// The port srun's plugin takes the nodes' failure notices at (its host:
// SLURM_SRUN_COMM_HOST, Slurm's own address of srun for the nodes).
inline constexpr const char* kVerdictPortCarrier = "SLURM_DEW_VERDICT_PORT";
inline constexpr std::size_t kSecretBytes = 32;

// Process 0's node as the other nodes reach it: its name where that resolves
// (here, where srun runs), else its NodeAddr, asked of Slurm by srun (a
// client, where Slurm's API is safe: inside slurmstepd 24.11 the RPC's
// lock is held and the step dies). Carried to the tasks in the environment.
int look_up_rank0_node();
// srun: the port the nodes' failure notices come to, carried to them as the
// secret is. Without one each node names its own failure, as it can.
int listen_for_notices(VerdictListener& listener);
// srun: the step's pool secret, drawn and carried to the tasks.
int draw_pool_secret();

}  // namespace dew::spank
