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
Batch batch_of(const WorkerOptions& options, int step, int first, int count,
               const std::vector<std::int64_t>& positions);

// Every step's global batch whole, "tokenized" once: steps x batch x
// (length + 1) tokens (what the worker caches under its compile-cache key).
struct Dataset {
  int steps = 0;
  int batch = 0;
  int length = 0;
  std::vector<std::int32_t> tokens;
};
Dataset make_dataset(const WorkerOptions& options);
// As batch_of, from the dataset.
Batch batch_of(const Dataset& dataset, int step, int first, int count, const std::vector<std::int64_t>& positions);
// The same batches with each step's sequences in reverse order: the same
// mean loss and gradient, summed in another order (layout-parity's floor).
void reverse_sequences(Dataset& dataset);

}  // namespace dew::train
