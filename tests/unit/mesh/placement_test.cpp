// Placement: the exact search against a brute force over every order, for
// every mesh shape of up to 8 devices, on topology-like and random matrices;
// the expectations of the topology issue; the heuristic at NVL72 size.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "axis_index.h"
#include "dew/mesh.h"
#include "sanitizer_slowdown.h"

namespace dew::mesh {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Link classes as GB/s estimates, in the order nvidia-smi topo -m ranks them.
constexpr double kNV1 = 25, kNV2 = 50, kPIX = 24, kPXB = 20, kPHB = 12, kNODE = 10, kSYS = 6;

using Matrix = std::vector<double>;

using dew::mesh::bandwidth_matrix;

Matrix uniform(int n, double value) {
  return bandwidth_matrix(n, [&](int, int) { return value; });
}

// 4 GPUs, NVLink pairs (0,1) and (2,3) (power8: P100 pairs), SYS between.
Matrix nvlink_pairs() {
  return bandwidth_matrix(4, [](int i, int j) { return i / 2 == j / 2 ? 2 * kNV2 : kSYS; });
}

// 4x RTX 3090 as on the design page: an NV4 pair, a PHB pair, the two across sockets.
Matrix rtx3090_box() {
  return bandwidth_matrix(4, [](int i, int j) {
    if (i / 2 != j / 2) return kSYS;
    return i < 2 ? 4 * kNV1 : kPHB;
  });
}

// The K40m-style box: PCIe only, two GPUs under a switch per socket.
Matrix pcie_box() {
  return bandwidth_matrix(4, [](int i, int j) { return i / 2 == j / 2 ? kPIX : kSYS; });
}

// DGX-1 (V100): the hybrid cube mesh of NV1 and NV2 links.
Matrix dgx1() {
  static const int links[8][8] = {{0, 1, 1, 2, 2, 0, 0, 0}, {1, 0, 2, 1, 0, 2, 0, 0}, {1, 2, 0, 2, 0, 0, 1, 0},
                                  {2, 1, 2, 0, 0, 0, 0, 1}, {2, 0, 0, 0, 0, 1, 1, 2}, {0, 2, 0, 0, 1, 0, 2, 1},
                                  {0, 0, 1, 0, 1, 2, 0, 2}, {0, 0, 0, 1, 2, 1, 2, 0}};
  return bandwidth_matrix(8, [](int i, int j) {
    if (links[i][j] > 0) return links[i][j] * kNV1;
    return i / 4 == j / 4 ? kNODE : kSYS;
  });
}

// p4d.24xlarge without NVLink data: PCIe classes only (PXB pairs under a
// switch, NODE within a socket, SYS across).
Matrix p4d_classes() {
  return bandwidth_matrix(8, [](int i, int j) {
    if (i / 2 == j / 2) return kPXB;
    return i / 4 == j / 4 ? kNODE : kSYS;
  });
}

// mt19937's raw output is the same on every platform (its distributions are
// not), so these matrices are too.
Matrix random_matrix(int n, unsigned seed, unsigned levels, bool symmetric) {
  std::mt19937 rng(seed);
  Matrix m = bandwidth_matrix(n, [&](int, int) { return 1.0 + static_cast<double>(rng() % levels); });
  if (symmetric) {
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < i; ++j) m[i * n + j] = m[j * n + i];
    }
  }
  return m;
}

Matrix leading(const Matrix& m, int size, int n) {
  return bandwidth_matrix(n, [&](int i, int j) { return m[i * size + j]; });
}

void all_shapes(int left, int axis, MeshShape current, std::vector<MeshShape>& out) {
  if (axis == kAxisCount) {
    if (left == 1) out.push_back(current);
    return;
  }
  for (int size = 1; size <= left; ++size) {
    if (left % size != 0) continue;
    current[axis] = size;
    all_shapes(left / size, axis + 1, current, out);
  }
}

std::vector<MeshShape> shapes_of(int n) {
  std::vector<MeshShape> out;
  all_shapes(n, 0, {}, out);
  return out;
}

// The axes of size > 1, outermost first: shapes that agree on it pose the
// same problem, so one brute force serves them all.
std::vector<int> key_of(const MeshShape& shape) {
  std::vector<int> key;
  for (const int size : shape) {
    if (size > 1) key.push_back(size);
  }
  return key;
}

