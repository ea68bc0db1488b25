// Placement: the order of one granule's devices that gives the innermost
// axes the fastest links.
//
// The problem. The devices fill a grid row-major; every line of the grid
// along an axis is one group of that axis. The score (score.cpp) is, per
// axis, the smallest bandwidth between two devices of one line, compared from
// the innermost axis out. The groups are not simply nested partitions: a
// tensor group takes the k-th device of each sequence group in its block, so
// how the sequence groups line up matters as much as which they are. Only
// the lines matter, so renumbering the coordinates of any axis (the same
// permutation across the whole grid) changes nothing: a layout has
// prod(size_a!) equal twins, and of the n! orders only n! / prod(size_a!)
// differ (16 devices as 4 x 4: 3.6e10).
//
// Exact search (n <= kExactPlacementLimit). The score is lexicographic, so
// the axes are settled one at a time from the innermost: for axis a, the
// highest threshold t such that some layout keeps every line of a at >= t
// (and every inner axis at its settled threshold) is found by binary search
// over the distinct link values. Each test is a depth-first search that
// fills positions in row-major order with devices in id order, keeping for
// every open position the devices still compatible with the lines it shares
// with placed ones (a bit mask each) and backtracking when one runs empty.
// Symmetry breaking leaves one layout per class of twins: the grid origin
// holds the smallest device and the lines through the origin increase along
// their axis (as long as only an inner block of axes is constrained, blocks
// are interchangeable too, so each block starts with the smallest device
// left). The last search, with every threshold set, returns the first
// layout it meets: the lexicographically smallest order among the best,
// which is what a brute force over all n! orders returns (tests check it),
// so equal links keep the id order. Measured worst case: 0.14 s for 16
// devices (bench/placement, docs/PERFORMANCE.md); a node budget far above
// that turns a pathological matrix over to the heuristic instead of hanging.
//
// Heuristic (larger granules, e.g. an NVL72 domain). Bottom-up greedy: the
// devices are grouped into lines of the innermost axis, those blocks into
// lines of the next axis, and so on. A group starts with the smallest unit
// left and adds, one at a time, the unit whose weakest link to the group is
// the strongest; then swaps between the weakest group and the others raise
// its bottleneck while they can. Two blocks side by side pair their k-th
// devices, and a block's inner order is not revisited once it is formed (the
// heuristic's main limit). It is one of the starts of placement_large.cpp
// (boxes placed exactly, then swaps that raise the score); the id order is
// kept when nothing beats it, so the result is never worse.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>

#include "dew/mesh.h"
#include "placement_search.h"

namespace dew::mesh {
namespace {

using Mask = std::uint64_t;
constexpr double kUnconstrained = -std::numeric_limits<double>::infinity();

}  // namespace

std::vector<double> detail::symmetric(std::span<const double> bandwidth, int n) {
  std::vector<double> w(static_cast<std::size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      w[i * n + j] = std::min(bandwidth[i * n + j], bandwidth[j * n + i]);
    }
  }
  return w;
}

namespace {

class ExactSearch {
 public:
  // dims: the axes of size > 1, outermost first.
  ExactSearch(int n, const std::vector<double>& w, std::vector<int> dims)
      : n_(n), w_(w), dims_(std::move(dims)), strides_(dims_.size(), 1) {
    for (int j = static_cast<int>(dims_.size()) - 2; j >= 0; --j) strides_[j] = strides_[j + 1] * dims_[j + 1];
    later_.resize(n_);
    for (int p = 0; p < n_; ++p) {
      for (int j = 0; j < static_cast<int>(dims_.size()); ++j) {
        const int coordinate = (p / strides_[j]) % dims_[j];
        for (int m = 1; coordinate + m < dims_[j]; ++m) later_[p].push_back({p + m * strides_[j], j});
      }
    }
  }

