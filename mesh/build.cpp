// build_mesh: from a spec and a device graph to device ids at mesh
// coordinates.
//
// Every layout here is a grid of granule blocks, as JAX's
// mesh_utils.create_hybrid_device_mesh builds it: the mesh splits per axis
// into an outer (between granules) and an inner (inside one granule) factor;
// the granules fill the outer grid row-major in order of their smallest
// device id, and every granule fills its inner block with the same local
// order (so position k lines up across granules, and every process computes
// the same mesh). np.block's rule maps coordinates: outer = c / inner,
// local = c % inner.
//
// - replicas > 1 (hybrid): outer data = replicas, outer fsdp = granules per
//   replica group, every other axis inner; this is the only split in which
//   data spans the replica groups, fsdp alone crosses granules inside one,
//   and expert, tensor, sequence and stage stay inside a granule.
// - replicas = 1: the granules take consecutive runs of the id-ordered mesh
//   (what jax.make_mesh does with hosts), so the inner block is the
//   innermost axes that fill one granule.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "dew/mesh.h"
#include "text.h"

namespace dew::mesh {
namespace {

constexpr int kData = static_cast<int>(Axis::kData);
constexpr int kFsdp = static_cast<int>(Axis::kFsdp);

std::optional<Error> check_graph(const DeviceGraph& graph) {
  const std::size_t n = graph.devices.size();
  if (n == 0) return invalid_argument("mesh: the device graph has no devices; allowed: at least 1");
  std::set<int> ids;
  for (const Device& device : graph.devices) {
    if (!ids.insert(device.id).second) {
      return invalid_argument("mesh: device id " + std::to_string(device.id) +
                              " appears twice in the device graph; each id must be unique");
    }
  }
  if (graph.bandwidth.size() != n * n) {
    return invalid_argument("mesh: the bandwidth matrix has " + std::to_string(graph.bandwidth.size()) + " entries; " +
                            std::to_string(n) + " devices need " + std::to_string(n * n) + " (" + std::to_string(n) +
                            " x " + std::to_string(n) + ")");
  }
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      const double value = graph.bandwidth[i * n + j];
      if (i != j && !(std::isfinite(value) && value >= 0)) {
        return invalid_argument("mesh: bandwidth from device " + std::to_string(graph.devices[i].id) + " to device " +
                                std::to_string(graph.devices[j].id) + " is " + number_text(value) +
                                " GB/s; allowed: a finite number >= 0");
      }
    }
  }
  return std::nullopt;
}

// Indices into graph.devices, ordered by id.
std::vector<int> by_id(const DeviceGraph& graph) {
  std::vector<int> order(graph.devices.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return graph.devices[a].id < graph.devices[b].id; });
  return order;
}

std::string axis_size(int axis, int size) { return std::string(kMeshAxes[axis]) + "=" + std::to_string(size); }

struct Granules {
  std::vector<std::string> names;
  std::vector<std::vector<int>> members;  // graph indices, by id
  bool processes = false;                 // the fallback: one granule per process
};

// Granules in order of their smallest device id. In a CPU pool (one shared
// granule) the process is the granule, as XLA's slice_index leaves it.
Granules find_granules(const DeviceGraph& graph, const std::vector<int>& ids, bool split_by_process) {
  Granules result;
  std::map<std::string, std::size_t> index;
  for (const int d : ids) {
    const Device& device = graph.devices[d];
    const std::string name = split_by_process ? "process:" + std::to_string(device.process) : device.granule;
    auto [it, added] = index.try_emplace(name, result.names.size());
    if (added) {
      result.names.push_back(name);
      result.members.emplace_back();
    }
    result.members[it->second].push_back(d);
  }
  result.processes = split_by_process;
  return result;
}

std::optional<Error> check_equal(const Granules& granules) {
  for (std::size_t g = 1; g < granules.members.size(); ++g) {
    if (granules.members[g].size() != granules.members[0].size()) {
      return invalid_argument("mesh: granules hold different device counts (" + granules.names[0] + ": " +
                              std::to_string(granules.members[0].size()) + ", " + granules.names[g] + ": " +
                              std::to_string(granules.members[g].size()) +
                              "); hybrid sharding needs the same count in every granule");
    }
  }
  return std::nullopt;
}

