// The model's state in one layout-free order: every parameter whole, row by
// row, one after the other in model order. Checkpoints are written in it (so
// a run can resume into another layout) and `dew layout-parity` compares
// gradients in it. A device's fsdp shard of its tensor rank's flat bucket
// maps onto runs of that order. Private to train/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "params.h"

namespace dew::train {

// Where each parameter sits in the canonical order.
struct Leaf {
  std::string name;
  std::int64_t offset = 0;  // first element
  std::int64_t size = 0;    // rows x cols
};
std::vector<Leaf> model_leaves(const std::vector<std::vector<ParamSpec>>& buckets);
std::int64_t canonical_size(const std::vector<Leaf>& leaves);

// `length` elements from `local` in a device's flat bucket that sit one
// after the other at `canonical` in the canonical order.
struct CanonicalRun {
  std::int64_t local = 0;
  std::int64_t canonical = 0;
  std::int64_t length = 0;
};

// Which runs of a parameter every tensor rank holds whole (Split::kNone).
enum class Replicated {
  kEveryRank,    // every rank's (to read)
  kRankZeroOnly  // tensor rank 0's only (to write, or to sum over processes, once)
};

// The runs covering elements [first, last) of tensor rank `tensor_rank`'s
// flat bucket `bucket` (bucket_layout's order); `leaves` from model_leaves.
std::vector<CanonicalRun> canonical_runs(const std::vector<std::vector<ParamSpec>>& buckets, int bucket,
                                         const std::vector<Leaf>& leaves, int tensor_rank, int tensor_size,
                                         std::int64_t first, std::int64_t last, Replicated replicated);

}  // namespace dew::train