  // Is there a layout whose lines of axis j >= first all keep links >=
  // thresholds[j]? Axes before `first` are unconstrained. Fills *order with
  // the lexicographically smallest such layout.
  bool solve(const std::vector<double>& thresholds, int first, std::vector<int>* order) {
    const Mask all = n_ == 64 ? ~Mask{0} : (Mask{1} << n_) - 1;
    neighbours_.assign(dims_.size() * n_, all);
    for (int j = first; j < static_cast<int>(dims_.size()); ++j) {
      for (int x = 0; x < n_; ++x) {
        Mask mask = 0;
        for (int y = 0; y < n_; ++y) {
          if (y != x && w_[x * n_ + y] >= thresholds[j]) mask |= Mask{1} << y;
        }
        neighbours_[j * n_ + x] = mask;
      }
    }
    // Symmetry breaking over the block of constrained axes (see the top).
    const int block = first < static_cast<int>(dims_.size()) ? strides_[first] * dims_[first] : 1;
    before_.assign(n_, kFree);
    for (int p = 0; p < n_; ++p) {
      if (p % block == 0) {
        before_[p] = kSmallestLeft;
        continue;
      }
      int nonzero = 0;
      int axis = 0;
      for (int j = first; j < static_cast<int>(dims_.size()); ++j) {
        if ((p / strides_[j]) % dims_[j] != 0) {
          ++nonzero;
          axis = j;
        }
      }
      if (nonzero == 1) before_[p] = p - strides_[axis];
    }
    domains_.assign(static_cast<std::size_t>(n_ + 1) * n_, all);
    assigned_.assign(n_, -1);
    unused_ = all;
    if (!search(0)) return false;
    if (order != nullptr) *order = assigned_;
    return true;
  }

  // The budget ran out: no answer (the caller falls back to the heuristic).
  [[nodiscard]] bool exhausted() const { return exhausted_; }

 private:
  // Over 20 times the most any measured granule of up to 16 devices needed
  // (4.4e6 nodes, 0.14 s; about 3 s at this budget): a guard against a
  // pathological matrix hanging the command. A count, not a clock, so every process stops at the same
  // point and computes the same mesh.
  static constexpr std::int64_t kNodeBudget = 100'000'000;
  static constexpr int kFree = -1;
  static constexpr int kSmallestLeft = -2;

  bool search(int p) {
    if (p == n_) return true;
    if (++nodes_ > kNodeBudget) {
      exhausted_ = true;
      return false;
    }
    const Mask* domain = &domains_[static_cast<std::size_t>(p) * n_];
    Mask candidates = domain[p];
    if (before_[p] == kSmallestLeft) {
      candidates &= unused_ & (~unused_ + 1);
    } else if (before_[p] >= 0) {
      candidates &= ~((Mask{2} << assigned_[before_[p]]) - 1);
    }
    Mask* next = &domains_[static_cast<std::size_t>(p + 1) * n_];
    while (candidates != 0) {
      const int x = std::countr_zero(candidates);
      candidates &= candidates - 1;
      const Mask without = ~(Mask{1} << x);
      for (int r = p + 1; r < n_; ++r) next[r] = domain[r] & without;
      for (const auto& [r, j] : later_[p]) next[r] &= neighbours_[j * n_ + x];
      bool open = true;
      for (int r = p + 1; r < n_ && open; ++r) open = next[r] != 0;
      if (!open) continue;
      assigned_[p] = x;
      unused_ &= without;
      if (search(p + 1)) return true;
      unused_ |= ~without;
    }
    return false;
  }

  int n_;
  const std::vector<double>& w_;
  std::vector<int> dims_;
  std::vector<int> strides_;
  std::vector<std::vector<std::pair<int, int>>> later_;  // (position, axis) sharing a line, later
  std::vector<Mask> neighbours_;                         // [axis * n + device]
  std::vector<int> before_;    // position whose device must be smaller, or kFree/kSmallestLeft
  std::vector<Mask> domains_;  // [depth * n + position]
  std::vector<int> assigned_;
  Mask unused_ = 0;
  std::int64_t nodes_ = 0;
  bool exhausted_ = false;
};

}  // namespace

