// The score of a layout: per axis, the slowest link inside any of its groups.
// A collective over an axis runs at the pace of its slowest link, so the
// bottleneck (not the mean) is what a layout should raise.
#include <algorithm>
#include <limits>

#include "dew/mesh.h"

namespace dew::mesh {

int compare_scores(const Score& a, const Score& b) {
  // Innermost first: sequence and tensor run collectives in every layer, so
  // no gain on an outer axis pays for a slower inner one.
  for (int axis = kAxisCount - 1; axis >= 0; --axis) {
    if (a.bottleneck[axis] != b.bottleneck[axis]) return a.bottleneck[axis] > b.bottleneck[axis] ? 1 : -1;
  }
  return 0;
}

Score score_layout(std::span<const double> bandwidth, int n, const MeshShape& shape, std::span<const int> order) {
  Score score;
  score.bottleneck.fill(std::numeric_limits<double>::infinity());
  const auto size = static_cast<int>(order.size());
  int stride = 1;
  for (int axis = kAxisCount - 1; axis >= 0; --axis) {
    const int length = shape[axis];
    double worst = std::numeric_limits<double>::infinity();
    // Each group starts where this axis's coordinate is 0.
    for (int start = 0; length > 1 && start < size; ++start) {
      if ((start / stride) % length != 0) continue;
      for (int i = 0; i < length; ++i) {
        const auto from = static_cast<std::size_t>(order[start + i * stride]);
        for (int j = 0; j < length; ++j) {
          if (i == j) continue;
          const auto to = static_cast<std::size_t>(order[start + j * stride]);
          worst = std::min(worst, bandwidth[from * static_cast<std::size_t>(n) + to]);
        }
      }
    }
    score.bottleneck[axis] = worst;
    stride *= length;
  }
  return score;
}

}  // namespace dew::mesh
