// An agreed stop for time limits and preemption (Pool.stop_requested()):
// once armed, SIGTERM (scancel, a preemption, the time limit's end) and
// SIGUSR1 (Slurm's warning: --signal=USR1@SECONDS, or forwarded by a batch
// script from --signal=B:USR1@SECONDS) no longer end the script; they mark a
// stop, which every process learns at the same stop_requested() call.
#include <fcntl.h>
#include <pybind11/pybind11.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bindings.h"
#include "dew/log.h"

namespace py = pybind11;

namespace dew::python {
namespace {

std::atomic<int> g_stop_signal{0};
bool g_armed = false;  // under the GIL

bool on_main_thread() {
  py::module_ threading = py::module_::import("threading");
  return threading.attr("current_thread")().is(threading.attr("main_thread")());
}

py::cpp_function stop_mark() {
  return py::cpp_function([](int signum, const py::object&) {
    // A pool that is failing ends this process by itself, with its own code.
    if (pool_is_ending() || g_stop_signal.exchange(signum) != 0) return;
    log_info(std::string("got signal ") + std::to_string(signum) + " (SIG" + sigabbrev_np(signum) +
             "): every process stops at its next stop_requested() (Pool.stop_requested)");
  });
}

}  // namespace

void arm_stop_request() {
  if (g_armed) return;
  if (!on_main_thread()) {
    throw py::value_error("stop_requested() must first be called on the main thread (Python takes signals there)");
  }
  py::module_ signal = py::module_::import("signal");
  for (const char* name : {"SIGTERM", "SIGUSR1"}) signal.attr("signal")(signal.attr(name), stop_mark());
  g_armed = true;
}

void take_the_warning_from_now() {
  if (g_armed || !on_main_thread()) return;
  py::module_ signal = py::module_::import("signal");
  const py::object usr1 = signal.attr("SIGUSR1");
  if (!signal.attr("getsignal")(usr1).equal(signal.attr("SIG_DFL"))) return;  // the script's own handler
  signal.attr("signal")(usr1, stop_mark());
}

int stop_signal_seen() { return g_stop_signal.load(); }

void leave_stop_mark() {
  const char* path = std::getenv(kStopMarkVariable);
  if (path == nullptr || *path == '\0') return;
  // Created or left as it is: never truncated, never through a link.
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd >= 0) {
    ::close(fd);
    return;
  }
  // The folder is made on the batch script's node only: elsewhere, nothing to do.
  if (errno == ENOENT) return;
  log_warn(std::string("cannot create ") + kStopMarkVariable + "=" + path + ": " + std::strerror(errno) +
           " (the job script cannot tell this stop from the training's end)");
}

}  // namespace dew::python
