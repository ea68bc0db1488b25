// Per-process GPU binding: split the GPUs a node gives a job between its
// local processes. The plugin applies it to a step's tasks, `dew launch
// --devices-per-process` to the processes it starts on each host.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "dew/result.h"

namespace dew {

// The most devices one process may own, under every launcher (srun
// --dew-devices-per-process, dew launch --devices-per-process).
inline constexpr unsigned kMaxDevicesPerProcess = 1024;

// A user's or admin's choice of devices per process: N, or nullopt for
// "off" (every process sees every GPU its launcher gave it).
using DevicesPerProcess = std::optional<unsigned>;

// "N" (1-1024) or "off", as every launcher's option takes it; the error
// names `option`, the value and what is allowed.
Result<DevicesPerProcess> parse_devices_per_process_choice(std::string_view text, std::string_view option);

struct GpuBindingInput {
  // CUDA_VISIBLE_DEVICES as the node gives it (Slurm's for the step, or
  // inherited); nullopt when unset. Tokens (indices or UUIDs) are opaque.
  std::optional<std::string> visible_devices;
  // The node's GPU count, for when visible_devices is unset: indices
  // 0..count-1 are then the node's GPUs. nullopt: unknown (none).
  std::optional<unsigned> gpu_count;
  // Slurm bound GPUs per task itself (--gpus-per-task, --gpu-bind).
  bool bound_by_slurm = false;
  unsigned local_process = 0;
  unsigned local_process_count = 1;
  std::optional<unsigned> devices_per_process;
  // Where the GPUs are, for the error: "this node", "host node1".
  std::string place = "this node";
};

struct GpuBinding {
  // The process's CUDA_VISIBLE_DEVICES; nullopt: leave it as it is.
  std::optional<std::string> visible_devices;
  // JAX_LOCAL_DEVICE_IDS, 0..n-1; nullopt when the process has no GPUs.
  std::optional<std::string> local_device_ids;
};

// Local process L with N devices per process takes the visible tokens
// [L*N, (L+1)*N). Too few GPUs is an error (kInvalidArgument) giving the
// counts; Slurm's own binding, or no devices_per_process, keeps what the
// process sees.
Result<GpuBinding> bind_gpus(const GpuBindingInput& input);

// The GPUs a CUDA_VISIBLE_DEVICES value lists: its entries; unset, empty or
// Slurm's NoDevFiles (a GPU gres without device files) is none.
unsigned visible_gpu_count(const std::optional<std::string>& visible_devices);

// How many GPUs each of a node's processes takes when nothing says (no
// devices_per_process anywhere, Slurm not binding): one process keeps them
// all (nullopt); N processes on G >= N GPUs take G / N each, the last G mod N
// left idle; more processes than GPUs is an error (kInvalidArgument) giving
// both counts and the ways out. `place`: "this node", "host n1".
Result<std::optional<unsigned>> even_share(unsigned gpus, unsigned local_processes, const std::string& place);

// The rule every Dew launcher applies when neither the user nor the admin
// said how many devices a process takes and Slurm did not bind them: the
// node's GPUs (input.visible_devices, else input.gpu_count) shared evenly
// between its local processes (even_share). `idle_note`, for local process
// 0 only, says when some GPUs are left idle.
struct DefaultShare {
  std::optional<unsigned> devices_per_process;
  std::optional<std::string> idle_note;
};
Result<DefaultShare> default_share(const GpuBindingInput& input);

// Whether Slurm has already bound GPUs per task, from SLURMD_TRES_BIND and
// SLURM_GPUS_PER_TASK as slurmstepd passes them to the task.
bool slurm_bound_gpus(const std::optional<std::string>& tres_bind, const std::optional<std::string>& gpus_per_task);

}  // namespace dew
