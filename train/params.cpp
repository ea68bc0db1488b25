#include "params.h"

#include <cmath>
#include <numbers>

namespace dew::train {

std::uint64_t mix(std::uint64_t seed, std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  std::uint64_t z = seed;
  for (std::uint64_t part : {a, b, c}) {
    z += 0x9e3779b97f4a7c15ULL + part;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
  }
  return z;
}

double normal_of(std::uint64_t u1, std::uint64_t u2) {
  const double a = (double(u1 >> 11) + 0.5) / 9007199254740992.0;  // (0, 1)
  const double b = double(u2 >> 11) / 9007199254740992.0;
  return std::sqrt(-2.0 * std::log(a)) * std::cos(2.0 * std::numbers::pi * b);
}

std::vector<std::vector<ParamSpec>> model_buckets(const ModelConfig& m) {
  const int head = m.width / m.heads;
  int id = 0;
  const auto param = [&](std::string name, int rows, int cols, Split split, bool gain = false, double init = 0.02) {
    return ParamSpec{std::move(name), rows, cols, split, gain, init, id++};
  };
  std::vector<std::vector<ParamSpec>> buckets;
  buckets.push_back({param("embedding", m.vocab, m.width, Split::kNone),
                     param("positions", m.length, m.width, Split::kNone),
                     param("final_gain", 1, m.width, Split::kNone, true)});
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = "layer" + std::to_string(l) + ".";
    buckets.push_back(
        {param(p + "gain1", 1, m.width, Split::kNone, true), param(p + "wq", m.width, m.heads * head, Split::kColumns),
         param(p + "wk", m.width, m.kv_heads * head, Split::kColumns),
         param(p + "wv", m.width, m.kv_heads * head, Split::kColumns),
         param(p + "wo", m.heads * head, m.width, Split::kRows), param(p + "gain2", 1, m.width, Split::kNone, true),
         param(p + "w1", m.width, m.mlp, Split::kColumns), param(p + "w2", m.mlp, m.width, Split::kRows)});
  }
  return buckets;
}

int local_rows(const ParamSpec& spec, int tensor_size) {
  return spec.split == Split::kRows ? spec.rows / tensor_size : spec.rows;
}

int local_cols(const ParamSpec& spec, int tensor_size) {
  return spec.split == Split::kColumns ? spec.cols / tensor_size : spec.cols;
}

std::int64_t local_size(const ParamSpec& spec, int tensor_size) {
  return std::int64_t(local_rows(spec, tensor_size)) * local_cols(spec, tensor_size);
}

template <typename T>
std::vector<T> initial_part(const ParamSpec& spec, int tensor_rank, int tensor_size, std::uint64_t seed) {
  const int rows = local_rows(spec, tensor_size), cols = local_cols(spec, tensor_size);
  const int first_row = spec.split == Split::kRows ? tensor_rank * rows : 0;
  const int first_col = spec.split == Split::kColumns ? tensor_rank * cols : 0;
  std::vector<T> out(std::size_t(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      // Element (row, col) of the whole parameter, whichever rank holds it.
      const std::uint64_t at = std::uint64_t(first_row + r) * spec.cols + (first_col + c);
      out[std::size_t(r) * cols + c] =
          spec.gain ? T(1) : T(spec.init * normal_of(mix(seed, spec.id, at, 1), mix(seed, spec.id, at, 2)));
    }
  }
  return out;
}

template std::vector<float> initial_part<float>(const ParamSpec&, int, int, std::uint64_t);
template std::vector<double> initial_part<double>(const ParamSpec&, int, int, std::uint64_t);

BucketLayout bucket_layout(const std::vector<ParamSpec>& bucket, int tensor_size) {
  BucketLayout layout;
  for (const auto& spec : bucket) {
    layout.offsets.push_back(layout.size);
    layout.size += local_size(spec, tensor_size);
  }
  return layout;
}

}  // namespace dew::train
