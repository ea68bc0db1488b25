#include <algorithm>
#include <cmath>

#include "dew/layout_parity.h"

namespace dew::train {
namespace {

std::string group_of(const std::string& leaf) {
  if (leaf == "embedding" || leaf == "positions") return leaf;
  if (leaf.find("gain") != std::string::npos) return "norms";
  if (leaf.find(".w1") != std::string::npos || leaf.find(".w2") != std::string::npos) return "mlp";
  return "attention";
}

std::vector<double> losses_of(const WorkerReport& r) {
  std::vector<double> losses = r.earlier_losses;
  for (const auto& s : r.steps) losses.push_back(s.loss);
  return losses;
}

}  // namespace

std::vector<ParityLayout> parity_layouts(int devices) {
  std::vector<ParityLayout> layouts;
  const auto divides = [](int a, int b) { return a > 0 && b % a == 0; };
  for (int data = 1; data <= devices; ++data) {
    for (int fsdp = 1; data * fsdp <= devices; ++fsdp) {
      for (int tensor = 1; data * fsdp * tensor <= devices; ++tensor) {
        const int rest = data * fsdp * tensor;
        if (!divides(rest, devices)) continue;
        const int sequence = devices / rest;
        std::string mesh = "data=" + std::to_string(data);
        if (fsdp > 1) mesh += ",fsdp=" + std::to_string(fsdp);
        if (tensor > 1) mesh += ",tensor=" + std::to_string(tensor);
        if (sequence > 1) mesh += ",sequence=" + std::to_string(sequence);
        std::vector<std::string> meshes = {mesh};
        // The data axis spans the replica groups (build_mesh's rule).
        for (int replicas = 2; replicas <= data; ++replicas) {
          if (divides(replicas, data)) meshes.push_back(mesh + ",replicas=" + std::to_string(replicas));
        }
        for (const auto& m : meshes) {
          if (sequence == 1) {
            layouts.push_back({m, "auto"});
          } else {
            layouts.push_back({m, "all-to-all"});
            layouts.push_back({m, "gather"});
          }
        }
      }
    }
  }
  return layouts;
}

std::vector<GroupDeviation> compare_to_reference(const WorkerReport& layout, const WorkerReport& reference,
                                                 const WorkerReport& reordered, double factor, double slack) {
  std::vector<GroupDeviation> out;
  for (const char* group : kParityGroups) out.push_back(GroupDeviation{group, 0, 0, 0, false});
  const auto note = [&](const std::string& group, double value, double ref, double reordered_value) {
    for (auto& g : out) {
      if (g.group != group) continue;
      const double deviation = std::isfinite(value) ? std::abs(value - ref) : INFINITY;
      g.deviation = std::max(g.deviation, deviation);
      g.floor = std::max(g.floor, std::abs(reordered_value - ref));
      g.scale = std::max(g.scale, std::abs(ref));
    }
  };
  const auto a = losses_of(layout), r = losses_of(reference), o = losses_of(reordered);
  for (std::size_t k = 0; k < r.size(); ++k) note("loss", k < a.size() ? a[k] : INFINITY, r[k], o[k]);
  for (const auto& leaf : reference.leaves) {
    const std::string group = group_of(leaf.name);
    for (std::int64_t k = leaf.offset; k < leaf.offset + leaf.size; ++k) {
      const auto at = std::size_t(k);
      note(group, at < layout.gradient.size() ? layout.gradient[at] : INFINITY, reference.gradient[at],
           reordered.gradient[at]);
    }
  }
  // Units in the last place grow with the value: the slack is relative above 1 (a loss of 4 whose reversed batch
  // happened to land within 1.5e-10 of the reference has, on another CPU's BLAS, layouts 3e-9 off).
  for (auto& g : out) g.pass = g.deviation <= factor * g.floor + slack * std::max(1.0, g.scale);
  return out;
}

}  // namespace dew::train
