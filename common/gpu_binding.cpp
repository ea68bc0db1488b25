#include "dew/gpu_binding.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "dew/text.h"

namespace dew {
namespace {

std::vector<std::string> slice(const std::vector<std::string>& tokens, std::size_t first, std::size_t count) {
  return {tokens.begin() + static_cast<std::ptrdiff_t>(first),
          tokens.begin() + static_cast<std::ptrdiff_t>(first + count)};
}

std::optional<std::string> local_ids(std::size_t count) {
  if (count == 0) return std::nullopt;
  std::vector<std::string> ids;
  for (std::size_t i = 0; i < count; ++i) ids.push_back(std::to_string(i));
  return join(ids, ",");
}

// The node's GPUs as tokens: the visible list, else indices 0..count-1.
Result<std::vector<std::string>> node_tokens(const GpuBindingInput& input) {
  // Slurm writes NoDevFiles when a step has a GPU gres without device files.
  if (input.visible_devices) {
    if (input.visible_devices->empty() || *input.visible_devices == "NoDevFiles") return std::vector<std::string>{};
    auto tokens = split(*input.visible_devices, ',');
    for (const auto& token : tokens) {
      if (token.empty()) {
        return invalid_argument("CUDA_VISIBLE_DEVICES=" + quoted(*input.visible_devices) +
                                " has an empty entry; allowed: a comma-separated list of GPU indices or UUIDs");
      }
    }
    return tokens;
  }
  std::vector<std::string> tokens;
  for (unsigned i = 0; i < input.gpu_count.value_or(0); ++i) tokens.push_back(std::to_string(i));
  return tokens;
}

}  // namespace

Result<std::optional<unsigned>> even_share(unsigned gpus, unsigned local_processes, const std::string& place) {
  if (local_processes <= 1 || gpus == 0) return std::optional<unsigned>();
  if (local_processes > gpus) {
    return invalid_argument(std::to_string(local_processes) + " processes on " + place + " would share " +
                            counted(gpus, "GPU") + "; allowed: at most " + std::to_string(gpus) +
                            " processes per node, a devices-per-process value that fits, or off to let every " +
                            "process see every GPU");
  }
  return std::optional<unsigned>(gpus / local_processes);
}

Result<DevicesPerProcess> parse_devices_per_process_choice(std::string_view text, std::string_view option) {
  if (text == "off") return DevicesPerProcess();
  auto value = parse_whole<unsigned>(text);
  if (!value || *value == 0 || *value > kMaxDevicesPerProcess) {
    return not_allowed(option, text, "an integer from 1 to " + std::to_string(kMaxDevicesPerProcess) + ", or off");
  }
  return DevicesPerProcess(*value);
}

Result<DefaultShare> default_share(const GpuBindingInput& input) {
  const unsigned count = input.visible_devices ? visible_gpu_count(input.visible_devices) : input.gpu_count.value_or(0);
  const unsigned processes = input.local_process_count;
  auto share = even_share(count, processes, input.place);
  if (!share.ok()) return share.error();
  DefaultShare chosen{share.value(), std::nullopt};
  if (share.value() && count % processes != 0 && input.local_process == 0) {
    chosen.idle_note = std::to_string(processes) + " processes on " + std::to_string(count) + " GPUs of " +
                       input.place + ": " + std::to_string(*share.value()) + " each, " +
                       std::to_string(count % processes) + " left idle";
  }
  return chosen;
}

unsigned visible_gpu_count(const std::optional<std::string>& visible_devices) {
  if (!visible_devices || visible_devices->empty() || *visible_devices == "NoDevFiles") return 0;
  return static_cast<unsigned>(split(*visible_devices, ',').size());
}

bool slurm_bound_gpus(const std::optional<std::string>& tres_bind, const std::optional<std::string>& gpus_per_task) {
  // --gpu-bind leaves "gpu:<how>" in SLURMD_TRES_BIND; --gpus-per-task binds
  // per task too (Slurm >= 21.08 implies --gpu-bind=per_task:N).
  const bool bind = tres_bind && tres_bind->find("gpu:") != std::string::npos;
  const bool per_task = gpus_per_task && !gpus_per_task->empty();
  return bind || per_task;
}

Result<GpuBinding> bind_gpus(const GpuBindingInput& input) {
  auto tokens = node_tokens(input);
  if (!tokens.ok()) return tokens.error();
  const auto& all = tokens.value();
  // Slurm's own binding wins: the task keeps exactly what Slurm gave it.
  if (input.bound_by_slurm || !input.devices_per_process) return GpuBinding{std::nullopt, local_ids(all.size())};
  const std::size_t per_process = *input.devices_per_process;
  // Every local process checks the whole node: when any of them would not
  // fit, none starts (a step half started would only be ended again), and
  // each names the first that does not fit.
  const std::size_t fitting = per_process == 0 ? SIZE_MAX : all.size() / per_process;
  const std::size_t processes = std::max<std::size_t>(input.local_process_count, std::size_t{input.local_process} + 1);
  const std::size_t first = static_cast<std::size_t>(input.local_process) * per_process;
  if (fitting < processes) {
    const std::size_t failing = fitting;
    // A list from another host can hold anything: the message stays one line.
    const std::string seen = input.visible_devices ? "CUDA_VISIBLE_DEVICES=" + printable(*input.visible_devices)
                                                   : "CUDA_VISIBLE_DEVICES unset";
    const auto count = static_cast<long long>(input.local_process_count);
    const std::size_t start = failing * per_process;
    return invalid_argument("local process " + std::to_string(failing) + " of " + std::to_string(count) +
                            " needs GPUs [" + std::to_string(start) + ", " + std::to_string(start + per_process) +
                            ") with " + counted(static_cast<long long>(per_process), "device") + " per process, but " +
                            input.place + " has " + counted(static_cast<long long>(all.size()), "GPU") + " (" + seen +
                            "); " + counted(count, "process", "processes") + (count == 1 ? " needs " : " need ") +
                            std::to_string(per_process * input.local_process_count));
  }
  return GpuBinding{join(slice(all, first, per_process), ","), local_ids(per_process)};
}

}  // namespace dew
