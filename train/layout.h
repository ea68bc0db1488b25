// Where one device sits in the worker's layout and what it holds: its rank
// on every axis, its sequences of the batch and its positions of each.
// Private to train/.
#pragma once

#include <cstdint>
#include <vector>

#include "dew/attention.h"
#include "dew/mesh.h"
#include "dew/result.h"
#include "dew/train.h"

namespace dew::train {

struct AxisPlace {
  int rank = 0;
  int size = 1;
};

struct DevicePlace {
  int device = 0;  // its id in the mesh
  AxisPlace data, fsdp, tensor, sequence;
  // The batch is split over data x fsdp (data outer): this device's part.
  int batch_rank = 0;
  int first_sequence = 0;
  int sequences = 1;
  // Its positions of each sequence: contiguous shards of the sequence axis.
  std::vector<std::int64_t> positions;
};

// The bytes one process of this layout holds for the model, roughly: each
// device's fsdp share of parameters, gradients and AdamW's moments, its
// gathered parameters and its activations, at 8 bytes a value, and the
// tokenized dataset every process holds whole. plan_layout
// refuses a layout whose estimate is over this machine's memory.
long double estimated_process_bytes(const WorkerOptions& options, const mesh::Mesh& mesh);

// Whether a device's error may be another process's failure seen from here
// (a collective that broke or timed out: kUnavailable, kTimeout, kPeerFailed),
// which waits for the pool's word naming that process; any other error (an
// I/O error such as a full disk, a bad value) is the device's own and is
// published at once (issue 26: every device waited, the failing one too, and
// an innocent rank was named).
bool may_be_a_peers_failure(const Error& error);

// The exchange the sequence axis runs (options.exchange: the rule's pick, or
// a forced one that can run) and why.
Result<attention::Plan> plan_exchange(const WorkerOptions& options, int sequence, int tensor);

// The place of device `device` of `mesh` (plan_layout's).
Result<DevicePlace> place_of(const mesh::Mesh& mesh, const WorkerOptions& options, int device);

}  // namespace dew::train
