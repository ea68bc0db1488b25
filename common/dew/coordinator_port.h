// The coordinator port of a Slurm step, derived from its job and step ids:
// the plugin sets it, and the pool finds the same port under Slurm without
// the plugin. `dew launch` draws from the same default range.
#pragma once

#include <cstdint>

#include "dew/export.h"

namespace dew {

// Ports a coordinator may take; the default stays below Linux's ephemeral
// range (32768-60999), so no client's outgoing connection holds one.
// The lowest port any launcher gives a coordinator (the plugin's --dew-port
// and port ranges, dew launch --port): the ports below need root.
inline constexpr std::uint16_t kLowestPort = 1024;

struct DEW_API PortRange {
  std::uint16_t low = 20000;
  std::uint16_t high = 29999;
  friend bool operator==(const PortRange&, const PortRange&) = default;
};

// Each job owns a block of kStepsPerJob consecutive ports, so on a node
// shared by several jobs, step s of two jobs meets only when the job ids
// differ by a multiple of range / gcd(kStepsPerJob, range); within one job,
// steps s and s' share a port only when they differ by a multiple of the
// range's size.
inline constexpr std::uint64_t kStepsPerJob = 32;

// low + (job_id x kStepsPerJob + step_id) mod (high - low + 1).
DEW_API std::uint16_t derive_port(std::uint32_t job_id, std::uint32_t step_id, PortRange range = {});

// A port of `range` from a random number: low + random mod the range's size.
DEW_API std::uint16_t port_from_random(std::uint32_t random, PortRange range = {});

// The port `step` places after `port`, for stepping past a port in use:
// port + step, wrapping from 65535 to 1024 (the ports below need root).
DEW_API std::uint16_t stepped_port(std::uint16_t port, unsigned step);

}  // namespace dew
