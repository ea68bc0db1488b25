// What placement.cpp and placement_large.cpp share. Private to mesh/.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "dew/mesh.h"

namespace dew::mesh::detail {

// Symmetric link strength: a pair is only as good as its slower direction.
std::vector<double> symmetric(std::span<const double> bandwidth, int n);

// The proven best order of n devices (w symmetric, n x n) for the axes of
// size > 1 `dims`, outermost first; nullopt when the search ran out of its
// node budget. n <= kExactPlacementLimit.
std::optional<std::vector<int>> place_exact(int n, const std::vector<double>& w, const std::vector<int>& dims);

// Past kExactPlacementLimit: the devices split into boxes (the components of
// the links faster than the fastest link between components), each box's
// inner axes placed by place_exact, the boxes one after the other; nullopt
// when the links have no such structure (boxes of equal size, at most
// kExactPlacementLimit each) or no inner axis fits in a box.
std::optional<std::vector<int>> place_by_boxes(int n, const std::vector<double>& w, const std::vector<int>& dims);

// Swaps of two devices that raise the layout's score, taken until none does
// (bounded by a count, so every process computes the same order).
std::vector<int> improve_by_swaps(std::span<const double> bandwidth, int n, const MeshShape& shape,
                                  std::vector<int> order);

}  // namespace dew::mesh::detail
