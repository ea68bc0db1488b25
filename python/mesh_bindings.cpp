// dew.MeshSpec, dew.build_mesh and dew.choose_exchange: the same rules as
// `dew mesh --json` and `dew attention-plan`, for Python.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "bindings.h"
#include "dew/attention.h"
#include "dew/mesh.h"
#include "dew/pool_topology.h"
#include "dew/topology.h"

namespace py = pybind11;

namespace dew::python {
namespace {

template <typename T>
T value_or_raise(Result<T> result) {
  if (!result.ok()) throw_error(result.error());
  return std::move(result.value());
}

mesh::MeshSpec spec_of(const py::object& spec) {
  if (py::isinstance<mesh::MeshSpec>(spec)) return spec.cast<mesh::MeshSpec>();
  if (py::isinstance<py::str>(spec)) return value_or_raise(mesh::parse_mesh_spec(spec.cast<std::string>()));
  if (py::isinstance<py::dict>(spec)) {
    const std::string text = py::module_::import("json").attr("dumps")(spec).cast<std::string>();
    return value_or_raise(mesh::parse_mesh_spec_json(text));
  }
  throw py::type_error("spec=" + py::repr(spec).cast<std::string>() +
                       " is not allowed; allowed: a dew.MeshSpec, a str such as 'fsdp=2,replicas=2', or a dict "
                       "such as {'fsdp': 2, 'replicas': 2}");
}

// A graph of exactly `ids` (one process, one granule, equal links).
mesh::DeviceGraph listed_devices(const std::vector<int>& ids) {
  std::vector<int> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  if (sorted.empty() || sorted.front() < 0 || sorted.size() > 4096) {
    throw py::value_error("devices=" + py::repr(py::cast(ids)).cast<std::string>() +
                          " is not allowed; allowed: 1 to 4096 device ids, each a whole number >= 0");
  }
  mesh::DeviceGraph graph;
  for (const int id : sorted) graph.devices.push_back({id, 0, "cpu"});
  graph.bandwidth = mesh::bandwidth_matrix(static_cast<int>(sorted.size()), [](int, int) { return 1.0; });
  return graph;
}

// MeshSpec(spec) or MeshSpec(fsdp=8, replicas=2), as the design page writes it.
mesh::MeshSpec spec_of_call(const py::object& spec, const py::kwargs& sizes) {
  if (!spec.is_none() && !sizes.empty()) {
    throw py::type_error("MeshSpec takes a spec or axis sizes as keywords (fsdp=8, replicas=2), not both");
  }
  if (spec.is_none()) {
    py::dict given;
    for (const auto& [name, size] : sizes) given[name] = size;
    return spec_of(given);
  }
  return spec_of(spec);
}

py::tuple build_mesh(const py::object& spec, std::optional<int> processes, std::optional<int> devices_per_process,
                     const py::object& topology, std::optional<std::vector<int>> devices) {
  const mesh::MeshSpec parsed = spec_of(spec);
  mesh::DeviceGraph graph;
  if (!topology.is_none()) {
    if (processes || devices_per_process) throw py::value_error("give topology= or processes=, not both");
    std::vector<std::string> files;
    if (py::isinstance<py::str>(topology)) {
      files.push_back(topology.cast<std::string>());
    } else {
      files = topology.cast<std::vector<std::string>>();
    }
    if (files.size() == 1) {
      auto host = value_or_raise(topology::load_topology_file(files[0]));
      if (host.gpus.empty()) throw py::value_error("topology='" + files[0] + "' has no GPUs to lay out");
      graph = axes::machine_graph(host);
    } else {
      graph = value_or_raise(axes::files_device_graph(files));
    }
  } else if (devices && !processes && !devices_per_process) {
    // The design page's build_mesh(spec, devices): the listed devices alone,
    // on one machine with equal links, filled in the order given.
    graph = listed_devices(*devices);
  } else {
    const int p = processes.value_or(1), d = devices_per_process.value_or(1);
    if (p < 1 || d < 1 || p > 4096 / d) {
      throw py::value_error("processes=" + std::to_string(p) + " x devices_per_process=" + std::to_string(d) +
                            " is not allowed; allowed: whole numbers >= 1 with at most 4096 devices in all");
    }
    graph = mesh::cpu_pool(p, d);
  }
  const mesh::Mesh built = value_or_raise(mesh::build_mesh(parsed, graph, devices));
  std::vector<py::ssize_t> shape(built.shape.begin(), built.shape.end());
  py::array_t<int> ids(shape);
  std::copy(built.devices.begin(), built.devices.end(), ids.mutable_data());
  py::tuple names(mesh::kAxisCount);
  for (int a = 0; a < mesh::kAxisCount; ++a) names[a] = py::str(std::string(mesh::kMeshAxes[a]));
  return py::make_tuple(ids, names);
}

py::tuple choose_exchange(int heads, int kv_heads, long long length, int sequence, int tensor, const std::string& mask,
                          int head_dim, int bytes_per_value, const std::string& gather_kernel,
                          std::optional<long long> key_length) {
  attention::Call call;
  call.heads = heads;
  call.kv_heads = kv_heads;
  call.query_length = length;
  call.key_length = key_length.value_or(length);
  call.sequence = sequence;
  call.tensor = tensor;
  call.mask = value_or_raise(attention::parse_mask_kind(mask));
  call.head_dim = head_dim;
  call.bytes_per_value = bytes_per_value;
  call.gather_kernel = value_or_raise(attention::parse_gather_kernel(gather_kernel));
  const attention::Plan plan = value_or_raise(attention::choose_exchange(call));
  return py::make_tuple(std::string(attention::exchange_name(plan.exchange)), plan.reason);
}

}  // namespace

void bind_mesh(py::module_& m) {
  py::class_<mesh::MeshSpec>(m, "MeshSpec", "Axis sizes and replicas, as `dew mesh --spec` takes them.")
      .def(py::init(&spec_of_call), py::arg("spec") = py::none(),
           "From keywords (fsdp=8, replicas=2), 'fsdp=2,replicas=2', '{\"fsdp\": 2}' or a dict; a bad spec raises "
           "ValueError naming it.")
      .def_property_readonly("replicas", [](const mesh::MeshSpec& s) { return s.replicas; })
      .def_property_readonly(
          "sizes",
          [](const mesh::MeshSpec& s) {
            py::dict sizes;
            for (int a = 0; a < mesh::kAxisCount; ++a) {
              if (s.sizes[a]) sizes[py::str(std::string(mesh::kMeshAxes[a]))] = *s.sizes[a];
            }
            return sizes;
          },
          "The axes that are set: {'fsdp': 2}.")
      .def("__str__", [](const mesh::MeshSpec& s) { return mesh::format_mesh_spec(s); })
      .def("__repr__", [](const mesh::MeshSpec& s) { return "dew.MeshSpec('" + mesh::format_mesh_spec(s) + "')"; });
  m.def("build_mesh", &build_mesh, py::arg("spec"), py::arg("processes") = py::none(),
        py::arg("devices_per_process") = py::none(), py::arg("topology") = py::none(), py::arg("devices") = py::none(),
        "The mesh `dew mesh --json` prints: (numpy array of device ids shaped like the mesh, axis names). Over "
        "a CPU pool (processes x devices_per_process), a topology file, or a list of files (one per host). "
        "jax.sharding.Mesh(np.array(devices)[ids], names) is the JAX mesh, with devices sorted by "
        "(process_index, id).");
  m.def("choose_exchange", &choose_exchange, py::arg("heads"), py::arg("kv_heads"), py::arg("length"),
        py::arg("sequence"), py::arg("tensor") = 1, py::arg("mask") = "causal", py::arg("head_dim") = 128,
        py::arg("bytes_per_value") = 2, py::arg("gather_kernel") = "dense-bias", py::arg("key_length") = py::none(),
        "The sequence-parallel exchange the rule picks for an attention call, and why: (exchange, reason), as "
        "`dew attention-plan` prints them.");
}

}  // namespace dew::python
