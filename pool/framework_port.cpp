// The framework's coordinator: process 0 chooses a free port on its host
// (unless a launcher chose one) and the pool agrees on it, so that
// jax.distributed and torch.distributed never try to bind Dew's own port.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dew/coordinator_port.h"
#include "dew/framework_env.h"
#include "dew/hex.h"
#include "dew/log.h"
#include "pool_state.h"

namespace dew::runtime {
namespace {

// The key process 0 puts the address under; read by every process after the join.
constexpr const char* kFrameworkKey = "dew.framework_coordinator";

// True when a TCP socket can bind `port` on every address now (no
// SO_REUSEADDR, so a socket in any state on it refuses).
bool port_free_here(std::uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(port);
  const bool free = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  close(fd);
  return free;
}

// A random port of kFrameworkPortRange that is free here and not `avoid`.
Result<std::uint16_t> choose_free_port(std::uint16_t avoid) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    auto random = random_u32();
    if (!random.ok()) return random.error();
    const std::uint16_t port = port_from_random(random.value(), kFrameworkPortRange);
    if (port != avoid && port_free_here(port)) return port;
  }
  return unavailable("no free port from " + std::to_string(kFrameworkPortRange.low) + " to " +
                     std::to_string(kFrameworkPortRange.high) +
                     " for the framework's coordinator on this host (200 tries); set DEW_FRAMEWORK_COORDINATOR");
}

// How many ports past a launcher's taken one process 0 tries.
constexpr unsigned kFrameworkPortSteps = 64;

// The launcher's port is in use on process 0's host (another job's server, a
// stale listener): the first free port after it. The pool agrees on it like
// on any choice of process 0, and prepare_process() sets MASTER_PORT and
// JAX_COORDINATOR_ADDRESS to it, so the framework binds where it can.
Result<Address> step_past_taken_port(const Address& taken, const std::string& from, std::uint16_t dew_port) {
  for (unsigned step = 1; step <= kFrameworkPortSteps; ++step) {
    const std::uint16_t port = stepped_port(taken.port, step);
    if (port == dew_port || !port_free_here(port)) continue;
    log_warn("the framework's coordinator port " + std::to_string(taken.port) + " (" + from +
             ") is in use on this host; the pool uses " + std::to_string(port) +
             " instead (MASTER_PORT and JAX_COORDINATOR_ADDRESS after dew.prepare_process())");
    return Address{taken.host, port};
  }
  return unavailable("the framework's coordinator port " + std::to_string(taken.port) + " (" + from + ") and the " +
                     std::to_string(kFrameworkPortSteps) +
                     " ports after it are in use on this host; set DEW_FRAMEWORK_COORDINATOR to a free host:port");
}

// Process 0's choice: the launcher's, stepped past when taken, or a port of its own.
Result<Address> framework_choice(const Pool::State& state) {
  const Identity& id = state.identity;
  const std::uint16_t dew_port = state.service ? state.service->port() : 0;
  if (id.framework_coordinator) {
    if (id.framework_coordinator->port == dew_port) {
      return invalid_argument(id.framework_coordinator_from + "=" + id.framework_coordinator->text() +
                              " is Dew's own coordinator port; allowed: a port of its own");
    }
    if (port_free_here(id.framework_coordinator->port)) return *id.framework_coordinator;
    return step_past_taken_port(*id.framework_coordinator, id.framework_coordinator_from, dew_port);
  }
  auto port = choose_free_port(dew_port);
  if (!port.ok()) return port.error();
  const std::string host = !state.client ? "127.0.0.1" : id.coordinator ? id.coordinator->host : id.hostname;
  return Address{host, port.value()};
}

}  // namespace

Result<Done> offer_framework_coordinator(Pool::State& state) {
  if (state.identity.rank != 0) return Done{};
  auto choice = framework_choice(state);
  if (!choice.ok()) return choice.error();
  state.identity.framework_coordinator = choice.value();
  if (state.identity.framework_coordinator_from.empty()) state.identity.framework_coordinator_from = "process 0";
  if (state.client) state.client->put(kFrameworkKey, state.identity.framework_coordinator->text());
  return Done{};
}

Result<Done> take_framework_coordinator(Pool::State& state) {
  Identity& id = state.identity;
  if (id.rank == 0 || !state.client) return Done{};
  auto text = state.checked(state.client->get(kFrameworkKey, state.settings.join_timeout));
  auto address = text ? parse_address(*text, "process 0's framework coordinator")
                      : Result<Address>(internal_error("process 0 gave no framework coordinator"));
  if (!address.ok()) return address.error();
  if (!id.framework_coordinator || id.framework_coordinator->text() != address.value().text()) {
    id.framework_coordinator_from = "process 0";
  }
  id.framework_coordinator = address.value();
  return Done{};
}

}  // namespace dew::runtime