// The hybrid split (see the top); each violated rule is an error with the
// numbers.
Result<MeshShape> hybrid_inner(const MeshShape& shape, int replicas, const Granules& granules) {
  const auto count = static_cast<int>(granules.names.size());
  const std::string what = std::to_string(count) + (count == 1 ? " granule" : " granules");
  if (count % replicas != 0) {
    return invalid_argument("mesh: replicas=" + std::to_string(replicas) + " does not divide the " + what +
                            (granules.processes ? " (processes: every device shares one host or NVLink domain)" : "") +
                            "; allowed: a divisor of " + std::to_string(count));
  }
  if (shape[kData] % replicas != 0) {
    return invalid_argument("mesh: replicas=" + std::to_string(replicas) + " does not divide the data axis (" +
                            axis_size(kData, shape[kData]) + "); the data axis spans the replica groups");
  }
  const int per_group = count / replicas;
  if (shape[kFsdp] % per_group != 0) {
    return invalid_argument("mesh: fsdp=" + std::to_string(shape[kFsdp]) + " does not divide over the " +
                            std::to_string(per_group) + " granules of one replica group (" + what + " / replicas=" +
                            std::to_string(replicas) + "); fsdp must be a multiple of " + std::to_string(per_group));
  }
  MeshShape inner = shape;
  inner[kData] /= replicas;
  inner[kFsdp] /= per_group;
  return inner;
}

// replicas = 1: the innermost axes that fill one granule, or nullopt when a
// granule is not a block of the mesh (an axis straddles it unevenly).
std::optional<MeshShape> consecutive_inner(const MeshShape& shape, int granule_size) {
  MeshShape inner;
  inner.fill(1);
  int left = granule_size;
  for (int axis = kAxisCount - 1; axis >= 0 && left > 1; --axis) {
    if (shape[axis] % left == 0) {
      inner[axis] = left;
      left = 1;
    } else if (left % shape[axis] == 0) {
      inner[axis] = shape[axis];
      left /= shape[axis];
    } else {
      return std::nullopt;
    }
  }
  return inner;
}

int product(const MeshShape& shape) { return std::accumulate(shape.begin(), shape.end(), 1, std::multiplies<>()); }

// Position k of every granule gets the same local device: the local order is
// placed against the slowest copy of each local link.
Placement place_granules(const DeviceGraph& graph, const Granules& granules, const MeshShape& inner) {
  const auto size = static_cast<int>(granules.members[0].size());
  const std::size_t n = graph.devices.size();
  std::vector<double> local(static_cast<std::size_t>(size) * size, std::numeric_limits<double>::infinity());
  for (const auto& members : granules.members) {
    for (int k = 0; k < size; ++k) {
      for (int l = 0; l < size; ++l) {
        const double value = graph.bandwidth[static_cast<std::size_t>(members[k]) * n + members[l]];
        local[k * size + l] = std::min(local[k * size + l], value);
      }
    }
  }
  return place(local, size, inner);
}

// Graph indices in mesh order for granule blocks (see the top).
std::vector<int> fill_blocks(const MeshShape& shape, const MeshShape& inner, const Granules& granules,
                             const std::vector<int>& local_order) {
  MeshShape outer;
  for (int a = 0; a < kAxisCount; ++a) outer[a] = shape[a] / inner[a];
  const int total = product(shape);
  std::vector<int> result(total);
  for (int flat = 0; flat < total; ++flat) {
    int rest = flat;
    std::array<int, kAxisCount> coordinate{};
    for (int a = kAxisCount - 1; a >= 0; --a) {
      coordinate[a] = rest % shape[a];
      rest /= shape[a];
    }
    int granule = 0;
    int position = 0;
    for (int a = 0; a < kAxisCount; ++a) {
      granule = granule * outer[a] + coordinate[a] / inner[a];
      position = position * inner[a] + coordinate[a] % inner[a];
    }
    result[flat] = granules.members[granule][local_order[position]];
  }
  return result;
}

