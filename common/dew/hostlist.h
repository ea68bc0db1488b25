// Slurm hostlists: what SLURM_STEP_NODELIST and SLURM_JOB_NODELIST hold.
// Shared by the plugin (the node of rank 0) and the pool (the coordinator of
// a Slurm step without the plugin).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "dew/result.h"

namespace dew {

// Expands "n[1-3,7]", "gpu[01-10]", "r[1-2]-n[1-2]", "a,b[1-2],c" into host
// names, in Slurm's order. At most `max_hosts` names (an error beyond, so a
// hostile range cannot exhaust memory). Errors (kInvalidArgument) quote the
// hostlist.
Result<std::vector<std::string>> expand_hostlist(std::string_view hostlist, std::size_t max_hosts = 1u << 16);

}  // namespace dew
