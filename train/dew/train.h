// The distribution worker (namespace dew::train): a small decoder-only
// transformer trained for a few steps on a seeded synthetic dataset, over any
// layout of a pool: the design page's rehearsal, `dew worker`.
//
//   auto pool = dew::runtime::join();
//   dew::train::WorkerOptions options;
//   options.mesh = "fsdp=2,replicas=2";
//   options.devices_per_process = 2;            // CPU devices: a thread each
//   auto report = dew::train::run_worker(pool, options, print_progress);
//
// The model: token embedding plus learned positions, `layers` blocks of
// RMSNorm -> causal grouped-query attention -> residual -> RMSNorm -> MLP
// (SiLU) -> residual, a final RMSNorm and the embedding tied as the output
// projection, cross-entropy, AdamW. Every layout computes the same training:
//
//   data      splits the batch; gradients are summed across it
//   fsdp      splits the batch and shards every layer's parameters and
//             optimizer state; a layer's parameters are all-gathered before
//             its forward (and kept through its backward), its gradients
//             reduce-scattered
//   replicas  hybrid sharding as build_mesh lays it out: fsdp inside a group
//             of granules, data across the groups
//   tensor    splits attention heads and the MLP's hidden units (Megatron):
//             one all-reduce after attention's output projection and one
//             after the MLP, forward and backward
//   sequence  splits token positions; every attention call runs through the
//             exchange the rule picks (dew/exchange.h)
//
// expert and stage are refused with the reason.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dew/mesh.h"
#include "dew/pool.h"
#include "dew/result.h"
#include "dew/watchdog.h"

namespace dew::train {

struct ModelConfig {
  int vocab = 64;
  int width = 32;  // model width W
  int layers = 2;
  int heads = 4;     // query heads H
  int kv_heads = 2;  // key/value heads K (H % K == 0)
  int mlp = 64;      // the MLP's hidden units F
  int length = 16;   // token positions per sequence
};

enum class Dtype { kFloat32, kFloat64 };

// A failure on purpose, for the failure drills: process `rank` at step
// `step` (1-based).
struct Drill {
  enum class Kind {
    kNone,
    kLoaderThrows,           // its data loader throws (an uncaught exception)
    kStallInStep,            // a device sleeps inside the step, outside collectives
    kStallBeforeCheckpoint,  // the process sleeps before the checkpoint's agreement
    kCrashWhileSaving,       // SIGKILL halfway through writing its checkpoint shards
  };
  Kind kind = Kind::kNone;
  int rank = 0;
  int step = 0;
};
// "KIND@RANK:STEP", KIND one of loader-throws, stall-in-step,
// stall-before-checkpoint, crash-while-saving; an error names the value and
// the allowed forms.
Result<Drill> parse_drill(std::string_view text);

// Whether a run continues from the checkpoint directory's last complete
// checkpoint: never, always (there must be one), or if there is one (a
// requeued job starts the same command again; its first start has none).
enum class Resume { kNo, kAlways, kIfAny };

struct WorkerOptions {
  std::string mesh;  // a MeshSpec (JSON or axis=n,...); empty: data over every device
  // Device ids filling the mesh row-major, as given (no placement; replicas
  // 1), such as 0,4,1,5,...: an axis put on chosen links. Empty: placed.
  std::string devices;
  int devices_per_process = 1;
  int steps = 20;
  int batch = 8;  // sequences per step, over the whole pool
  ModelConfig model;
  Dtype dtype = Dtype::kFloat32;
  std::uint64_t seed = 0;
  double learning_rate = 3e-3;
  double weight_decay = 0.01;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double epsilon = 1e-8;
  // "auto" (the rule's pick), "all-to-all" or "gather": the sequence axis's
  // exchange; a forced one that cannot run is an error with the rule's reason.
  std::string exchange = "auto";
  // Checkpoints every checkpoint_every steps (and after the last) into
  // checkpoint_dir, a directory every process must share; resume continues
  // from its last complete one (any layout of the same model).
  std::string checkpoint_dir;
  int checkpoint_every = 0;
  Resume resume = Resume::kNo;
  // The step bound of the stall watch (stall_watch.h); nullopt: off.
  std::optional<std::chrono::milliseconds> step_bound = kDefaultWatchdog;
  // Where the tokenized dataset is cached under the compile-cache key;
  // empty: no cache.
  std::string cache_dir;
  Drill drill;
  // Reverse each step's sequences (the same training, summed in another
  // order): layout-parity's floor.
  bool reverse_batch = false;
  // Record step 1's gradient, whole, in the canonical order (layout-parity).
  bool capture_gradient = false;
};

// One step as process 0 sees it.
struct StepRecord {
  int step = 0;
  double loss = 0;     // the mean over the step's global batch, before the update
  double seconds = 0;  // the whole step on device 0 of process 0
  // Where the step's time went on that device: "compute" and one entry per
  // collective kind and axis ("all_gather fsdp", "all_reduce tensor", ...).
  std::map<std::string, double> split;
};

struct WorkerReport {
  mesh::Mesh mesh;
  std::vector<StepRecord> steps;
  // For every fsdp group, the sorted processes its devices sit on (the
  // design page's pool.json).
  std::vector<std::vector<int>> fsdp_groups;
  // The exchange each attention call runs and the rule's reason (sequence
  // axis > 1), else "local".
  std::string exchange = "local";
  std::string exchange_reason;
  // Parameter and optimizer state bytes held by each device.
  std::int64_t state_bytes_per_device = 0;
  int tokens_per_step = 0;
  // A resumed run: the checkpoint's step and the losses up to it.
  int resumed_from = 0;
  std::vector<double> earlier_losses;
  // capture_gradient: step 1's gradient of the mean loss, every parameter
  // whole (process 0), and each parameter's name, first element and size.
  std::vector<double> gradient;
  struct Leaf {
    std::string name;
    std::int64_t offset = 0, size = 0;
  };
  std::vector<Leaf> leaves;
  // Whether each process found the cached dataset.
  std::vector<bool> cache_found;
};

// Checks the options against the pool's device count, before any process
// trains: one line with the numbers for a mesh that does not fit, a batch or
// length the axes cannot split, heads the tensor axis cannot, expert or
// stage axes, devices_per_process < 1.
Result<mesh::Mesh> plan_layout(const WorkerOptions& options, int processes);

// Trains on this process's devices (one thread each); every process of the
// pool calls it with the same options. `progress` (process 0 only) gets each
// step as it ends.
Result<WorkerReport> run_worker(runtime::Pool& pool, const WorkerOptions& options,
                                const std::function<void(const StepRecord&)>& progress = {});

// The same training on one device of this process alone (no collectives,
// no checkpoints, no cache): the reference of `dew layout-parity`. Any
// process may call it by itself.
Result<WorkerReport> run_one_device(runtime::Pool& pool, WorkerOptions options);

// Where the worker caches its dataset by default: $DEW_CACHE_DIR/worker,
// $XDG_CACHE_HOME/dew/worker or $HOME/.cache/dew/worker.
std::string default_cache_dir();

// The report as JSON: losses, fsdp_groups, mesh (axes, shape, devices),
// exchange and reason, per-step seconds and split, state bytes per device.
std::string report_json(const WorkerReport& report, const WorkerOptions& options);

}  // namespace dew::train
