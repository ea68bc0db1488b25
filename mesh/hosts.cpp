// hosts_graph: the devices of a pool whose processes sit on several hosts,
// each process having read its host's topology: one granule per host (told
// apart by its id, not its name), the host's own links between devices on
// one host, and kBetweenHostsGbps between hosts.
#include <algorithm>
#include <map>
#include <set>

#include "dew/mesh.h"
#include "dew/text.h"

namespace dew::mesh {
namespace {

// Every process of one host must describe the same host.
std::optional<Error> check_same_host(const HostPart& a, const HostPart& b) {
  if (a.host_gpus == b.host_gpus && a.bandwidth == b.bandwidth) return std::nullopt;
  return invalid_argument("mesh: processes " + std::to_string(a.process) + " and " + std::to_string(b.process) +
                          " share host " + a.host_name + " (id " + a.host + ") but read different topologies (" +
                          counted(a.host_gpus, "GPU") + " and " + counted(b.host_gpus, "GPU") +
                          "); allowed: one topology per host");
}

}  // namespace

Result<DeviceGraph> hosts_graph(const std::vector<HostPart>& parts) {
  if (parts.empty()) return invalid_argument("mesh: no process described its host");
  std::map<std::string, const HostPart*> first_of_host;
  std::map<std::string, std::set<int>> taken;  // host -> GPUs owned by some process
  for (const HostPart& part : parts) {
    if (part.host_gpus < 1 || part.bandwidth.size() != std::size_t(part.host_gpus) * std::size_t(part.host_gpus)) {
      return invalid_argument("mesh: process " + std::to_string(part.process) + " on " + part.host_name +
                              " has no GPUs to lay out (" + counted(part.host_gpus, "GPU") + " in its topology)");
    }
    auto [it, fresh] = first_of_host.emplace(part.host, &part);
    if (!fresh) {
      if (auto bad = check_same_host(*it->second, part)) return *bad;
    }
    const HostPart& first = *first_of_host.begin()->second;
    if (part.host_gpus != first.host_gpus) {
      return invalid_argument("mesh: host " + part.host_name + " has " + counted(part.host_gpus, "GPU") + " and " +
                              first.host_name + " has " + std::to_string(first.host_gpus) +
                              "; allowed: hosts with the same GPU count (granules of one size)");
    }
    for (const int gpu : part.gpus) {
      if (gpu < 0 || gpu >= part.host_gpus || !taken[part.host].insert(gpu).second) {
        return invalid_argument("mesh: process " + std::to_string(part.process) + " on " + part.host_name +
                                " claims GPU " + std::to_string(gpu) + ", which " +
                                (gpu < 0 || gpu >= part.host_gpus
                                     ? "its host does not have (" + counted(part.host_gpus, "GPU") + ")"
                                     : std::string("another process there owns")));
      }
    }
  }
  // Devices in process order, each process's in the order it owns them.
  DeviceGraph graph;
  std::vector<std::pair<const HostPart*, int>> where;  // device -> (its process's part, host GPU)
  int id = 0;
  std::vector<const HostPart*> ordered;
  for (const HostPart& part : parts) ordered.push_back(&part);
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const HostPart* a, const HostPart* b) { return a->process < b->process; });
  for (const HostPart* part : ordered) {
    for (const int gpu : part->gpus) {
      graph.devices.push_back({id++, part->process, part->granule.empty() ? "host:" + part->host : part->granule});
      where.emplace_back(part, gpu);
    }
  }
  const int n = id;
  graph.bandwidth = bandwidth_matrix(n, [&](int i, int j) {
    const auto& [a, ga] = where[std::size_t(i)];
    const auto& [b, gb] = where[std::size_t(j)];
    if (a->host != b->host) {
      if (a->granule.empty() || a->granule != b->granule) return kBetweenHostsGbps;
      // One NVLink domain across hosts: its switches' speed, the host's fastest link.
      return *std::max_element(a->bandwidth.begin(), a->bandwidth.end());
    }
    return a->bandwidth[std::size_t(ga) * std::size_t(a->host_gpus) + std::size_t(gb)];
  });
  return graph;
}

}  // namespace dew::mesh
