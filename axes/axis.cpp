// Communicators for mesh axis groups over the runtime pool
// (dew/axes.h). axis_member is pure; the rest gathers the pool's
// store and this host's address and hands them to make_gloo_communicator.
#include <algorithm>
#include <asio/connect.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/udp.hpp>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

#include "dew/axes.h"

namespace dew::axes {
namespace {

std::string axis_text(mesh::Axis axis) { return std::string(mesh::kMeshAxes[static_cast<std::size_t>(axis)]); }

// The mesh's ids as "0, 1, 2" (the first 16, then a count).
std::string ids_text(const std::vector<int>& ids) {
  std::string text;
  const std::size_t shown = std::min<std::size_t>(ids.size(), 16);
  for (std::size_t i = 0; i < shown; ++i) text += (i ? ", " : "") + std::to_string(ids[i]);
  if (ids.size() > shown) text += " and " + std::to_string(ids.size() - shown) + " more";
  return text;
}

// FNV-1a over the group's ids: names the group in its keys, so two meshes
// whose group g holds different devices never share a rendezvous.
std::string group_digest(const std::vector<int>& ids) {
  std::uint64_t hash = 14695981039346656037ull;
  for (const int id : ids) {
    for (int byte = 0; byte < 4; ++byte) {
      hash ^= (static_cast<std::uint32_t>(id) >> (8 * byte)) & 0xffu;
      hash *= 1099511628211ull;
    }
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

// How many communicators this process has made for a device in a group
// (its prefix): every device of the group makes its n-th one at the same
// point of the program, so n is the same on every process and names the round.
int next_round(const std::string& prefix, int device_id) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, int>, int> made;
  std::lock_guard lock(mutex);
  return made[{prefix, device_id}]++;
}

}  // namespace

Result<AxisMember> axis_member(const mesh::Mesh& mesh, mesh::Axis axis, int device_id) {
  const auto a = static_cast<std::size_t>(axis);
  if (a >= mesh::kMeshAxes.size()) return invalid_argument("axis " + std::to_string(a) + " is not a mesh axis");
  const auto& groups = mesh.groups[a].devices;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto found = std::find(groups[g].begin(), groups[g].end(), device_id);
    if (found == groups[g].end()) continue;
    AxisMember member;
    member.group = static_cast<int>(g);
    member.rank = static_cast<int>(found - groups[g].begin());
    member.size = static_cast<int>(groups[g].size());
    member.devices = groups[g];
    member.prefix = "dew/comm/" + axis_text(axis) + "/" + std::to_string(g) + "-" + group_digest(groups[g]);
    return member;
  }
  return not_found("device " + std::to_string(device_id) + " is not in the mesh; allowed: its devices " +
                   ids_text(mesh.devices));
}

Result<std::string> reachable_address(const runtime::Identity& identity) {
  if (!identity.coordinator) return std::string("127.0.0.1");
  const runtime::Address& to = *identity.coordinator;
  asio::io_context io;
  asio::error_code ec;
  asio::ip::udp::resolver resolver(io);
  const auto found = resolver.resolve(to.host, std::to_string(to.port), ec);
  if (ec) {
    return unavailable("the coordinator's host '" + to.host + "' (" + identity.coordinator_from +
                       ") does not resolve: " + ec.message() + "; give the address to listen on instead");
  }
  asio::ip::udp::socket socket(io);
  // A UDP connect only picks the route and the local address: nothing is sent.
  asio::connect(socket, found, ec);
  if (ec) return unavailable("no route to the coordinator " + to.text() + ": " + ec.message());
  const auto local = socket.local_endpoint(ec);
  if (ec) return unavailable("no local address toward the coordinator " + to.text() + ": " + ec.message());
  return local.address().to_string();
}

Result<AxisRendezvous> axis_rendezvous(runtime::Pool& pool, const mesh::Mesh& mesh, mesh::Axis axis, int device_id,
                                       std::chrono::milliseconds timeout) {
  auto member = axis_member(mesh, axis, device_id);
  if (!member.ok()) return member.error();
  const auto at = std::find(mesh.devices.begin(), mesh.devices.end(), device_id);
  const int owner = mesh.processes[static_cast<std::size_t>(at - mesh.devices.begin())];
  if (owner != pool.rank()) {
    return invalid_argument("device " + std::to_string(device_id) + " sits on process " + std::to_string(owner) +
                            " in this mesh, not on this process " + std::to_string(pool.rank()) +
                            "; allowed: the devices of this process");
  }
  AxisRendezvous rendezvous;
  rendezvous.prefix = member.value().prefix + "/" + std::to_string(next_round(member.value().prefix, device_id));
  rendezvous.member = std::move(member.value());
  rendezvous.store = pool_key_value(pool, timeout);
  return rendezvous;
}

Result<std::unique_ptr<Communicator>> make_axis_communicator(runtime::Pool& pool, const mesh::Mesh& mesh,
                                                             mesh::Axis axis, int device_id,
                                                             const AxisOptions& options) {
  comm::GlooOptions gloo;
  if (options.hostname) {
    gloo.hostname = *options.hostname;
  } else {
    auto address = reachable_address(pool.identity());
    if (!address.ok()) {
      return address.error().prefixed(axis_text(axis) + " group of device " + std::to_string(device_id) + ": ");
    }
    gloo.hostname = address.value();
  }
  auto rendezvous = axis_rendezvous(pool, mesh, axis, device_id, options.timeout);
  if (!rendezvous.ok()) return rendezvous.error();
  gloo.rank = rendezvous.value().member.rank;
  gloo.size = rendezvous.value().member.size;
  gloo.store = rendezvous.value().store;
  gloo.prefix = rendezvous.value().prefix;
  gloo.timeout = options.timeout;
  return comm::make_gloo_communicator(gloo);
}

}  // namespace dew::axes
