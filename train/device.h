// One device's run of the worker, on its own thread: its communicators per
// axis, its shards of the parameters and of AdamW's state, and the steps.
// Private to train/.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dew/mesh.h"
#include "dew/pool.h"
#include "dew/result.h"
#include "dew/train.h"

namespace dew::train {

struct DeviceResult {
  std::vector<StepRecord> steps;  // every step's loss (the same on every device), time and split
  std::string exchange = "local";
  std::string exchange_reason;
  std::int64_t state_bytes = 0;  // parameter + optimizer shards this device holds
};

// Trains device `device` (one of this process's) for every step; `progress`
// is called after each step (device 0 of process 0 passes one).
Result<DeviceResult> train_device(runtime::Pool& pool, const mesh::Mesh& mesh, const WorkerOptions& options,
                                  int device, const std::function<void(const StepRecord&)>& progress);

}  // namespace dew::train
