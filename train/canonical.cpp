#include "canonical.h"

#include <algorithm>

namespace dew::train {

std::vector<Leaf> model_leaves(const std::vector<std::vector<ParamSpec>>& buckets) {
  std::vector<Leaf> leaves;
  std::int64_t offset = 0;
  for (const auto& bucket : buckets) {
    for (const auto& spec : bucket) {
      const std::int64_t size = std::int64_t(spec.rows) * spec.cols;
      leaves.push_back(Leaf{spec.name, offset, size});
      offset += size;
    }
  }
  return leaves;
}

std::int64_t canonical_size(const std::vector<Leaf>& leaves) {
  return leaves.empty() ? 0 : leaves.back().offset + leaves.back().size;
}

std::vector<CanonicalRun> canonical_runs(const std::vector<std::vector<ParamSpec>>& buckets, int bucket,
                                         const std::vector<Leaf>& leaves, int tensor_rank, int tensor_size,
                                         std::int64_t first, std::int64_t last, Replicated replicated) {
  std::size_t leaf = 0;
  for (int b = 0; b < bucket; ++b) leaf += buckets[std::size_t(b)].size();
  std::vector<CanonicalRun> runs;
  std::int64_t start = 0;  // the parameter's first element in the flat bucket
  for (const auto& spec : buckets[std::size_t(bucket)]) {
    const std::int64_t rows = local_rows(spec, tensor_size), cols = local_cols(spec, tensor_size);
    const std::int64_t first_row = spec.split == Split::kRows ? tensor_rank * rows : 0;
    const std::int64_t first_col = spec.split == Split::kColumns ? tensor_rank * cols : 0;
    const std::int64_t base = leaves[leaf++].offset;
    if (spec.split == Split::kNone && tensor_rank != 0 && replicated == Replicated::kRankZeroOnly) {
      start += rows * cols;
      continue;
    }
    // Each local row is a run of the whole parameter's row, cut to [first, last).
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t row_start = start + r * cols;
      const std::int64_t lo = std::max(first, row_start), hi = std::min(last, row_start + cols);
      if (lo >= hi) continue;
      const std::int64_t at = base + (first_row + r) * spec.cols + first_col + (lo - row_start);
      if (!runs.empty() && runs.back().local + runs.back().length == lo &&
          runs.back().canonical + runs.back().length == at) {
        runs.back().length += hi - lo;
      } else {
        runs.push_back(CanonicalRun{lo, at, hi - lo});
      }
    }
    start += rows * cols;
  }
  return runs;
}

}  // namespace dew::train
