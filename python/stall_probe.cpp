// The collective probe libdew's StepWatchdog asks when a step outlives its
// bound (runtime::set_collective_probe): whether Python's main thread waits
// on its peers. Torch releases the GIL while it waits; a thread that holds
// it past the probe's wait is at work, not waiting.
#include <pybind11/pybind11.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "bindings.h"

namespace py = pybind11;

namespace dew::python {
namespace {

constexpr std::chrono::milliseconds kProbeWait{1000};

bool main_thread_in_collective() {
  py::module_ sys = py::module_::import("sys");
  py::dict frames = sys.attr("_current_frames")();
  py::object main_id = py::module_::import("threading").attr("main_thread")().attr("ident");
  if (!frames.contains(main_id)) return false;
  std::vector<std::string> files;
  for (py::object frame = frames[main_id]; !frame.is_none(); frame = frame.attr("f_back")) {
    files.push_back(py::str(frame.attr("f_code").attr("co_filename")).cast<std::string>());
  }
  return files_in_collective(files);
}

std::optional<bool> probe_main_thread() {
  struct Answer {
    std::mutex mutex;
    std::condition_variable given;
    bool done = false;
    std::optional<bool> waits;
  };
  auto answer = std::make_shared<Answer>();
  // A thread of its own: the GIL may be held for ever (C code that loops).
  std::thread([answer] {
    std::optional<bool> waits;
    with_python([&] {
      try {
        waits = main_thread_in_collective();
      } catch (py::error_already_set&) {  // an odd interpreter state: cannot tell
      }
    });
    std::lock_guard lock(answer->mutex);
    answer->waits = waits;
    answer->done = true;
    answer->given.notify_all();
  }).detach();
  std::unique_lock lock(answer->mutex);
  if (!answer->given.wait_for(lock, kProbeWait, [&] { return answer->done; })) return false;
  return answer->waits;
}

}  // namespace

bool files_in_collective(const std::vector<std::string>& files) {
  const auto in_file_of = [](const std::string& file, std::string_view part) {
    return file.find(part) != std::string::npos;
  };
  bool in_backward = false;
  for (const auto& file : files) {
    if (in_file_of(file, "/torch/distributed/") || in_file_of(file, "/torch/nn/parallel/")) return true;
    in_backward = in_backward || in_file_of(file, "/torch/autograd/");
  }
  if (!in_backward) return false;
  py::object dist = py::module_::import("sys").attr("modules").attr("get")("torch.distributed");
  return !dist.is_none() && py::hasattr(dist, "is_initialized") && dist.attr("is_initialized")().cast<bool>();
}

void install_collective_probe() { runtime::set_collective_probe(probe_main_thread); }

}  // namespace dew::python
