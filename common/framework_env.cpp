#include "dew/framework_env.h"

#include "dew/task_contract.h"
#include "dew/text.h"

namespace dew {

Result<Done> check_framework_range(PortRange dew_range, PortRange framework_range) {
  if (framework_range.high < dew_range.low || framework_range.low > dew_range.high) return Done{};
  const auto text = [](PortRange r) { return std::to_string(r.low) + "-" + std::to_string(r.high); };
  return invalid_argument("framework_port_range " + text(framework_range) + " shares ports with port_range " +
                          text(dew_range) +
                          "; allowed: two ranges with no port in common (a step's framework port must never be "
                          "another step's Dew port)");
}

std::vector<std::pair<std::string, std::string>> framework_variables(const FrameworkPlace& place) {
  const std::string port = std::to_string(place.port);
  const std::string address = host_port(place.host, port);
  return {{contract::kFrameworkCoordinator.name, address},
          {"JAX_COORDINATOR_ADDRESS", address},
          {"MASTER_ADDR", place.host},
          {"MASTER_PORT", port},
          {"RANK", std::to_string(place.rank)},
          {"WORLD_SIZE", std::to_string(place.size)},
          {"LOCAL_RANK", std::to_string(place.local_rank)},
          {"LOCAL_WORLD_SIZE", std::to_string(place.local_size)},
          {"GROUP_RANK", std::to_string(place.node)}};
}

}  // namespace dew