std::optional<std::vector<int>> detail::place_exact(int n, const std::vector<double>& w, const std::vector<int>& dims) {
  std::vector<double> values;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i != j) values.push_back(w[i * n + j]);
    }
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());

  ExactSearch search(n, w, dims);
  std::vector<double> thresholds(dims.size(), kUnconstrained);
  for (int j = static_cast<int>(dims.size()) - 1; j >= 0; --j) {
    // No line of size m can beat, for any device, its (m-1)-th best link.
    double bound = std::numeric_limits<double>::infinity();
    for (int x = 0; x < n; ++x) {
      std::vector<double> row;
      for (int y = 0; y < n; ++y) {
        if (y != x) row.push_back(w[x * n + y]);
      }
      std::nth_element(row.begin(), row.begin() + (dims[j] - 2), row.end(), std::greater<>());
      bound = std::min(bound, row[dims[j] - 2]);
    }
    // values[0], the slowest link, constrains nothing, so it is feasible.
    int low = 0;
    int high = static_cast<int>(std::upper_bound(values.begin(), values.end(), bound) - values.begin()) - 1;
    while (low < high) {
      const int middle = (low + high + 1) / 2;
      thresholds[j] = values[middle];
      if (search.solve(thresholds, j, nullptr)) {
        low = middle;
      } else if (search.exhausted()) {
        return std::nullopt;
      } else {
        high = middle - 1;
      }
    }
    thresholds[j] = values[low];
  }
  std::vector<int> order;
  if (!search.solve(thresholds, 0, &order)) return std::nullopt;
  return order;
}

namespace {

// Bottom-up greedy grouping (see the top).
class Heuristic {
 public:
  Heuristic(int n, const std::vector<double>& w) : n_(n), w_(w) {}

  std::vector<int> run(const std::vector<int>& dims) {
    std::vector<std::vector<int>> units(n_);
    for (int x = 0; x < n_; ++x) units[x] = {x};
    for (int j = static_cast<int>(dims.size()) - 1; j >= 0; --j) units = group(units, dims[j]);
    return units.front();
  }

 private:
  // Two units side by side: position k of one pairs with position k of the
  // other on the new axis.
  double link(const std::vector<int>& a, const std::vector<int>& b) const {
    double worst = std::numeric_limits<double>::infinity();
    for (std::size_t k = 0; k < a.size(); ++k) worst = std::min(worst, w_[a[k] * n_ + b[k]]);
    return worst;
  }

  std::vector<std::vector<int>> group(const std::vector<std::vector<int>>& units, int size) {
    const int count = static_cast<int>(units.size());
    std::vector<double> cost(static_cast<std::size_t>(count) * count, 0.0);
    for (int u = 0; u < count; ++u) {
      for (int v = u + 1; v < count; ++v) cost[u * count + v] = cost[v * count + u] = link(units[u], units[v]);
    }
    // Greedy: units arrive sorted by their smallest device, so ties go to
    // the smaller ids and equal links keep the id order.
    std::vector<bool> taken(count, false);
    std::vector<std::vector<int>> groups;
    std::vector<double> weakest(count);
    for (int start = 0; start < count; ++start) {
      if (taken[start]) continue;
      std::vector<int> members = {start};
      taken[start] = true;
      for (int v = 0; v < count; ++v) weakest[v] = cost[start * count + v];
      while (static_cast<int>(members.size()) < size) {
        int best = -1;
        for (int v = 0; v < count; ++v) {
          if (!taken[v] && (best < 0 || weakest[v] > weakest[best])) best = v;
        }
        members.push_back(best);
        taken[best] = true;
        for (int v = 0; v < count; ++v) weakest[v] = std::min(weakest[v], cost[best * count + v]);
      }
      groups.push_back(std::move(members));
    }
    improve(groups, cost, count);
    // New units: members in order of their smallest device, side by side.
    std::vector<std::vector<int>> result;
    for (auto& members : groups) std::sort(members.begin(), members.end());
    std::sort(groups.begin(), groups.end());
    for (const auto& members : groups) {
      std::vector<int> unit;
      for (const int u : members) unit.insert(unit.end(), units[u].begin(), units[u].end());
      result.push_back(std::move(unit));
    }
    return result;
  }

