// An agreed stop for time limits and preemption (Pool.stop_requested()):
// once armed, SIGTERM (scancel, a preemption, the time limit's end) and
// SIGUSR1 (Slurm's warning: --signal=USR1@SECONDS, or forwarded by a batch
// script from --signal=B:USR1@SECONDS) no longer end the script; they mark a
// stop, which every process learns at the same stop_requested() call.
//
// SIGUSR1 is taken by a C handler that only marks the stop, and the main
// thread blocks it: Slurm's warning comes whenever its periodic look finds
// it due, and a signal taken on the main thread interrupts the system call
// it is in, which torch's TCPStore inside init_process_group does not retry
// ("RuntimeError: Interrupted system call", seen in CI under load). Another
// thread takes it, or it waits, pending, for the next stop_requested().
//
// SIGTERM stays with a Python handler (on the main thread) once armed: a
// blocked signal stays blocked through exec in what the script starts with
// subprocess or multiprocessing's spawn (vfork runs no atfork handler), and
// those must still end by scancel's SIGTERM. A program started so ignoring
// Slurm's warning is harmless (its default would kill it). By the time the
// loop arms the stop, torch's store calls on the main thread (the ones that
// do not retry) are behind it: its collectives wait on their own threads.
#include <fcntl.h>
#include <pthread.h>
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
std::atomic<bool> g_stop_said{false};
bool g_armed = false;          // under the GIL
bool g_warning_taken = false;  // under the GIL: SIGUSR1 is ours (mark_warning below)

bool on_main_thread() {
  py::module_ threading = py::module_::import("threading");
  return threading.attr("current_thread")().is(threading.attr("main_thread")());
}

// Says the first stop signal once, on the thread that asks (never in a handler).
void say_stop_signal(int signum) {
  if (signum == 0 || g_stop_said.exchange(true)) return;
  log_info(std::string("got signal ") + std::to_string(signum) + " (SIG" + sigabbrev_np(signum) +
           "): every process stops at its next stop_requested() (Pool.stop_requested)");
}

py::cpp_function stop_mark() {
  return py::cpp_function([](int signum, const py::object&) {
    // A pool that is failing ends this process by itself, with its own code.
    if (pool_is_ending()) return;
    int none = 0;
    if (g_stop_signal.compare_exchange_strong(none, signum)) say_stop_signal(signum);
  });
}

// Async-signal-safe: marks the warning, nothing else.
void mark_warning(int signum) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, signum);
}

sigset_t warning_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  return set;
}

// A child forked from the main thread (a DataLoader worker) gets SIGUSR1 as
// any program does.
void unblock_warning_in_child() {
  const sigset_t set = warning_set();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

// A warning still pending on the main thread (no other thread took it).
void take_pending_warning() {
  if (!g_warning_taken) return;
  const sigset_t set = warning_set();
  sigset_t pending;
  if (sigpending(&pending) != 0 || sigismember(&pending, SIGUSR1) != 1) return;
  const timespec now{0, 0};
  if (sigtimedwait(&set, nullptr, &now) == SIGUSR1) mark_warning(SIGUSR1);
}

}  // namespace

void arm_stop_request() {
  if (g_armed) return;
  if (!on_main_thread()) {
    throw py::value_error("stop_requested() must first be called on the main thread (Python takes signals there)");
  }
  py::module_ signal = py::module_::import("signal");
  signal.attr("signal")(signal.attr("SIGTERM"), stop_mark());
  // SIGUSR1 stays with mark_warning when prepare_process() took it.
  if (!g_warning_taken) signal.attr("signal")(signal.attr("SIGUSR1"), stop_mark());
  g_armed = true;
}

void take_the_warning_from_now() {
  if (g_armed || g_warning_taken || !on_main_thread()) return;
  py::module_ signal = py::module_::import("signal");
  const py::object usr1 = signal.attr("SIGUSR1");
  if (!signal.attr("getsignal")(usr1).equal(signal.attr("SIG_DFL"))) return;  // the script's own handler
  struct sigaction action {};
  action.sa_handler = mark_warning;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGUSR1, &action, nullptr) != 0) return;
  const sigset_t set = warning_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  static const bool registered = pthread_atfork(nullptr, nullptr, unblock_warning_in_child) == 0;
  (void)registered;
  g_warning_taken = true;
}

int stop_signal_seen() {
  take_pending_warning();
  const int seen = g_stop_signal.load();
  if (!pool_is_ending()) say_stop_signal(seen);
  return seen;
}

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
