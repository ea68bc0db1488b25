// Placement benchmark: how long place() takes for 8, 16 and 72 devices
// (median of repeated runs), whether it matches a brute force over every
// order (up to 8 devices), and how its score compares with the plain id
// order on topology files.
//
//   bench/placement [--runs N] [--smoke] [TOPOLOGY_FILE...]
//
// --smoke: one run of a few sizes, so the tests know the program still works.
//
// Files without GPUs or that fail to load are listed as skipped.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "dew/median.h"
#include "dew/mesh.h"
#include "dew/topology.h"

namespace {

using dew::mesh::MeshShape;
using dew::mesh::Score;
using Matrix = std::vector<double>;

using dew::mesh::bandwidth_matrix;

Matrix random_matrix(int n, unsigned seed, unsigned levels) {
  std::mt19937 rng(seed);
  Matrix m = bandwidth_matrix(n, [&](int, int) { return 1.0 + static_cast<double>(rng() % levels); });
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < i; ++j) m[i * n + j] = m[j * n + i];
  }
  return m;
}

// 72 GPUs whose ids hide 18 fast quads, quads paired a step down.
Matrix hidden_quads(int n) {
  std::vector<int> label(n);
  std::iota(label.begin(), label.end(), 0);
  std::shuffle(label.begin(), label.end(), std::mt19937(11));
  return bandwidth_matrix(n, [&](int i, int j) {
    if (label[i] / 4 == label[j] / 4) return 900.0;
    return label[i] / 8 == label[j] / 8 ? 450.0 : 100.0;
  });
}

std::string shape_text(const MeshShape& shape) {
  std::string out;
  for (int a = 0; a < dew::mesh::kAxisCount; ++a) {
    if (shape[a] > 1)
      out += (out.empty() ? "" : ",") + std::string(dew::mesh::kMeshAxes[a]) + "=" + std::to_string(shape[a]);
  }
  return out.empty() ? "(1 device)" : out;
}

// Innermost first, as the score compares: "sequence 100, tensor 25".
std::string score_text(const Score& score, const MeshShape& shape) {
  std::string out;
  for (int a = dew::mesh::kAxisCount - 1; a >= 0; --a) {
    if (shape[a] < 2) continue;
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%s%s %g", out.empty() ? "" : ", ",
                  std::string(dew::mesh::kMeshAxes[a]).c_str(), score.bottleneck[a]);
    out += buffer;
  }
  return out;
}

void all_shapes(int left, int axis, MeshShape current, std::vector<MeshShape>& out) {
  if (axis == dew::mesh::kAxisCount) {
    if (left == 1) out.push_back(current);
    return;
  }
  for (int size = 1; size <= left; ++size) {
    if (left % size == 0) {
      current[axis] = size;
      all_shapes(left / size, axis + 1, current, out);
    }
  }
}

// One shape per distinct problem: the axes of size > 1 in order, placed on
// the innermost axes (other namings pose the same problem).
std::vector<MeshShape> distinct_shapes(int n) {
  std::vector<MeshShape> all;
  all_shapes(n, 0, {}, all);
  std::map<std::vector<int>, MeshShape> by_key;
  for (const MeshShape& shape : all) {
    std::vector<int> key;
    for (const int size : shape) {
      if (size > 1) key.push_back(size);
    }
    MeshShape canonical{1, 1, 1, 1, 1, 1};
    std::copy(key.begin(), key.end(), canonical.end() - static_cast<long>(key.size()));
    by_key.emplace(key, canonical);
  }
  std::vector<MeshShape> out;
  for (const auto& [key, shape] : by_key) out.push_back(shape);
  return out;
}

