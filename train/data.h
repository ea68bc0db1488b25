// The worker's synthetic dataset: fixed by the seed, so every layout trains
// on the same tokens. Each sequence follows a rule the model can learn
// (next = 3 x token + 1 mod vocab) with one token in five drawn at random.
// Private to train/.
#pragma once

#include <cstdint>
#include <vector>

#include "dew/train.h"

namespace dew::train {

struct Batch {
  // Sequence by sequence, the given positions of each: the input token and
  // the token that follows it.
  std::vector<int> tokens;
  std::vector<int> targets;
};

// Sequences [first, first + count) of step `step`'s global batch, at
// `positions` (each below the model's length).
Batch batch_of(const WorkerOptions& options, int step, int first, int count, const std::vector<std::int64_t>& positions);

}  // namespace dew::train
