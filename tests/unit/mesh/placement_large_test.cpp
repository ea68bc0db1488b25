// Placement past 16 devices: boxes of GPUs joined by slow links (uniform
// NVSwitch boxes, DGX-1's sparse NV1/NV2 hybrid cube mesh, hidden groups of
// four in eight), device ids in box order and shuffled. The reference is the
// exact search (itself checked against a brute force over every order) on
// one box: a line that leaves its box runs at the slow link, so the best
// score of the inner axes is the best inside one box.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <numeric>
#include <random>
#include <string>

#include "axis_index.h"
#include "dew/mesh.h"
#include "sanitizer_slowdown.h"

namespace dew::mesh {
namespace {

using Matrix = std::vector<double>;
constexpr double kBetweenBoxes = 6.3;

// One box of `size` GPUs: link(i, j) within it.
struct Box {
  std::string name;
  int size;
  std::function<double(int, int)> link;
};

Box nvswitch_box(int size) {
  return {"nvswitch" + std::to_string(size), size, [](int, int) { return 450.0; }};
}

Box dgx1_box() {
  static const int links[8][8] = {{0, 1, 1, 2, 2, 0, 0, 0}, {1, 0, 2, 1, 0, 2, 0, 0}, {1, 2, 0, 2, 0, 0, 1, 0},
                                  {2, 1, 2, 0, 0, 0, 0, 1}, {2, 0, 0, 0, 0, 1, 1, 2}, {0, 2, 0, 0, 1, 0, 2, 1},
                                  {0, 0, 1, 0, 1, 2, 0, 2}, {0, 0, 0, 1, 2, 1, 2, 0}};
  return {"dgx1", 8, [](int i, int j) {
            if (links[i][j] > 0) return links[i][j] * 25.0;
            return i / 4 == j / 4 ? 10.0 : 8.0;
          }};
}

// Two groups of four at NVLink speed inside eight, halves on PCIe.
Box hidden_quads_box(int size) {
  return {"quads" + std::to_string(size), size, [](int i, int j) { return i / 4 == j / 4 ? 100.0 : 24.0; }};
}

// `boxes` copies of `box`; device d is box member label[d] % size of box
// label[d] / size (labels shuffled with `seed`, or in order for seed 0).
Matrix machines(const Box& box, int boxes, unsigned seed) {
  const int n = box.size * boxes;
  std::vector<int> label(n);
  std::iota(label.begin(), label.end(), 0);
  if (seed != 0) std::shuffle(label.begin(), label.end(), std::mt19937(seed));
  return bandwidth_matrix(n, [&](int i, int j) {
    if (label[i] / box.size != label[j] / box.size) return kBetweenBoxes;
    return box.link(label[i] % box.size, label[j] % box.size);
  });
}

std::string text(const MeshShape& s) {
  std::string out;
  for (int a = 0; a < kAxisCount; ++a) out += std::to_string(s[a]) + (a + 1 < kAxisCount ? "x" : "");
  return out;
}

// The shapes of n devices whose inner axes (tensor, sequence) fit in a box.
std::vector<MeshShape> shapes_for(int n, int box) {
  std::vector<MeshShape> shapes;
  for (int tensor : {1, 2, 4, 8}) {
    for (int sequence : {1, 2, 4}) {
      if (tensor * sequence == 1 || box % (tensor * sequence) != 0 || n % (tensor * sequence) != 0) continue;
      const int rest = n / (tensor * sequence);
      shapes.push_back(MeshShape{rest, 1, 1, 1, tensor, sequence});
      if (rest % 2 == 0) shapes.push_back(MeshShape{2, 1, rest / 2, 1, tensor, sequence});
    }
  }
  return shapes;
}

TEST(LargePlacement, BoxesJoinedBySlowLinksGetTheBestInnerLinksOfOneBox) {
  for (const Box& box : {nvswitch_box(8), dgx1_box(), hidden_quads_box(8), nvswitch_box(4)}) {
    for (int boxes : {3, 4, 9}) {
      const int n = box.size * boxes;
      for (unsigned seed : {0u, 7u}) {
        const Matrix m = machines(box, boxes, seed);
        const Matrix one = machines(box, 1, 0);
        std::vector<int> identity(n);
        std::iota(identity.begin(), identity.end(), 0);
        for (const MeshShape& shape : shapes_for(n, box.size)) {
          SCOPED_TRACE(box.name + " x " + std::to_string(boxes) + " seed " + std::to_string(seed) + " " + text(shape));
          const auto start = std::chrono::steady_clock::now();
          const Placement placed = place(m, n, shape);
          const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          EXPECT_LT(seconds, 1.0 * dew::testing::kSanitizerSlowdown);
          // One box, exactly: the same inner axes, the rest of the box outside them.
          MeshShape inner{box.size / (shape[kTensor] * shape[kSequence]), 1, 1, 1, shape[kTensor], shape[kSequence]};
          const Placement best = place(one, box.size, inner);
          ASSERT_TRUE(best.exact);
          const Score got = score_layout(m, n, shape, placed.order);
          const Score want = score_layout(one, box.size, inner, best.order);
          for (int axis : {kTensor, kSequence}) {
            if (shape[axis] > 1) {
              EXPECT_EQ(got.bottleneck[axis], want.bottleneck[axis]) << "axis " << axis;
            }
          }
          EXPECT_GE(compare_scores(got, score_layout(m, n, shape, identity)), 0) << "never below the id order";
          std::vector<int> sorted = placed.order;
          std::sort(sorted.begin(), sorted.end());
          EXPECT_EQ(sorted, identity);
        }
      }
    }
  }
}

// Boxes of 9 and 10 (past a box of 8, within the exact search): two of them.
TEST(LargePlacement, TwoBoxesOfNineOrTenMatchTheExactSearchOfOneBox) {
  for (const Box& box : {nvswitch_box(10), hidden_quads_box(10), hidden_quads_box(9)}) {
    const Matrix m = machines(box, 2, 3);
    const Matrix one = machines(box, 1, 0);
    for (const MeshShape& shape : {MeshShape{2 * box.size / 2, 1, 1, 1, 2, 1}, MeshShape{2, 1, 1, 1, box.size, 1}}) {
      if (box.size % shape[kTensor] != 0) continue;
      SCOPED_TRACE(box.name + " " + text(shape));
      const Placement placed = place(m, 2 * box.size, shape);
      const MeshShape inner{box.size / shape[kTensor], 1, 1, 1, shape[kTensor], 1};
      const Placement best = place(one, box.size, inner);
      EXPECT_EQ(score_layout(m, 2 * box.size, shape, placed.order).bottleneck[kTensor],
                score_layout(one, box.size, inner, best.order).bottleneck[kTensor]);
    }
  }
}

// No box structure the inner axes fit (tensor 3 in boxes of 8): the swaps
// still never leave the layout below the id order, and stay fast.
TEST(LargePlacement, ShapesThatDoNotFitABoxStillImproveOnTheIdOrder) {
  const Matrix m = machines(dgx1_box(), 9, 5);
  const int n = 72;
  std::vector<int> identity(n);
  std::iota(identity.begin(), identity.end(), 0);
  for (const MeshShape& shape : {MeshShape{8, 1, 1, 1, 3, 3}, MeshShape{4, 1, 1, 1, 6, 3}}) {
    const auto start = std::chrono::steady_clock::now();
    const Placement placed = place(m, n, shape);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
    EXPECT_GE(compare_scores(score_layout(m, n, shape, placed.order), score_layout(m, n, shape, identity)), 0);
  }
}

}  // namespace
}  // namespace dew::mesh
