// The worker's checkpoints: every process writes its devices' shards into one
// state file per checkpoint, in the canonical order (canonical.h), so that a
// run resumes into any layout of the model; process 0 then seals it: reads
// the file back, refuses a value that is not finite, and writes the manifest,
// last and atomically. A run killed while saving leaves the previous
// manifest, and the state it names, as they were. Private to train/.
//
//   DIR/manifest.json           the last complete checkpoint (version 2)
//   DIR/step-000010/state.bin   parameters, AdamW's m, AdamW's v: each the
//                               whole model in canonical order, as doubles
//
// The manifest records the state file's size and BLAKE2b-256 digest
// (`b2sum -l 256 DIR/step-000010/state.bin` prints the same), and a binding:
// BLAKE2b-256 of every other field (step, state file, size and digest,
// elements, dtype, model, batch, seed, learning rate, mesh, losses). Resume
// checks the binding (a manifest edited after it was written), the options,
// then the file's size, digest and values before step 1; each refusal is one
// line naming the file, what was expected and what was found. The digests
// catch accidents (a flipped or cut file, another run's state copied in, an
// edited step), not a forger: anyone can compute BLAKE2b.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "canonical.h"
#include "dew/result.h"
#include "dew/train.h"

namespace dew::train {

inline constexpr int kStateSections = 3;  // parameters, m, v
inline constexpr int kManifestVersion = 2;

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
  // seal_checkpoint fills these in.
  std::int64_t state_bytes = 0;  // kStateSections x elements doubles
  std::string state_digest;      // BLAKE2b-256 of the state file, 64 hex digits
  std::string binding;           // binding_of(the fields above), 64 hex digits
};

std::string state_path_of(const std::string& directory, int step);  // DIR/step-000010/state.bin
std::string dtype_name(Dtype dtype);
std::string model_text(const ModelConfig& model);  // {"heads":4,...,"width":32}, the manifest's "model"

// Writes `values` (section `section` of the state, a device's shard) at the
// runs' canonical places of the state file, which it creates if needed.
// `halfway` runs after half the runs (the crash-while-saving drill).
template <typename T>
Result<Done> write_state_runs(const std::string& path, int section, std::int64_t elements,
                              const std::vector<CanonicalRun>& runs, std::int64_t shard_first,
                              std::span<const T> values, const std::function<void()>& halfway = {});
// fsync of the state file (each process, after its devices wrote).
Result<Done> sync_file(const std::string& path);

// The whole state file: kStateSections x elements doubles; a file of another
// size is refused with both sizes.
Result<std::vector<double>> read_state(const std::string& path, std::int64_t elements);

// BLAKE2b-256 (libsodium's crypto_generichash, no key) of `bytes`, in hex.
std::string blake2b_hex(std::span<const unsigned char> bytes);
// BLAKE2b-256 of a text that lists every field of the manifest but the
// binding itself, each exactly (floating-point numbers in hex), in hex.
std::string binding_of(const Manifest& manifest);

// A number as a line shows it: nan, inf, -inf or 17 significant digits.
std::string value_text(double value);

// The first value of a state that is not finite, as the words of a line:
// "AdamW m element 1234 (layer1.wq, its element 10) is nan"; nullopt when
// every value is. `first_index` is values[0]'s place in the state file.
std::optional<std::string> first_non_finite(std::span<const double> values, std::int64_t first_index,
                                            std::int64_t elements, const ModelConfig& model);

// Process 0, once every process wrote and synced its shards of the state
// `manifest.state` (the checkpoint's agreement): reads the file back,
// recording its size and digest and the binding, and writes the manifest.
// A value that is not finite is refused, naming the step, the file, the
// section and the element: the step's directory is removed and the manifest
// is left as it was. Reading back is the one way to a digest of the whole
// file: each process wrote scattered runs of it, in parallel.
Result<Done> seal_checkpoint(const std::string& directory, Manifest manifest);

// The manifest, atomically (a temporary file, fsync, rename, fsync of the
// directory), and the older step directories removed after it. It writes
// the fields as they are: seal_checkpoint is the worker's way.
Result<Done> write_manifest(const std::string& directory, const Manifest& manifest);
// A version 2 manifest; an older one, which records no digest, is refused
// with how to go on (a fresh start).
Result<Manifest> read_manifest(const std::string& directory);

// Whether a run with these options can continue from the manifest: the same
// model, batch, seed, learning rate and dtype, and more steps than it holds.
Result<Done> check_resumable(const Manifest& manifest, const WorkerOptions& options);

// What --resume starts from, verified: the manifest's binding, the options
// (check_resumable), the state file's size, digest and values.
struct Checkpoint {
  Manifest manifest;
  std::vector<double> state;
};
Result<Checkpoint> load_checkpoint(const std::string& directory, const WorkerOptions& options);

}  // namespace dew::train
