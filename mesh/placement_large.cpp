// Placement past kExactPlacementLimit devices (several boxes joined by
// slower links, an NVL72 domain): the structure of the link classes first,
// then a local search.
//
// Boxes. Devices joined by links faster than any link between their groups
// form boxes (8-GPU servers on a network, NVLink islands on PCIe). When the
// innermost axes fit in one box (their sizes multiply to a divisor of the box
// size), their best lines lie inside boxes: a line that leaves its box runs
// at the slowest link between boxes, no faster than any link inside. So each
// box is placed exactly (place_exact: its inner axes, and one outer axis of
// box size / inner size for the rest) and the boxes follow each other in the
// order of their smallest device. This finds sparse NVLink meshes (a DGX-1's
// NV1/NV2 hybrid cube mesh), hidden groups of four in eight, and device ids
// in any order, which a greedy grouping misses.
//
// Swaps. Then any two devices swap places while that raises the score
// (score.cpp: lexicographic, innermost axis first), for the axes whose lines
// cross boxes and for granules with no box structure.
#include <algorithm>
#include <functional>
#include <map>
#include <numeric>

#include "placement_search.h"

namespace dew::mesh::detail {
namespace {

// The components of the graph of links faster than `floor`.
std::vector<std::vector<int>> components_above(int n, const std::vector<double>& w, double floor) {
  std::vector<int> parent(static_cast<std::size_t>(n));
  std::iota(parent.begin(), parent.end(), 0);
  const std::function<int(int)> root = [&](int x) { return parent[x] == x ? x : parent[x] = root(parent[x]); };
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      if (w[i * n + j] > floor) parent[root(i)] = root(j);
    }
  }
  std::map<int, std::vector<int>> by_root;
  for (int x = 0; x < n; ++x) by_root[root(x)].push_back(x);
  std::vector<std::vector<int>> boxes;
  for (auto& [r, members] : by_root) boxes.push_back(std::move(members));
  std::sort(boxes.begin(), boxes.end());  // by smallest device (members are sorted)
  return boxes;
}

// The largest boxes of equal size 2..kExactPlacementLimit, at least two.
std::optional<std::vector<std::vector<int>>> find_boxes(int n, const std::vector<double>& w) {
  std::vector<double> values;
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) values.push_back(w[i * n + j]);
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  for (const double floor : values) {
    auto boxes = components_above(n, w, floor);
    if (boxes.size() < 2) continue;
    const std::size_t size = boxes.front().size();
    if (size > static_cast<std::size_t>(kExactPlacementLimit)) continue;
    const bool equal = std::all_of(boxes.begin(), boxes.end(), [&](const auto& b) { return b.size() == size; });
    if (!equal) continue;
    if (size < 2) return std::nullopt;
    return boxes;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::vector<int>> place_by_boxes(int n, const std::vector<double>& w, const std::vector<int>& dims) {
  auto found = find_boxes(n, w);
  if (!found) return std::nullopt;
  const auto& boxes = *found;
  const int box = static_cast<int>(boxes.front().size());
  // The innermost axes whose sizes multiply to a divisor of the box.
  std::vector<int> inner;
  int product = 1;
  for (auto it = dims.rbegin(); it != dims.rend() && box % (product * *it) == 0; ++it) {
    product *= *it;
    inner.insert(inner.begin(), *it);
  }
  if (inner.empty()) return std::nullopt;
  if (box / product > 1) inner.insert(inner.begin(), box / product);
  std::vector<int> order;
  for (const auto& members : boxes) {
    std::vector<double> local(static_cast<std::size_t>(box) * box);
    for (int a = 0; a < box; ++a) {
      for (int b = 0; b < box; ++b) local[a * box + b] = w[members[a] * n + members[b]];
    }
    auto placed = place_exact(box, local, inner);
    if (!placed) return std::nullopt;
    for (const int k : *placed) order.push_back(members[k]);
  }
  return order;
}

std::vector<int> improve_by_swaps(std::span<const double> bandwidth, int n, const MeshShape& shape,
                                  std::vector<int> order) {
  // About 0.3 s of work for 72 devices at the most.
  std::int64_t budget = 40'000;
  Score best = score_layout(bandwidth, n, shape, order);
  bool improved = true;
  while (improved && budget > 0) {
    improved = false;
    for (int a = 0; a < n && budget > 0; ++a) {
      for (int b = a + 1; b < n && budget > 0; ++b, --budget) {
        std::swap(order[a], order[b]);
        const Score score = score_layout(bandwidth, n, shape, order);
        if (compare_scores(score, best) > 0) {
          best = score;
          improved = true;
        } else {
          std::swap(order[a], order[b]);
        }
      }
    }
  }
  return order;
}

}  // namespace dew::mesh::detail
