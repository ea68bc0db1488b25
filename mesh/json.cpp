// The mesh as JSON for programs (`dew mesh --json`). "<axis>_groups" holds
// processes, as the design page's distribution worker writes them to pool.json, so
// the two can be compared directly; "<axis>_group_devices" holds device ids.
#include <cmath>
#include <nlohmann/json.hpp>

#include "dew/mesh.h"

namespace dew::mesh {
namespace {

nlohmann::json score_json(const Score& score) {
  nlohmann::json out = nlohmann::json::object();
  for (int axis = 0; axis < kAxisCount; ++axis) {
    const double value = score.bottleneck[axis];
    // No link inside a size-1 axis: nothing to report.
    out[std::string(kMeshAxes[axis])] = std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
  }
  return out;
}

}  // namespace

std::string mesh_to_json(const Mesh& mesh) {
  nlohmann::json out;
  out["axes"] = kMeshAxes;
  out["shape"] = mesh.shape;
  out["replicas"] = mesh.replicas;
  out["layout"] = layout_name(mesh.layout);
  out["exact"] = mesh.exact;
  out["devices"] = mesh.devices;
  out["processes"] = mesh.processes;
  out["granules"] = mesh.granules;
  out["granule_shape"] = mesh.granule_shape;
  for (int axis = 0; axis < kAxisCount; ++axis) {
    const std::string name(kMeshAxes[axis]);
    out[name + "_groups"] = mesh.groups[axis].processes;
    out[name + "_group_devices"] = mesh.groups[axis].devices;
  }
  out["score"] = score_json(mesh.score);
  out["id_order_score"] = score_json(mesh.id_order_score);
  out["notes"] = mesh.notes;
  return out.dump();
}

}  // namespace dew::mesh