// Every order of 0..n-1 in lexicographic order; the first with the best
// score is the lexicographically smallest best one, which placement must
// return.
std::vector<int> brute_force(const Matrix& m, int n, const MeshShape& shape) {
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::vector<int> best = order;
  Score best_score = score_layout(m, n, shape, order);
  while (std::next_permutation(order.begin(), order.end())) {
    const Score score = score_layout(m, n, shape, order);
    if (compare_scores(score, best_score) > 0) {
      best_score = score;
      best = order;
    }
  }
  return best;
}

std::string shape_text(const MeshShape& shape) {
  std::string out;
  for (int a = 0; a < kAxisCount; ++a) out += std::string(a ? "," : "") + std::to_string(shape[a]);
  return out;
}

void expect_matches_brute_force(const std::string& name, const Matrix& m, int n) {
  std::map<std::vector<int>, std::vector<int>> cache;
  for (const MeshShape& shape : shapes_of(n)) {
    const auto key = key_of(shape);
    if (!cache.contains(key)) cache[key] = brute_force(m, n, shape);
    const Placement placement = place(m, n, shape);
    EXPECT_TRUE(placement.exact);
    EXPECT_EQ(placement.order, cache[key]) << name << ", shape " << shape_text(shape);
  }
}

TEST(ScoreTest, BottleneckPerAxisInsideItsGroups) {
  // data=2 x tensor=2 over [0, 2, 1, 3] on the NVLink-pair box: tensor groups
  // {0,2} and {1,3} cross the pairs, data groups {0,1} and {2,3} are them.
  const Matrix m = nvlink_pairs();
  const std::vector<int> order = {0, 2, 1, 3};
  const Score score = score_layout(m, 4, {2, 1, 1, 1, 2, 1}, order);
  EXPECT_EQ(score.bottleneck[kTensor], kSYS);
  EXPECT_EQ(score.bottleneck[kData], 2 * kNV2);
  EXPECT_EQ(score.bottleneck[kSequence], kInf);
  EXPECT_EQ(score.bottleneck[kFsdp], kInf);
}

TEST(ScoreTest, AnAsymmetricLinkCountsItsSlowerDirection) {
  Matrix m = uniform(2, 10);
  m[0 * 2 + 1] = 3;
  const std::vector<int> order = {1, 0};
  EXPECT_EQ(score_layout(m, 2, {1, 1, 1, 1, 1, 2}, order).bottleneck[kSequence], 3);
}

TEST(ScoreTest, InnerAxesDecideFirst) {
  Score a;
  Score b;
  a.bottleneck = {100, kInf, kInf, kInf, 10, kInf};
  b.bottleneck = {1, kInf, kInf, kInf, 20, kInf};
  EXPECT_LT(compare_scores(a, b), 0);  // a faster data axis does not pay for a slower tensor axis
  EXPECT_GT(compare_scores(b, a), 0);
  b.bottleneck[kTensor] = 10;
  EXPECT_GT(compare_scores(a, b), 0);  // equal tensor: data decides
  EXPECT_EQ(compare_scores(a, a), 0);
}

TEST(PlacementTest, MatchesBruteForceOnTopologyLikeMatrices) {
  const std::vector<std::pair<std::string, Matrix>> boxes = {
      {"nvlink pairs", nvlink_pairs()}, {"rtx3090", rtx3090_box()},  {"pcie", pcie_box()}, {"dgx1", dgx1()},
      {"p4d", p4d_classes()},           {"uniform", uniform(8, 300)}};
  for (const auto& [name, m] : boxes) {
    const int size = static_cast<int>(std::lround(std::sqrt(static_cast<double>(m.size()))));
    // Every leading part too: a box with fewer of its GPUs.
    for (int n = 1; n <= size; ++n)
      expect_matches_brute_force(name + " (" + std::to_string(n) + ")", leading(m, size, n), n);
  }
}

TEST(PlacementTest, MatchesBruteForceOnRandomMatrices) {
  for (int n = 2; n <= 8; ++n) {
    // Few levels make ties (where the id order must win); many make every
    // link distinct; odd seeds are asymmetric.
    const int seeds = n <= 6 ? 20 : 10;
    for (int seed = 0; seed < seeds; ++seed) {
      const unsigned levels = seed % 3 == 0 ? 2u : (seed % 3 == 1 ? 4u : 1000u);
      const Matrix m = random_matrix(n, 1000u * n + seed, levels, seed % 2 == 0);
      expect_matches_brute_force("random n=" + std::to_string(n) + " seed=" + std::to_string(seed), m, n);
    }
  }
}

