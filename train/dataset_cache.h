// The worker's stand-in for a compile cache: the tokenized dataset, kept
// under the pool's compile-cache key (Pool::compile_cache_key(), a hash of
// every process's accelerator fingerprint) so that a second run of the same
// pool finds it, and a pool of mixed machines never shares it. Private to
// train/.
#pragma once

#include <optional>
#include <string>

#include "data.h"
#include "dew/train.h"

namespace dew::train {

struct CachedDataset {
  Dataset dataset;
  bool found = false;  // read from the cache
  std::string path;    // the cache file ("" without a key)
};

// From cache_dir/<key>/dataset-<options' hash>.bin, or made (and not
// stored: see store_dataset); without a key (fingerprints differ), made.
CachedDataset cached_dataset(const WorkerOptions& options, const std::optional<std::string>& key,
                             const std::string& cache_dir);
// Stores a dataset that was not found, atomically (a temporary file, then a
// rename: processes storing at once leave one whole file). The pool looks
// first and stores after, so that every process of a first run finds nothing.
// False when it could not (a warning names the file and why).
bool store_dataset(const CachedDataset& cached);

}  // namespace dew::train
