// dew.torch_process_groups: build_mesh's layout as torch.distributed groups,
// one per mesh axis for this rank. The groups themselves come from
// mesh::groups_along (the rule `dew mesh` and dew worker use); this file only
// asks torch to make them. torch is imported when called, never at import.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "bindings.h"
#include "dew/mesh.h"

namespace py = pybind11;

namespace dew::python {
namespace {

// The rank of every mesh entry: device id // devices_per_process (a pool's
// devices are numbered process by process, as build_mesh's processes= gives
// them). Every rank of the world must appear.
std::vector<int> ranks_of(const py::array_t<long long, py::array::c_style | py::array::forcecast>& ids,
                          int devices_per_process, int world) {
  std::vector<int> ranks;
  std::set<int> seen;
  for (py::ssize_t k = 0; k < ids.size(); ++k) {
    const long long id = ids.data()[k];
    if (id < 0 || id / devices_per_process >= world) {
      throw py::value_error("ids holds device " + std::to_string(id) +
                            ", which with devices_per_process=" + std::to_string(devices_per_process) +
                            " is not a rank of this world of " + std::to_string(world) + "; allowed: device ids 0.." +
                            std::to_string(static_cast<long long>(world) * devices_per_process - 1));
    }
    ranks.push_back(static_cast<int>(id / devices_per_process));
    seen.insert(ranks.back());
  }
  if (static_cast<int>(seen.size()) != world) {
    throw py::value_error("the mesh covers " + std::to_string(seen.size()) + " of the world's " +
                          std::to_string(world) +
                          " ranks; allowed: a mesh over every rank (build_mesh(spec, processes=WORLD_SIZE))");
  }
  return ranks;
}

// The members of one group: its ranks, each once, sorted (torch's order).
std::vector<int> members_of(std::vector<int> group) {
  std::sort(group.begin(), group.end());
  group.erase(std::unique(group.begin(), group.end()), group.end());
  return group;
}

py::dict torch_process_groups(const py::array_t<long long, py::array::c_style | py::array::forcecast>& ids,
                              const std::vector<std::string>& names, int devices_per_process,
                              const py::object& backend) {
  if (static_cast<std::size_t>(ids.ndim()) != names.size()) {
    throw py::value_error("ids has " + std::to_string(ids.ndim()) + " axes but names has " +
                          std::to_string(names.size()) + "; allowed: one name per axis (build_mesh's pair)");
  }
  if (devices_per_process < 1) {
    throw py::value_error("devices_per_process=" + std::to_string(devices_per_process) +
                          " is not allowed; allowed: a whole number >= 1");
  }
  py::module_ dist = py::module_::import("torch.distributed");
  if (!dist.attr("is_initialized")().cast<bool>()) {
    throw py::value_error(
        "torch.distributed is not initialized; allowed: call torch.distributed.init_process_group(...) first "
        "(RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set by srun --dew-pool, dew launch and "
        "dew.prepare_process())");
  }
  const int world = dist.attr("get_world_size")().cast<int>();
  const int me = dist.attr("get_rank")().cast<int>();
  const std::vector<int> ranks = ranks_of(ids, devices_per_process, world);
  std::vector<int> shape(ids.shape(), ids.shape() + ids.ndim());

  py::dict groups;
  for (std::size_t axis = 0; axis < names.size(); ++axis) {
    std::set<std::vector<int>> made;
    py::object mine = py::none();
    for (const auto& along : mesh::groups_along(shape, ranks, static_cast<int>(axis))) {
      const std::vector<int> members = members_of(along);
      // An axis inside one process (or of size 1) has nothing to exchange.
      if (members.size() < 2 || !made.insert(members).second) continue;
      // Every rank makes every group, in the same order (torch's rule).
      py::object group = dist.attr("new_group")(py::arg("ranks") = members, py::arg("backend") = backend);
      if (std::binary_search(members.begin(), members.end(), me)) mine = group;
    }
    groups[py::str(names[axis])] = mine;
  }
  return groups;
}

}  // namespace

void bind_torch(py::module_& m) {
  m.def("torch_process_groups", &torch_process_groups, py::arg("ids"), py::arg("names"),
        py::arg("devices_per_process") = 1, py::arg("backend") = py::none(),
        "build_mesh's layout as torch.distributed groups: {axis name: this rank's group along that axis}, None "
        "for an axis this rank exchanges nothing over (size 1, or inside one process). Call it on every rank, "
        "after init_process_group, with ids = build_mesh(spec, processes=WORLD_SIZE)[0]; device d belongs to rank "
        "d // devices_per_process. Hybrid sharding: shard over groups['fsdp'], all-reduce gradients over "
        "groups['data'].");
}

}  // namespace dew::python
