// The worker's checkpoints: every process writes its devices' shards into one
// state file per checkpoint, in the canonical order (canonical.h), so that a
// run resumes into any layout of the model; process 0 then writes the
// manifest, last and atomically. A run killed while saving leaves the
// previous manifest, and the state it names, as they were. Private to train/.
//
//   DIR/manifest.json           the last complete checkpoint
//   DIR/step-000010/state.bin   parameters, AdamW's m, AdamW's v: each the
//                               whole model in canonical order, as doubles
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "canonical.h"
#include "dew/result.h"
#include "dew/train.h"

namespace dew::train {

inline constexpr int kStateSections = 3;  // parameters, m, v

struct Manifest {
  int step = 0;
  std::string state;          // relative to the directory: "step-000010/state.bin"
  std::int64_t elements = 0;  // per section
  std::string dtype;          // "fp32" or "fp64"
  ModelConfig model;
  int batch = 0;
  std::uint64_t seed = 0;
  double learning_rate = 0;
  std::string mesh;            // the layout that wrote it (any layout may read it)
  std::vector<double> losses;  // steps 1..step
};

std::string state_path_of(const std::string& directory, int step);  // DIR/step-000010/state.bin
std::string dtype_name(Dtype dtype);

// Writes `values` (section `section` of the state, a device's shard) at the
// runs' canonical places of the state file, which it creates if needed.
// `halfway` runs after half the runs (the crash-while-saving drill).
template <typename T>
Result<Done> write_state_runs(const std::string& path, int section, std::int64_t elements,
                              const std::vector<CanonicalRun>& runs, std::int64_t shard_first,
                              std::span<const T> values, const std::function<void()>& halfway = {});
// fsync of the state file (each process, after its devices wrote).
Result<Done> sync_file(const std::string& path);

// The whole state file: kStateSections x elements doubles.
Result<std::vector<double>> read_state(const std::string& path, std::int64_t elements);

// The manifest, atomically (a temporary file, fsync, rename, fsync of the
// directory), and the older step directories removed after it.
Result<Done> write_manifest(const std::string& directory, const Manifest& manifest);
Result<Manifest> read_manifest(const std::string& directory);

// Whether a run with these options can continue from the manifest: the same
// model, batch, seed, learning rate and dtype, and more steps than it holds.
Result<Done> check_resumable(const Manifest& manifest, const WorkerOptions& options);

}  // namespace dew::train
