// Per-task GPU binding: split the step's GPUs on a node between its tasks.
#include "pool_plan.h"

namespace dew::spank {
namespace {

std::vector<std::string> split_tokens(const std::string& text) {
  std::vector<std::string> tokens;
  std::size_t start = 0;
  while (start <= text.size()) {
    auto comma = text.find(',', start);
    tokens.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return tokens;
}

std::string join(const std::vector<std::string>& tokens, std::size_t first, std::size_t count) {
  std::string out;
  for (std::size_t i = first; i < first + count; ++i) out += (i == first ? "" : ",") + tokens[i];
  return out;
}

std::optional<std::string> local_ids(std::size_t count) {
  if (count == 0) return std::nullopt;
  std::vector<std::string> ids;
  for (std::size_t i = 0; i < count; ++i) ids.push_back(std::to_string(i));
  return join(ids, 0, count);
}

}  // namespace

bool slurm_bound_gpus(const std::optional<std::string>& tres_bind,
                      const std::optional<std::string>& gpus_per_task) {
  // --gpu-bind leaves "gpu:<how>" in SLURMD_TRES_BIND; --gpus-per-task binds
  // per task too (Slurm >= 21.08 implies --gpu-bind=per_task:N).
  const bool bind = tres_bind && tres_bind->find("gpu:") != std::string::npos;
  const bool per_task = gpus_per_task && !gpus_per_task->empty();
  return bind || per_task;
}

Result<GpuBinding> bind_gpus(const GpuBindingInput& input) {
  std::vector<std::string> tokens;
  // Slurm writes NoDevFiles when a step has a GPU gres without device files.
  if (input.visible_devices && !input.visible_devices->empty() && *input.visible_devices != "NoDevFiles") {
    tokens = split_tokens(*input.visible_devices);
    for (const auto& token : tokens) {
      if (token.empty()) {
        return Error{"CUDA_VISIBLE_DEVICES='" + *input.visible_devices +
                     "' has an empty entry; expected a comma-separated list of GPU indices or UUIDs"};
      }
    }
  }
  // Slurm's own binding wins: the task keeps exactly what Slurm gave it.
  if (input.bound_by_slurm || !input.devices_per_process) {
    return GpuBinding{std::nullopt, local_ids(tokens.size())};
  }
  const std::size_t per_task = *input.devices_per_process;
  const std::size_t first = static_cast<std::size_t>(input.local_task) * per_task;
  if (first + per_task > tokens.size()) {
    return Error{"local task " + std::to_string(input.local_task) + " of " +
                 std::to_string(input.local_task_count) + " needs GPUs [" + std::to_string(first) + ", " +
                 std::to_string(first + per_task) + ") with " + std::to_string(per_task) +
                 " devices per process, but the step has " + std::to_string(tokens.size()) +
                 " GPUs on this node (CUDA_VISIBLE_DEVICES=" + input.visible_devices.value_or("<unset>") +
                 "); " + std::to_string(input.local_task_count) + " tasks need " +
                 std::to_string(per_task * input.local_task_count)};
  }
  return GpuBinding{join(tokens, first, per_task), local_ids(per_task)};
}

}  // namespace dew::spank
