#include "data.h"

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

}  // namespace dew::train
