// The framework handoff: what a training framework's own rendezvous
// (jax.distributed's coordinator, torch.distributed's env:// TCPStore) is
// told, by the plugin and `dew launch` before a task starts and by the pool
// (Pool::framework_variables) after it joins. The framework never gets Dew's
// own coordinator port: process 0 would have to bind it a second time.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dew/coordinator_port.h"
#include "dew/export.h"
#include "dew/result.h"
#include "dew/task_contract.h"

namespace dew {

// Where a step's framework port is derived from: beside Dew's default range
// (20000-29999), below Linux's ephemeral ports too, so the same step of the
// same job gets ports in two ranges that never meet.
inline constexpr PortRange kFrameworkPortRange{10000, 19999};

// Refuses a framework range that shares a port with Dew's (a step's
// framework port could then be another step's Dew port), naming both.
DEW_API Result<Done> check_framework_range(PortRange dew_range, PortRange framework_range);

// What one process of a pool is, as the frameworks' variables say it.
struct DEW_API FrameworkPlace {
  std::uint32_t rank = 0;
  std::uint32_t size = 1;
  std::uint32_t local_rank = 0;
  std::uint32_t local_size = 1;
  std::uint32_t node = 0;  // the node's index in the pool (torchrun's GROUP_RANK)
  std::string host;        // where process 0's framework coordinator listens
  std::uint16_t port = 0;
};

// The names framework_variables sets, in its order.
inline constexpr const char* kFrameworkVariableNames[] = {contract::kFrameworkCoordinator.name,
                                                          "JAX_COORDINATOR_ADDRESS",
                                                          "MASTER_ADDR",
                                                          "MASTER_PORT",
                                                          "RANK",
                                                          "WORLD_SIZE",
                                                          "LOCAL_RANK",
                                                          "LOCAL_WORLD_SIZE",
                                                          "GROUP_RANK"};

// torchrun's contract (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// GROUP_RANK, MASTER_ADDR, MASTER_PORT), JAX's JAX_COORDINATOR_ADDRESS and
// Dew's own DEW_FRAMEWORK_COORDINATOR (what libdew agrees on), all naming
// the framework's coordinator at host:port.
DEW_API std::vector<std::pair<std::string, std::string>> framework_variables(const FrameworkPlace& place);

}  // namespace dew