  static double bottleneck(const std::vector<int>& members, const std::vector<double>& cost, int count) {
    double worst = std::numeric_limits<double>::infinity();
    for (std::size_t a = 0; a < members.size(); ++a) {
      for (std::size_t b = a + 1; b < members.size(); ++b) {
        worst = std::min(worst, cost[members[a] * count + members[b]]);
      }
    }
    return worst;
  }

  // Swaps a unit of the weakest group with one of another group while that
  // lifts both above the current bottleneck; each swap leaves one group
  // fewer at the bottleneck or raises it, so this ends. Bounded in work so
  // that huge pools (thousands of CPU devices) stay fast.
  static void improve(std::vector<std::vector<int>>& groups, const std::vector<double>& cost, int count) {
    if (groups.size() < 2) return;
    std::int64_t budget = 20'000'000;
    std::vector<double> scores(groups.size());
    for (std::size_t g = 0; g < groups.size(); ++g) scores[g] = bottleneck(groups[g], cost, count);
    while (budget > 0) {
      const auto weakest = static_cast<std::size_t>(std::min_element(scores.begin(), scores.end()) - scores.begin());
      const double floor = scores[weakest];
      bool swapped = false;
      for (std::size_t a = 0; a < groups[weakest].size() && !swapped; ++a) {
        for (std::size_t g = 0; g < groups.size() && !swapped; ++g) {
          if (g == weakest) continue;
          for (std::size_t b = 0; b < groups[g].size() && !swapped; ++b) {
            budget -= static_cast<std::int64_t>(groups[weakest].size() * groups[weakest].size() +
                                                groups[g].size() * groups[g].size());
            std::swap(groups[weakest][a], groups[g][b]);
            const double first = bottleneck(groups[weakest], cost, count);
            const double second = bottleneck(groups[g], cost, count);
            if (std::min(first, second) > floor) {
              scores[weakest] = first;
              scores[g] = second;
              swapped = true;
            } else {
              std::swap(groups[weakest][a], groups[g][b]);
            }
          }
        }
      }
      if (!swapped) break;
    }
  }

  int n_;
  const std::vector<double>& w_;
};

}  // namespace

Placement place(std::span<const double> bandwidth, int n, const MeshShape& shape) {
  std::vector<int> dims;
  for (const int size : shape) {
    if (size > 1) dims.push_back(size);
  }
  std::vector<int> identity(n);
  std::iota(identity.begin(), identity.end(), 0);
  if (dims.empty()) return {identity, true};
  const std::vector<double> w = detail::symmetric(bandwidth, n);
  if (n <= kExactPlacementLimit) {
    if (auto order = detail::place_exact(n, w, dims)) return {*order, true};
  }
  // The best start of three (boxes, the greedy grouping, the id order),
  // then swaps; ties keep the earlier, and the id order only when nothing
  // beats it.
  std::vector<int> best = identity;
  std::vector<std::vector<int>> starts = {Heuristic(n, w).run(dims)};
  if (auto boxes = detail::place_by_boxes(n, w, dims)) starts.insert(starts.begin(), *boxes);
  for (auto& start : starts) {
    if (compare_scores(score_layout(bandwidth, n, shape, start), score_layout(bandwidth, n, shape, best)) > 0) {
      best = start;
    }
  }
  return {detail::improve_by_swaps(bandwidth, n, shape, best), false};
}

}  // namespace dew::mesh
