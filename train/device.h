// One device's run of the worker, on its own thread: its communicators per
// axis, its shards of the parameters and of AdamW's state, the steps and the
// checkpoints. Private to train/.
#pragma once

#include <barrier>
#include <functional>
#include <string>
#include <vector>

#include "data.h"
#include "dew/directory_lock.h"
#include "dew/mesh.h"
#include "dew/pool.h"
#include "dew/result.h"
#include "dew/train.h"
#include "stall_watch.h"

namespace dew::train {

// What the devices of one process share.
struct ProcessRun {
  runtime::Pool& pool;
  const mesh::Mesh& mesh;
  const WorkerOptions& options;
  const Dataset& dataset;
  StallWatch& watch;
  std::barrier<>& devices;                             // every device thread of this process
  int first_device = 0;                                // this process's first device id in the mesh
  int start_step = 0;                                  // steps done before (a resumed run)
  const std::vector<double>* resumed_state = nullptr;  // the checkpoint's state (checkpoint.h)
  std::vector<double> earlier_losses;                  // its losses
  std::function<void(const StepRecord&)> progress;     // process 0 only
  std::vector<double>* gradient = nullptr;             // capture_gradient: canonical, filled by the writers
  bool local_only = false;                             // run_one_device's: no pool-wide steps
  // A step whose loss is not finite (device.cpp, non_finite_loss): each
  // device's part of it (one slot per device), then every process's.
  struct LossParts {
    std::vector<double> devices;
    runtime::Gathered processes;
  } loss_parts;
  const DirectoryLock* checkpoint_lock = nullptr;  // process 0's, of --checkpoint-dir
};

struct DeviceResult {
  std::vector<StepRecord> steps;  // every step's loss (the same on every device), time and split
  std::string exchange = "local";
  std::string exchange_reason;
  std::int64_t state_bytes = 0;  // parameter + optimizer shards this device holds
};

// Trains this process's device `local_device` for every step.
Result<DeviceResult> train_device(ProcessRun& run, int local_device);

}  // namespace dew::train