void fill_groups(Mesh& mesh, const DeviceGraph& graph, const std::vector<int>& indices) {
  for (int axis = 0; axis < kAxisCount; ++axis) {
    AxisGroups& groups = mesh.groups[axis];
    for (const auto& members : groups_along(mesh.shape, indices, axis)) {
      std::vector<int> devices;
      std::vector<int> processes;
      for (const int index : members) {
        devices.push_back(graph.devices[index].id);
        processes.push_back(graph.devices[index].process);
      }
      std::sort(processes.begin(), processes.end());
      processes.erase(std::unique(processes.begin(), processes.end()), processes.end());
      groups.devices.push_back(std::move(devices));
      groups.processes.push_back(std::move(processes));
    }
  }
}

}  // namespace

std::vector<std::vector<int>> groups_along(std::span<const int> shape, std::span<const int> values, int axis) {
  int stride = 1;
  for (int a = static_cast<int>(shape.size()) - 1; a > axis; --a) stride *= shape[a];
  const int length = shape[axis];
  const auto total = static_cast<int>(values.size());
  std::vector<std::vector<int>> groups;
  for (int start = 0; start < total; ++start) {
    if ((start / stride) % length != 0) continue;
    std::vector<int> members;
    for (int k = 0; k < length; ++k) members.push_back(values[start + k * stride]);
    groups.push_back(std::move(members));
  }
  return groups;
}

std::vector<double> bandwidth_matrix(int n, const std::function<double(int, int)>& link) {
  const auto size = static_cast<std::size_t>(std::max(0, n));
  std::vector<double> matrix(size * size, 0.0);
  for (std::size_t i = 0; i < size; ++i) {
    for (std::size_t j = 0; j < size; ++j) {
      if (i != j) matrix[i * size + j] = link(static_cast<int>(i), static_cast<int>(j));
    }
  }
  return matrix;
}

DeviceGraph cpu_pool(int processes, int devices_per_process) {
  DeviceGraph graph;
  const int n = std::max(0, processes) * std::max(0, devices_per_process);
  for (int p = 0; p < std::max(0, processes); ++p) {
    for (int local = 0; local < devices_per_process; ++local) {
      graph.devices.push_back({cpu_device_id(p, devices_per_process, local), p, "cpu"});
    }
  }
  // Equal links: host memory joins every pair, so no order is better.
  graph.bandwidth = bandwidth_matrix(n, [](int, int) { return 1.0; });
  return graph;
}

std::string_view layout_name(Layout layout) {
  switch (layout) {
    case Layout::kExplicit:
      return "explicit";
    case Layout::kPlacement:
      return "placement";
    case Layout::kHybrid:
      return "hybrid";
  }
  return "?";
}

