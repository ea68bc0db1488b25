// libFuzzer target for the MeshSpec parsers and build_mesh on small pools.
//
// Input: byte 0 picks the processes (1-8), byte 1 the devices per process
// (1-4), byte 2 the graph (bit 0: links from the input instead of equal
// ones; bit 1: one granule per process instead of one shared; bit 2: an
// explicit device order), the rest is the spec text. Checked: errors are one
// non-empty line; a parsed spec formats and parses back to itself; a shape
// multiplies to the device count; a mesh lists every device once, its
// groups tile it, each group's processes are its devices' processes, hybrid
// inner axes stay in one granule, and a single-granule placement is never
// worse than the id order.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <set>
#include <string>

#include "dew/mesh.h"
#include "fuzz_check.h"

namespace {

using namespace dew::mesh;

void check_message(const dew::Error& error) {
  FUZZ_CHECK(!error.message.empty());
  for (const char c : error.message) FUZZ_CHECK(static_cast<unsigned char>(c) >= 0x20);
}

void check_mesh(const Mesh& mesh, const DeviceGraph& graph, const std::vector<int>& expected_ids) {
  const auto n = static_cast<int>(mesh.devices.size());
  int product = 1;
  for (const int size : mesh.shape) {
    FUZZ_CHECK(size >= 1);
    product *= size;
  }
  FUZZ_CHECK(product == n);
  std::vector<int> sorted = mesh.devices;
  std::sort(sorted.begin(), sorted.end());
  FUZZ_CHECK(sorted == expected_ids);
  FUZZ_CHECK(mesh.processes.size() == mesh.devices.size());
  for (int a = 0; a < kAxisCount; ++a) {
    const AxisGroups& groups = mesh.groups[a];
    FUZZ_CHECK(static_cast<int>(groups.devices.size()) == n / mesh.shape[a]);
    FUZZ_CHECK(groups.processes.size() == groups.devices.size());
    std::vector<int> covered;
    for (std::size_t g = 0; g < groups.devices.size(); ++g) {
      FUZZ_CHECK(static_cast<int>(groups.devices[g].size()) == mesh.shape[a]);
      std::set<int> processes;
      for (const int id : groups.devices[g]) {
        covered.push_back(id);
        processes.insert(graph.devices[static_cast<std::size_t>(id)].process);  // ids are indices here
      }
      FUZZ_CHECK(std::vector<int>(processes.begin(), processes.end()) == groups.processes[g]);
      // Hybrid: stage, expert, tensor and sequence stay inside one granule
      // (a process, in these pools, when all share one).
      const bool inner = a == static_cast<int>(Axis::kStage) || a >= static_cast<int>(Axis::kExpert);
      if (mesh.layout == Layout::kHybrid && inner) {
        std::set<std::string> granules;
        for (const int id : groups.devices[g]) {
          const Device& device = graph.devices[static_cast<std::size_t>(id)];
          granules.insert(device.granule == "cpu" ? std::to_string(device.process) : device.granule);
        }
        FUZZ_CHECK(granules.size() == 1);
      }
    }
    std::sort(covered.begin(), covered.end());
    FUZZ_CHECK(covered == sorted);
  }
  if (mesh.layout == Layout::kPlacement && mesh.granules.size() == 1) {
    FUZZ_CHECK(compare_scores(mesh.score, mesh.id_order_score) >= 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  const int processes = data[0] % 8 + 1;
  const int per_process = data[1] % 4 + 1;
  const std::uint8_t flags = data[2];
  const std::string text(reinterpret_cast<const char*>(data + 3), size - 3);

  auto spec = parse_mesh_spec(text);
  if (!spec.ok()) {
    check_message(spec.error());
    return 0;
  }
  for (const auto& axis : spec.value().sizes) FUZZ_CHECK(!axis || (*axis >= 1 && *axis <= (1 << 20)));
  FUZZ_CHECK(spec.value().replicas >= 1 && spec.value().replicas <= (1 << 20));
  auto again = parse_mesh_spec(format_mesh_spec(spec.value()));
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again.value().sizes == spec.value().sizes && again.value().replicas == spec.value().replicas);

  DeviceGraph graph = cpu_pool(processes, per_process);
  const int n = processes * per_process;
  auto shape = resolve_shape(spec.value(), n);
  if (shape.ok()) {
    int product = 1;
    for (int a = 0; a < kAxisCount; ++a) {
      product *= shape.value()[a];
      if (spec.value().sizes[a]) FUZZ_CHECK(shape.value()[a] == *spec.value().sizes[a]);
    }
    FUZZ_CHECK(product == n);
  } else {
    check_message(shape.error());
  }

  if ((flags & 1) != 0) {
    // Links from the input: a simple generator seeded by the text.
    std::uint32_t state = 2166136261u;
    for (const char c : text) state = (state ^ static_cast<std::uint8_t>(c)) * 16777619u;
    for (double& link : graph.bandwidth) {
      state = state * 1664525u + 1013904223u;
      link = static_cast<double>(state >> 28);
    }
  }
  if ((flags & 2) != 0) {
    for (Device& device : graph.devices) device.granule = "host:" + std::to_string(device.process);
  }
  std::optional<std::vector<int>> order;
  std::vector<int> ids(static_cast<std::size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  if ((flags & 4) != 0) {
    order = ids;
    std::rotate(order->begin(), order->begin() + (flags >> 3) % n, order->end());
  }
  auto mesh = build_mesh(spec.value(), graph, order);
  if (!mesh.ok()) {
    check_message(mesh.error());
    return 0;
  }
  check_mesh(mesh.value(), graph, ids);
  return 0;
}