// The device sets of the groups of `axis` when `order` fills `shape`.
std::set<std::set<int>> groups_of(const std::vector<int>& order, const MeshShape& shape, int axis) {
  int stride = 1;
  for (int a = kAxisCount - 1; a > axis; --a) stride *= shape[a];
  std::set<std::set<int>> groups;
  for (int start = 0; start < static_cast<int>(order.size()); ++start) {
    if ((start / stride) % shape[axis] != 0) continue;
    std::set<int> group;
    for (int k = 0; k < shape[axis]; ++k) group.insert(order[start + k * stride]);
    groups.insert(group);
  }
  return groups;
}

TEST(PlacementTest, TwoWaySequenceOrTensorLandsOnTheNVLinkPairs) {
  const std::set<std::set<int>> pairs = {{0, 1}, {2, 3}};
  for (const MeshShape& shape : {MeshShape{2, 1, 1, 1, 1, 2}, MeshShape{2, 1, 1, 1, 2, 1}, MeshShape{1, 1, 2, 1, 2, 1},
                                 MeshShape{1, 1, 1, 1, 2, 2}}) {
    const int inner = shape[kSequence] > 1 ? kSequence : kTensor;
    for (const Matrix& m : {nvlink_pairs(), rtx3090_box(), pcie_box()}) {
      EXPECT_EQ(groups_of(place(m, 4, shape).order, shape, inner), pairs) << shape_text(shape);
    }
  }
  // Numbered the other way (pairs 0-2 and 1-3), the layout is the design page's
  // hand-written [0, 2, 1, 3].
  const Matrix swapped = bandwidth_matrix(4, [](int i, int j) { return i % 2 == j % 2 ? 2 * kNV2 : kSYS; });
  EXPECT_EQ(place(swapped, 4, {2, 1, 1, 1, 2, 1}).order, (std::vector<int>{0, 2, 1, 3}));
  // With sequence inside tensor, sequence takes the pairs.
  EXPECT_EQ(place(swapped, 4, {1, 1, 1, 1, 2, 2}).order, (std::vector<int>{0, 2, 1, 3}));
}

TEST(PlacementTest, EqualLinksKeepTheIdOrderForEveryShape) {
  // DGX-2: 16 V100s through NVSwitch, one bandwidth for every pair.
  std::vector<int> identity(16);
  std::iota(identity.begin(), identity.end(), 0);
  const Matrix dgx2 = uniform(16, 150);
  for (const MeshShape& shape : shapes_of(16)) {
    const Placement placement = place(dgx2, 16, shape);
    EXPECT_TRUE(placement.exact);
    EXPECT_EQ(placement.order, identity) << shape_text(shape);
  }
}

TEST(PlacementTest, SameInputSameOrder) {
  const Matrix m = random_matrix(12, 7, 5, true);
  const MeshShape shape = {1, 1, 3, 1, 2, 2};
  const Placement first = place(m, 12, shape);
  EXPECT_EQ(place(m, 12, shape).order, first.order);
  // The same problem under other axis names gives the same order.
  EXPECT_EQ(place(m, 12, {3, 1, 1, 2, 1, 2}).order, first.order);
}

// 16 devices in 4 NVLink quads whose ids are shuffled, quads in pairs at a
// middle speed: the optimum is known without a brute force.
TEST(PlacementTest, SixteenDevicesFindTheHiddenQuads) {
  std::vector<int> label(16);
  std::iota(label.begin(), label.end(), 0);
  std::shuffle(label.begin(), label.end(), std::mt19937(3));
  const Matrix m = bandwidth_matrix(16, [&](int i, int j) {
    if (label[i] / 4 == label[j] / 4) return 4 * kNV1;
    return label[i] / 8 == label[j] / 8 ? kNODE : kSYS;
  });
  std::set<std::set<int>> quads;
  for (int q = 0; q < 4; ++q) {
    std::set<int> quad;
    for (int d = 0; d < 16; ++d) {
      if (label[d] / 4 == q) quad.insert(d);
    }
    quads.insert(quad);
  }
  const MeshShape shape = {2, 1, 2, 1, 4, 1};
  const Placement placement = place(m, 16, shape);
  EXPECT_TRUE(placement.exact);
  EXPECT_EQ(groups_of(placement.order, shape, kTensor), quads);
  const Score score = score_layout(m, 16, shape, placement.order);
  EXPECT_EQ(score.bottleneck[kTensor], 4 * kNV1);
  EXPECT_EQ(score.bottleneck[kFsdp], kNODE);  // the two quads of a socket
  EXPECT_EQ(score.bottleneck[kData], kSYS);
}