double median_seconds(int runs, const std::function<void()>& body) {
  std::vector<double> seconds;
  for (int r = 0; r < runs; ++r) {
    const auto start = std::chrono::steady_clock::now();
    body();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return dew::median(seconds);
}

std::vector<int> identity(int n) {
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  return order;
}

Score brute_force(const Matrix& m, int n, const MeshShape& shape) {
  std::vector<int> order = identity(n);
  Score best = dew::mesh::score_layout(m, n, shape, order);
  while (std::next_permutation(order.begin(), order.end())) {
    const Score score = dew::mesh::score_layout(m, n, shape, order);
    if (dew::mesh::compare_scores(score, best) > 0) best = score;
  }
  return best;
}

struct Case {
  std::string name;
  Matrix matrix;
  int n;
};

struct Options {
  int runs = 21;
  bool smoke = false;  // one run of a few sizes: the program still works
  std::vector<std::string> files;
};

std::vector<Case> load_fixtures(const std::vector<std::string>& files) {
  std::vector<Case> fixtures;
  std::printf("topology files\n");
  for (const std::string& file : files) {
    auto topology = dew::topology::load_topology_file(file);
    const char* base = std::strrchr(file.c_str(), '/');
    const std::string name = base != nullptr ? base + 1 : file;
    if (!topology.ok()) {
      std::printf("  skipped %s: %s\n", name.c_str(), topology.error().message.c_str());
    } else if (topology.value().gpus.empty()) {
      std::printf("  skipped %s: no GPUs\n", name.c_str());
    } else {
      const int n = static_cast<int>(topology.value().gpus.size());
      std::printf("  %-36s %2d GPUs\n", name.c_str(), n);
      fixtures.push_back({name, topology.value().bandwidth_gbps, n});
    }
  }
  return fixtures;
}

void time_placement(const Options& o, const std::vector<Case>& fixtures) {
  std::printf("\nplacement time, median of %d runs (exact up to %d devices, heuristic above)\n", o.runs,
              dew::mesh::kExactPlacementLimit);
  std::printf("  %-3s %-34s %-36s %12s\n", "n", "matrix", "shape", "median (s)");
  std::vector<Case> timed = {{"random 8 (1000 levels, seed 1)", random_matrix(8, 1, 1000), 8}};
  if (!o.smoke) {
    timed.push_back({"random 16 (2 levels, seed 1)", random_matrix(16, 1, 2), 16});
    timed.push_back({"random 16 (1000 levels, seed 2)", random_matrix(16, 2, 1000), 16});
    timed.push_back({"NVL72 equal links", bandwidth_matrix(72, [](int, int) { return 900.0; }), 72});
    timed.push_back({"NVL72 hidden quads", hidden_quads(72), 72});
    timed.push_back({"random 72 (1000 levels, seed 3)", random_matrix(72, 3, 1000), 72});
  }
  for (const Case& fixture : fixtures) {
    if (fixture.n == 8 || fixture.n == 16) timed.push_back(fixture);
  }
  std::sort(timed.begin(), timed.end(), [](const Case& a, const Case& b) { return a.n < b.n; });
  const std::map<int, std::vector<MeshShape>> shapes = {
      {8, {{2, 1, 1, 1, 2, 2}, {1, 1, 1, 1, 4, 2}, {1, 1, 1, 1, 2, 4}}},
      {16, {{1, 1, 1, 1, 4, 4}, {1, 1, 2, 2, 2, 2}, {1, 1, 2, 1, 4, 2}}},
      {72, {{18, 1, 1, 1, 4, 1}, {1, 1, 9, 1, 4, 2}, {1, 1, 3, 1, 8, 3}}},
  };
  double worst72 = 0;
  for (const Case& c : timed) {
    for (const MeshShape& shape : shapes.at(c.n)) {
      const double seconds = median_seconds(o.runs, [&] { (void)dew::mesh::place(c.matrix, c.n, shape); });
      if (c.n == 72) worst72 = std::max(worst72, seconds);
      std::printf("  %-3d %-34s %-36s %12.6f\n", c.n, c.name.c_str(), shape_text(shape).c_str(), seconds);
    }
  }
  std::printf("  target: < 1 s for 72 devices: %s (slowest median %.6f s)\n", worst72 < 1.0 ? "met" : "NOT met",
              worst72);
}

// The exact search's cost depends on the matrix: its slowest single run over
// many random ones, every distinct shape of 9 to 16 devices.
void exact_search_sweep(const Options& o) {
  double slowest = 0;
  std::string where;
  int searches = 0;
  const int largest = o.smoke ? 9 : 16;
  const unsigned matrices = o.smoke ? 2 : 30;
  for (int n = 9; n <= largest; ++n) {
    for (unsigned seed = 0; seed < matrices; ++seed) {
      const unsigned levels = seed % 3 == 0 ? 2 : (seed % 3 == 1 ? 3 : 1000);
      const Matrix m = random_matrix(n, 31 * seed + static_cast<unsigned>(n), levels);
      for (const MeshShape& shape : distinct_shapes(n)) {
        const double seconds = median_seconds(1, [&] { (void)dew::mesh::place(m, n, shape); });
        ++searches;
        if (seconds > slowest) {
          slowest = seconds;
          where = std::to_string(n) + " devices, " + shape_text(shape) + ", " + std::to_string(levels) + " levels";
        }
      }
    }
  }
  std::printf(
      "  exact search, slowest of %d runs (9-%d devices, %u random matrices each, every distinct shape): "
      "%.6f s (%s)\n",
      searches, largest, matrices, slowest, where.c_str());
}

void against_brute_force(const Options& o, const std::vector<Case>& fixtures) {
  std::printf("\nscore against a brute force over every order (every distinct shape)\n");
  std::vector<Case> small;
  for (const Case& fixture : fixtures) {
    if (fixture.n <= 8) small.push_back(fixture);
  }
  for (unsigned seed = 0; seed < (o.smoke ? 1u : 4u); ++seed) {
    small.push_back(
        {"random 8 (" + std::to_string(seed % 2 == 0 ? 3 : 1000) + " levels, seed " + std::to_string(seed) + ")",
         random_matrix(8, 100 + seed, seed % 2 == 0 ? 3 : 1000), 8});
  }
  int optimal = 0;
  int checked = 0;
  for (const Case& c : small) {
    int here = 0;
    const auto list = distinct_shapes(c.n);
    for (const MeshShape& shape : list) {
      const Score placed = dew::mesh::score_layout(c.matrix, c.n, shape, dew::mesh::place(c.matrix, c.n, shape).order);
      here += dew::mesh::compare_scores(placed, brute_force(c.matrix, c.n, shape)) == 0 ? 1 : 0;
    }
    std::printf("  %-36s %2d devices: optimal in %zu of %zu shapes\n", c.name.c_str(), c.n,
                static_cast<std::size_t>(here), list.size());
    optimal += here;
    checked += static_cast<int>(list.size());
  }
  std::printf("  target: optimal wherever brute force can check: %s (%d of %d)\n",
              optimal == checked ? "met" : "NOT met", optimal, checked);
}

void against_id_order(const std::vector<Case>& fixtures) {
  std::printf("\nscore against the plain id order (slowest link per axis in GB/s, innermost first)\n");
  for (const Case& c : fixtures) {
    for (const MeshShape& shape : distinct_shapes(c.n)) {
      // Two- and three-axis meshes whose inner axes are 2 or 4 wide: the
      // tensor/sequence layouts people run.
      int axes = 0;
      for (const int size : shape) axes += size > 1 ? 1 : 0;
      if (axes < 2 || axes > 3 || shape[5] > 4) continue;
      const Score placed = dew::mesh::score_layout(c.matrix, c.n, shape, dew::mesh::place(c.matrix, c.n, shape).order);
      const Score plain = dew::mesh::score_layout(c.matrix, c.n, shape, identity(c.n));
      const int compared = dew::mesh::compare_scores(placed, plain);
      std::printf("  %-32s %-30s %-9s placed: %s | id order: %s\n", c.name.c_str(), shape_text(shape).c_str(),
                  compared > 0 ? "better" : (compared == 0 ? "same" : "WORSE"), score_text(placed, shape).c_str(),
                  score_text(plain, shape).c_str());
    }
  }
}

// Boxes joined by slow links (6.3 GB/s), each a uniform NVSwitch box, a
// DGX-1 hybrid cube mesh (NV1/NV2, PCIe between the rest) or two hidden
// quads in eight; ids in box order and shuffled.
Matrix boxes_of(const std::string& kind, int boxes, unsigned seed) {
  static const int dgx1[8][8] = {{0, 1, 1, 2, 2, 0, 0, 0}, {1, 0, 2, 1, 0, 2, 0, 0}, {1, 2, 0, 2, 0, 0, 1, 0},
                                 {2, 1, 2, 0, 0, 0, 0, 1}, {2, 0, 0, 0, 0, 1, 1, 2}, {0, 2, 0, 0, 1, 0, 2, 1},
                                 {0, 0, 1, 0, 1, 2, 0, 2}, {0, 0, 0, 1, 2, 1, 2, 0}};
  const int n = 8 * boxes;
  std::vector<int> label(n);
  std::iota(label.begin(), label.end(), 0);
  if (seed != 0) std::shuffle(label.begin(), label.end(), std::mt19937(seed));
  return bandwidth_matrix(n, [&](int i, int j) {
    const int a = label[i] % 8, b = label[j] % 8;
    if (label[i] / 8 != label[j] / 8) return 6.3;
    if (kind == "nvswitch") return 450.0;
    if (kind == "quads") return a / 4 == b / 4 ? 100.0 : 24.0;
    return dgx1[a][b] > 0 ? dgx1[a][b] * 25.0 : (a / 4 == b / 4 ? 10.0 : 8.0);
  });
}

void multi_box(const Options& o) {
  std::printf(
      "\nboxes of 8 joined by 6.3 GB/s links: inner axes' slowest link (GB/s), placed against one box's "
      "exact best and the id order; median time\n");
  std::printf("  %-9s %5s %-9s %-28s %-22s %-22s %-22s %9s\n", "box", "boxes", "ids", "mesh", "placed",
              "one box, exact", "id order", "time");
  for (const std::string kind : {"nvswitch", "dgx1", "quads"}) {
    for (int boxes : o.smoke ? std::vector<int>{3} : std::vector<int>{3, 4, 9}) {
      for (unsigned seed : {0u, 7u}) {
        const int n = 8 * boxes;
        const Matrix m = boxes_of(kind, boxes, seed);
        const Matrix one = boxes_of(kind, 1, 0);
        for (const MeshShape& shape :
             {MeshShape{n / 2, 1, 1, 1, 2, 1}, MeshShape{n / 4, 1, 1, 1, 4, 1}, MeshShape{n / 4, 1, 1, 1, 2, 2},
              MeshShape{n / 8, 1, 1, 1, 4, 2}, MeshShape{n / 8, 1, 1, 1, 2, 4}}) {
          std::vector<int> order;
          const double seconds = median_seconds(o.runs, [&] { order = dew::mesh::place(m, n, shape).order; });
          const MeshShape inner{8 / (shape[4] * shape[5]), 1, 1, 1, shape[4], shape[5]};
          const Score best = dew::mesh::score_layout(one, 8, inner, dew::mesh::place(one, 8, inner).order);
          const Score placed = dew::mesh::score_layout(m, n, shape, order);
          const Score plain = dew::mesh::score_layout(m, n, shape, identity(n));
          const auto inner_text = [&](const Score& s) {
            char text[64];
            std::snprintf(text, sizeof text, "tensor %g, sequence %g", s.bottleneck[4],
                          shape[5] > 1 ? s.bottleneck[5] : 0.0);
            return std::string(text);
          };
          std::printf("  %-9s %5d %-9s %-28s %-22s %-22s %-22s %7.1f ms\n", kind.c_str(), boxes,
                      seed ? "shuffled" : "in order", shape_text(shape).c_str(), inner_text(placed).c_str(),
                      inner_text(best).c_str(), inner_text(plain).c_str(), seconds * 1e3);
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
      o.runs = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--smoke") == 0) {
      o.smoke = true;
      o.runs = 1;
    } else {
      o.files.emplace_back(argv[i]);
    }
  }
  const std::vector<Case> fixtures = load_fixtures(o.files);
  time_placement(o, fixtures);
  exact_search_sweep(o);
  against_brute_force(o, fixtures);
  against_id_order(fixtures);
  multi_box(o);
  return 0;
}
