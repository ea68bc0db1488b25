#include "data.h"

#include <algorithm>

#include "params.h"

namespace dew::train {

Batch batch_of(const WorkerOptions& o, int step, int first, int count, const std::vector<std::int64_t>& positions) {
  const int vocab = o.model.vocab, length = o.model.length;
  Batch batch;
  std::vector<int> sequence(std::size_t(length) + 1);
  for (int g = first; g < first + count; ++g) {
    sequence[0] = int(mix(o.seed, 7, std::uint64_t(step), std::uint64_t(g)) % std::uint64_t(vocab));
    for (int p = 0; p < length; ++p) {
      const std::uint64_t draw = mix(o.seed, std::uint64_t(step), std::uint64_t(g), std::uint64_t(p) + 11);
      sequence[p + 1] = draw % 5 == 0 ? int((draw / 5) % std::uint64_t(vocab)) : (3 * sequence[p] + 1) % vocab;
    }
    for (const auto p : positions) {
      batch.tokens.push_back(sequence[std::size_t(p)]);
      batch.targets.push_back(sequence[std::size_t(p) + 1]);
    }
  }
  return batch;
}

Dataset make_dataset(const WorkerOptions& o) {
  Dataset d{o.steps, o.batch, o.model.length, {}};
  std::vector<std::int64_t> all(std::size_t(o.model.length));
  for (int p = 0; p < o.model.length; ++p) all[std::size_t(p)] = p;
  d.tokens.reserve(std::size_t(o.steps) * std::size_t(o.batch) * std::size_t(o.model.length + 1));
  for (int step = 0; step < o.steps; ++step) {
    const Batch whole = batch_of(o, step, 0, o.batch, all);
    for (int g = 0; g < o.batch; ++g) {
      const auto at = std::size_t(g) * std::size_t(o.model.length);
      d.tokens.insert(d.tokens.end(), whole.tokens.begin() + std::ptrdiff_t(at),
                      whole.tokens.begin() + std::ptrdiff_t(at) + o.model.length);
      d.tokens.push_back(whole.targets[at + std::size_t(o.model.length) - 1]);
    }
  }
  return d;
}

Batch batch_of(const Dataset& d, int step, int first, int count, const std::vector<std::int64_t>& positions) {
  Batch batch;
  const std::size_t stride = std::size_t(d.length) + 1;
  for (int g = first; g < first + count; ++g) {
    const std::int32_t* sequence =
        d.tokens.data() + (std::size_t(step) * std::size_t(d.batch) + std::size_t(g)) * stride;
    for (const auto p : positions) {
      batch.tokens.push_back(sequence[p]);
      batch.targets.push_back(sequence[p + 1]);
    }
  }
  return batch;
}

void reverse_sequences(Dataset& d) {
  const std::size_t stride = std::size_t(d.length) + 1;
  for (int step = 0; step < d.steps; ++step) {
    for (int a = 0, b = d.batch - 1; a < b; ++a, --b) {
      auto* base = d.tokens.data() + std::size_t(step) * std::size_t(d.batch) * stride;
      std::swap_ranges(base + std::size_t(a) * stride, base + std::size_t(a + 1) * stride,
                       base + std::size_t(b) * stride);
    }
  }
}

}  // namespace dew::train
