// The coordinator port of a step, derived from its job and step ids.
#include "pool_plan.h"

namespace dew::spank {

// Each job owns a block of kStepsPerJob consecutive ports, so on a node shared
// by several jobs, step s of two jobs meets only when the job ids differ by a
// multiple of range / gcd(kStepsPerJob, range); within one job, steps s and
// s' share a port only when they differ by a multiple of the range size.
inline constexpr std::uint64_t kStepsPerJob = 32;

std::uint16_t derive_port(std::uint32_t job_id, std::uint32_t step_id, PortRange range) {
  const std::uint64_t span = static_cast<std::uint64_t>(range.high) - range.low + 1;
  const std::uint64_t offset = (static_cast<std::uint64_t>(job_id) * kStepsPerJob + step_id) % span;
  return static_cast<std::uint16_t>(range.low + offset);
}

}  // namespace dew::spank