TEST(PlacementTest, SixteenRandomDevicesStayFast) {
  // Timing guard for the exact search (about 0.05 s each when optimized).
  for (unsigned seed = 0; seed < 3; ++seed) {
    const Matrix m = random_matrix(16, seed, seed == 0 ? 2u : 1000u, true);
    for (const MeshShape& shape :
         {MeshShape{1, 1, 1, 1, 4, 4}, MeshShape{1, 1, 2, 2, 2, 2}, MeshShape{1, 1, 1, 2, 4, 2}}) {
      const auto start = std::chrono::steady_clock::now();
      const Placement placement = place(m, 16, shape);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_TRUE(placement.exact);
      EXPECT_LT(seconds, 5.0 * dew::testing::kSanitizerSlowdown) << "seed " << seed << ", shape " << shape_text(shape);
      std::vector<int> sorted = placement.order;
      std::sort(sorted.begin(), sorted.end());
      std::vector<int> identity(16);
      std::iota(identity.begin(), identity.end(), 0);
      EXPECT_EQ(sorted, identity);
    }
  }
}

TEST(PlacementTest, Nvl72HeuristicFindsQuadsFastAndNeverLosesToIdOrder) {
  const int n = 72;
  std::vector<int> label(n);
  std::iota(label.begin(), label.end(), 0);
  std::shuffle(label.begin(), label.end(), std::mt19937(11));
  // 18 quads at the top speed, pairs of quads a step down, the rest slower.
  const Matrix m = bandwidth_matrix(n, [&](int i, int j) {
    if (label[i] / 4 == label[j] / 4) return 900.0;
    return label[i] / 8 == label[j] / 8 ? 450.0 : 100.0;
  });
  std::vector<int> identity(n);
  std::iota(identity.begin(), identity.end(), 0);
  for (const MeshShape& shape :
       {MeshShape{18, 1, 1, 1, 4, 1}, MeshShape{9, 1, 1, 1, 2, 4}, MeshShape{1, 1, 9, 1, 4, 2}}) {
    const auto start = std::chrono::steady_clock::now();
    const Placement placement = place(m, n, shape);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_FALSE(placement.exact);
    EXPECT_LT(seconds, 1.0 * dew::testing::kSanitizerSlowdown) << shape_text(shape);
    const Score score = score_layout(m, n, shape, placement.order);
    // The innermost axis gets the quads, the next the pairs of quads: the
    // optimum here, where the id order gets the slowest links.
    const int inner = shape[kSequence] > 1 ? kSequence : kTensor;
    EXPECT_EQ(score.bottleneck[inner], 900.0) << shape_text(shape);
    if (shape[kSequence] > 1) {
      EXPECT_EQ(score.bottleneck[kTensor], 450.0) << shape_text(shape);
    }
    EXPECT_EQ(score_layout(m, n, shape, identity).bottleneck[inner], 100.0);
  }
  // Equal links: the id order. Random links: never worse than the id order.
  EXPECT_EQ(place(uniform(n, 900), n, {9, 1, 1, 1, 8, 1}).order, identity);
  for (unsigned seed = 0; seed < 4; ++seed) {
    const Matrix r = random_matrix(n, seed, 1000, seed % 2 == 0);
    for (const MeshShape& shape :
         {MeshShape{18, 1, 1, 1, 4, 1}, MeshShape{1, 1, 9, 1, 4, 2}, MeshShape{2, 1, 3, 1, 3, 4}}) {
      const Placement placement = place(r, n, shape);
      EXPECT_GE(compare_scores(score_layout(r, n, shape, placement.order), score_layout(r, n, shape, identity)), 0);
      std::vector<int> sorted = placement.order;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(sorted, identity);
    }
  }
}

}  // namespace
}  // namespace dew::mesh
