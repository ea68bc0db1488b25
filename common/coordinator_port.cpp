#include "dew/coordinator_port.h"

namespace dew {
namespace {

std::uint64_t span_of(PortRange range) { return static_cast<std::uint64_t>(range.high) - range.low + 1; }

}  // namespace

std::uint16_t derive_port(std::uint32_t job_id, std::uint32_t step_id, PortRange range) {
  const std::uint64_t offset = (static_cast<std::uint64_t>(job_id) * kStepsPerJob + step_id) % span_of(range);
  return static_cast<std::uint16_t>(range.low + offset);
}

std::uint16_t port_from_random(std::uint32_t random, PortRange range) {
  return static_cast<std::uint16_t>(range.low + random % span_of(range));
}

std::uint16_t stepped_port(std::uint16_t port, unsigned step) {
  constexpr std::uint64_t kLow = kLowestPort;
  constexpr std::uint64_t kSpan = 65535 - kLow + 1;
  const std::uint64_t from = port < kLow ? kLow : port;
  return static_cast<std::uint16_t>(kLow + (from - kLow + step) % kSpan);
}

}  // namespace dew