namespace {

// The caller's order: graph indices in mesh order, or an error naming the
// device that is not in the graph or given twice.
Result<std::vector<int>> explicit_indices(const MeshSpec& spec, const DeviceGraph& graph,
                                          const std::vector<int>& order) {
  if (spec.replicas != 1) {
    return invalid_argument("mesh: replicas=" + std::to_string(spec.replicas) +
                            " with an explicit device order; the order fixes the layout, so give replicas=1 or "
                            "no device order");
  }
  if (order.empty()) return invalid_argument("mesh: the device order is empty; allowed: device ids of the graph");
  std::map<int, int> index_of;
  for (std::size_t d = 0; d < graph.devices.size(); ++d) index_of[graph.devices[d].id] = static_cast<int>(d);
  std::set<int> seen;
  std::vector<int> indices;
  for (const int id : order) {
    const auto it = index_of.find(id);
    if (it == index_of.end()) {
      return invalid_argument("mesh: device " + std::to_string(id) + " in the device order is not one of the " +
                              std::to_string(graph.devices.size()) + " devices (ids " +
                              std::to_string(index_of.begin()->first) + " to " +
                              std::to_string(index_of.rbegin()->first) + ")");
    }
    if (!seen.insert(id).second) {
      return invalid_argument("mesh: device " + std::to_string(id) +
                              " appears twice in the device order; give each once");
    }
    indices.push_back(it->second);
  }
  return indices;
}

// The granules and the block of the mesh each holds: hybrid for replicas >
// 1, else placement per granule when the granules tile the mesh.
Result<MeshShape> granule_blocks(const MeshSpec& spec, const DeviceGraph& graph, const std::vector<int>& plain,
                                 Mesh& mesh, Granules& granules) {
  granules = find_granules(graph, plain, false);
  if (spec.replicas > 1) {
    mesh.layout = Layout::kHybrid;
    if (granules.names.size() == 1) granules = find_granules(graph, plain, true);
    if (auto error = check_equal(granules)) return *error;
    return hybrid_inner(mesh.shape, spec.replicas, granules);
  }
  mesh.layout = Layout::kPlacement;
  std::optional<MeshShape> inner;
  if (check_equal(granules)) {
    mesh.notes.push_back("granules hold different device counts: placed all " + std::to_string(plain.size()) +
                         " devices as one granule");
  } else {
    inner = consecutive_inner(mesh.shape, static_cast<int>(granules.members[0].size()));
    if (!inner) {
      mesh.notes.push_back("a granule of " + std::to_string(granules.members[0].size()) +
                           " devices is not a block of the mesh: placed all " + std::to_string(plain.size()) +
                           " devices as one granule");
    }
  }
  if (inner) return *inner;
  granules = Granules{{"all"}, {plain}, false};
  return mesh.shape;
}

// Placement: granules in id order, each granule's devices in its best order.
Result<std::vector<int>> placed_indices(const MeshSpec& spec, const DeviceGraph& graph, const std::vector<int>& plain,
                                        Mesh& mesh) {
  Granules granules;
  auto inner = granule_blocks(spec, graph, plain, mesh, granules);
  if (!inner.ok()) return inner.error();
  const Placement placement = place_granules(graph, granules, inner.value());
  mesh.exact = placement.exact;
  if (!placement.exact) {
    const auto size = static_cast<int>(granules.members[0].size());
    mesh.notes.push_back(
        (size > kExactPlacementLimit
             ? "granules of " + std::to_string(size) + " devices exceed " + std::to_string(kExactPlacementLimit)
             : "the exact search over " + std::to_string(size) + " devices ran out of its budget") +
        ": heuristic placement, never worse than the id order");
  }
  mesh.granules = granules.names;
  mesh.granule_shape = inner.value();
  return fill_blocks(mesh.shape, inner.value(), granules, placement.order);
}

}  // namespace

Result<Mesh> build_mesh(const MeshSpec& spec, const DeviceGraph& graph, const std::optional<std::vector<int>>& order) {
  if (auto error = check_graph(graph)) return *error;
  if (spec.replicas < 1 || spec.replicas > kMaxSize) {
    return invalid_argument(bad_size("replicas", std::to_string(spec.replicas)));
  }
  Mesh mesh;
  mesh.replicas = spec.replicas;
  std::vector<int> indices;  // graph indices in mesh order
  std::vector<int> plain;    // the same devices by id
  if (order) {
    auto given = explicit_indices(spec, graph, *order);
    if (!given.ok()) return given.error();
    indices = given.value();
    plain = indices;
    std::sort(plain.begin(), plain.end(), [&](int a, int b) { return graph.devices[a].id < graph.devices[b].id; });
  } else {
    plain = by_id(graph);
  }
  auto shape = resolve_shape(spec, static_cast<int>(plain.size()));
  if (!shape.ok()) return shape.error();
  mesh.shape = shape.value();
  if (order) {
    mesh.layout = Layout::kExplicit;
    mesh.granule_shape = mesh.shape;
    mesh.granules = {"given order"};
  } else {
    auto placed = placed_indices(spec, graph, plain, mesh);
    if (!placed.ok()) return placed.error();
    indices = placed.value();
  }
  const auto n = static_cast<int>(graph.devices.size());
  for (const int d : indices) {
    mesh.devices.push_back(graph.devices[d].id);
    mesh.processes.push_back(graph.devices[d].process);
  }
  fill_groups(mesh, graph, indices);
  mesh.score = score_layout(graph.bandwidth, n, mesh.shape, indices);
  mesh.id_order_score = score_layout(graph.bandwidth, n, mesh.shape, plain);
  return mesh;
}

}  // namespace dew::mesh
