// Fast failure for Python scripts, with nothing lost. A process ends for its
// own error (an uncaught exception in any thread, pool.fail) or a peer's; in
// both, libdew publishes first (the peers end at once), then runs the hook
// here, bounded by DEW_EXIT_BOUND_SECONDS (2 s), then ends hard with the
// failure's exit code. The hook flushes sys.stdout/stderr, logging's handlers
// and every open file object, and makes the main thread unwind: it raises
// dew.PoolFailed there (a BaseException, so `except Exception:` does not
// swallow it), finally: blocks run, and when it reaches the top atexit runs.
// A main thread blocked in C code (time.sleep, a read, a collective) cannot
// unwind: atexit then runs on the hook's thread and the process ends at once.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bindings.h"
#include "dew/exit_status.h"
#include "dew/failure_timings.h"
#include "dew/log.h"
#include "dew/process.h"
#include "dew/text.h"

namespace py = pybind11;

namespace dew::python {
namespace {

PyObject* g_pool_failed = nullptr;  // dew.PoolFailed, kept for the process's life

// Other threads (libdew's before-exit hook, the watchdog's probe) take the
// GIL only through the gate, which the main thread closes as the interpreter
// begins to end: a thread that took the GIL after finalization segfaulted
// (scancel: peers heard of a failure while their own SIGTERM unwound them).
std::mutex g_gate_mutex;
bool g_gate_closed = false;
thread_local bool t_inside_gate = false;

void close_gate() {
  if (t_inside_gate) return;  // atexit run by the hook's own thread
  py::gil_scoped_release unlocked;
  std::lock_guard lock(g_gate_mutex);
  g_gate_closed = true;
}

// The main thread's part in an ending: it is inside fail() (so cannot
// unwind), or it has unwound and run atexit.
std::atomic<bool> g_main_in_fail{false};
std::atomic<bool> g_unwind_requested{false};
std::mutex g_unwound_mutex;
std::condition_variable g_unwound_changed;
bool g_unwound = false;

bool on_main_thread() {
  py::module_ threading = py::module_::import("threading");
  return threading.attr("current_thread")().is(threading.attr("main_thread")());
}

// Every open, writable file object: text wrappers first (they write into
// their buffers), then the buffers. By their C types only: an isinstance()
// on every live object would run arbitrary __class__ code (and warnings).
// Called with the GIL.
void flush_open_files() {
  py::module_ io = py::module_::import("io");
  py::list objects = py::module_::import("gc").attr("get_objects")();
  for (const char* kind : {"TextIOWrapper", "BufferedWriter", "BufferedRandom"}) {
    auto* type = reinterpret_cast<PyTypeObject*>(io.attr(kind).ptr());
    for (const auto& object : objects) {
      if (!PyType_IsSubtype(Py_TYPE(object.ptr()), type)) continue;
      try {
        if (object.attr("closed").cast<bool>() || !object.attr("writable")().cast<bool>()) continue;
        object.attr("flush")();
      } catch (const py::error_already_set& e) {  // a closed pipe, a detached buffer: nothing to save
        if (e.matches(g_pool_failed)) throw;      // the unwinding, started in a flush's bytecode
      } catch (const py::cast_error&) {
      }
    }
  }
}

// atexit's functions, once, then every buffer. Called with the GIL.
std::atomic<bool> g_atexit_ran{false};
runtime::Pool* g_pool = nullptr;
void run_atexit_and_flush() {
  if (!g_atexit_ran.exchange(true)) {
    try {
      py::module_::import("atexit").attr("_run_exitfuncs")();
    } catch (const py::error_already_set& e) {
      log_error("an atexit function failed while the pool was ending: " + one_line(e.what()));
    }
  }
  flush_python_buffers();
  try {
    flush_open_files();
  } catch (const py::error_already_set&) {
  }
}

// How long the main thread has to start unwinding: one running bytecode
// takes the pending call within Python's switch interval (5 ms), one waiting
// in a pool call within its 20 ms slice; one
// that has not by then is blocked in C code (time.sleep, a read, a torch
// collective waiting for the failed rank) and cannot unwind at all.
constexpr auto kUnwindStart = std::chrono::milliseconds(100);
std::atomic<bool> g_unwind_started{false};

// Runs in the main thread at its next bytecode (or in a blocking call's wait).
std::atomic<bool> g_in_excepthook{false};
int raise_pool_failed(void*) {
  // Already unwinding for the launcher's SIGTERM, or at the top already.
  if (g_sigterm_unwinding.load() || g_in_excepthook.load()) return 0;
  g_unwind_started = true;
  PyErr_SetString(g_pool_failed, "the pool is ending: unwinding this process (finally: and atexit run)");
  return -1;
}

// libdew's hook, on a thread of its own.
void before_exit(int exit_code) {
  bool unwinds = false;
  const bool python = with_python([&] {
    flush_python_buffers();
    // The main thread waits in fail(), or its step is stuck (the watchdog's
    // end): nothing can unwind; the process's own code reaches the launcher
    // first.
    if (g_main_in_fail.load() || exit_code == kWatchdogExitCode) {
      run_atexit_and_flush();
      return;
    }
    g_unwind_requested = true;
    unwinds = true;
    Py_AddPendingCall(raise_pool_failed, nullptr);
  });
  if (!python || !unwinds) return;
  const auto asked = std::chrono::steady_clock::now();
  while (!g_unwind_started.load() && std::chrono::steady_clock::now() - asked < kUnwindStart) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!g_unwind_started.load()) {
    // Blocked in C code: atexit runs here instead, and the process ends now.
    with_python(run_atexit_and_flush);
    return;
  }
  // The main thread unwinds, runs atexit and says so; libdew's bound ends
  // the process if it cannot.
  std::unique_lock lock(g_unwound_mutex);
  g_unwound_changed.wait(lock, [] { return g_unwound; });
}

// dew.PoolFailed reached the top of the main thread: atexit, then the end
// (libdew exits with the failure's code once the hook returns).
void finish_unwinding() {
  run_atexit_and_flush();
  {
    std::lock_guard lock(g_unwound_mutex);
    g_unwound = true;
  }
  g_unwound_changed.notify_all();
  py::gil_scoped_release unlocked;
  for (;;) pause();
}

// At most kBusyThreadsBound, with the GIL released, while another thread of
// the process is running (state R in /proc): the exit's own work is done
// on this thread, so one that is busy is a library's worker finishing.
constexpr auto kBusyThreadsBound = std::chrono::milliseconds(100);
void let_busy_threads_finish() {
  py::gil_scoped_release unlocked;
  const auto until = std::chrono::steady_clock::now() + kBusyThreadsBound;
  while (runnable_threads_besides_caller() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// What the program asked sys.exit() for (0 until it did): Python keeps no
// trace of it once SystemExit has reached the top.
std::atomic<int> g_exit_asked{0};
int exit_status_code(const py::object& status) {
  if (status.is_none()) return 0;
  if (py::isinstance<py::int_>(status)) {
    const long long value = status.cast<long long>();
    return value < 0 ? static_cast<int>(value % 256 + 256) : static_cast<int>(value % 256);
  }
  return 1;  // a message: printed, and the exit code is 1
}

// The first atexit function registered, so the last to run: a main thread
// that left by another way while the pool was ending (a SystemExit in a
// finally:) stops here, atexit done, and libdew ends the process with the
// failure's exit code instead of the interpreter's (whose static
// destructors would leave a pool that is failing).
void at_interpreter_exit() {
  if (g_sigterm_unwinding.load() && !t_inside_gate) {
    // Stopped from outside: atexit has run (this function is its last);
    // the process ends by the signal, as an unhandled SIGTERM would.
    flush_python_buffers();
    close_gate();
    std::fflush(nullptr);
    std::signal(SIGTERM, SIG_DFL);
    std::raise(SIGTERM);
  }
  if (!g_unwind_requested.load()) {
    // The program ends by itself (a return, sys.exit). A library's worker
    // still busy (torch's gloo thread freeing a tensor) would take the GIL
    // once finalization has begun and be ended there through a noexcept
    // frame: give it a moment to finish first, then make such an ending
    // not the process's failure.
    if (const int code = g_exit_asked.load(); code != 0 && g_pool && !g_pool->ending()) {
      // sys.exit(N), N != 0: this process's failure, said to the peers now,
      // before its connections (torch's among them) close under them: a
      // peer whose collective then broke was named, with its traceback. The
      // rest of atexit and the exit go on, with the program's own code.
      flush_python_buffers();
      py::gil_scoped_release unlocked;
      g_pool->announce_failure("sys.exit(" + std::to_string(code) + "): the program ended with exit code " +
                                   std::to_string(code) + " while its pool ran",
                               code);
    }
    let_busy_threads_finish();
    runtime::note_exit_under_way();
    close_gate();
    return;
  }
  if (g_atexit_ran.load()) return;
  g_in_excepthook = true;  // the top: no dew.PoolFailed from here on
  g_atexit_ran = true;     // what ran just now was atexit
  finish_unwinding();
}

}  // namespace

bool with_python(const std::function<void()>& work) {
  std::lock_guard lock(g_gate_mutex);
  if (g_gate_closed || !Py_IsInitialized() || _Py_IsFinalizing()) return false;
  struct Inside {
    Inside() { t_inside_gate = true; }
    ~Inside() { t_inside_gate = false; }
  } inside;
  py::gil_scoped_acquire gil;
  work();
  return true;
}

bool pool_is_ending() { return g_unwind_requested.load() || (g_pool && g_pool->ending()); }

std::atomic<bool> g_sigterm_unwinding{false};

void flush_python_buffers() {
  try {
    py::module_ sys = py::module_::import("sys");
    for (const char* stream : {"stdout", "stderr"}) {
      py::object s = sys.attr(stream);
      if (!s.is_none()) s.attr("flush")();
    }
    if (!sys.attr("modules").contains("logging")) return;
    // Every live handler (logging's own list, as logging.shutdown walks it),
    // flushed but left open: atexit may still log.
    for (const auto& ref : py::module_::import("logging").attr("_handlerList")) {
      py::object handler = ref();
      if (!handler.is_none()) handler.attr("flush")();
    }
  } catch (const py::error_already_set& e) {  // a closed stream: what could be flushed was
    // Unless it is the unwinding itself: a handler's flush() is bytecode,
    // where the pending dew.PoolFailed may be raised. It goes on up.
    if (e.matches(g_pool_failed)) throw;
  }
}

void check_unwind() {
  if (g_unwind_requested.load() && Py_MakePendingCalls() != 0) throw py::error_already_set();
}

void fail_pool(runtime::Pool& pool, const std::string& message, int code, const std::vector<int>& late) {
  flush_python_buffers();
  if (on_main_thread()) g_main_in_fail = true;
  py::gil_scoped_release unlocked;  // the hook takes the GIL
  if (!late.empty()) pool.fail_for_late(late, message);
  pool.fail(message, code);
}

// Whether the traceback passes through a collective: an error raised
// there (gloo's "Connection closed by peer") is most often a peer's end seen
// from here, whose own word reaches the pool a moment later.
bool raised_inside_collective(py::handle tb) {
  std::vector<std::string> files;
  for (py::object at = py::reinterpret_borrow<py::object>(tb); !at.is_none(); at = at.attr("tb_next")) {
    files.push_back(py::str(at.attr("tb_frame").attr("f_code").attr("co_filename")).cast<std::string>());
  }
  return files_in_collective(files);
}

// Waits (without the GIL) up to `grace` for the pool's word of a peer's
// failure; true when it came.
bool peer_failure_heard_within(runtime::Pool& pool, std::chrono::milliseconds grace) {
  py::gil_scoped_release unlocked;
  return pool.wait_until_ending(grace);
}

void install_fast_failure(runtime::Pool& pool) {
  py::module_ sys = py::module_::import("sys");
  py::module_ threading = py::module_::import("threading");
  py::module_ traceback = py::module_::import("traceback");
  runtime::Pool* raw = &pool;
  g_pool = raw;
  py::module_::import("atexit").attr("register")(py::cpp_function(at_interpreter_exit));
  const auto fail_with = [traceback, raw](py::handle type, py::handle value, py::handle tb) {
    g_in_excepthook = true;  // no dew.PoolFailed from here on: this is the top
    // Unwound by dew.PoolFailed, or an error that is the pool's ending seen
    // from here (a collective whose peer is gone): not this process's
    // failure, and no traceback to blame it.
    const bool in_collective = raised_inside_collective(tb);
    if (PyErr_GivenExceptionMatches(type.ptr(), g_pool_failed) || g_unwind_requested.load() || raw->ending() ||
        (in_collective && peer_failure_heard_within(*raw, timings::kPeerNoticeGrace))) {
      finish_unwinding();
    }
    // No failure published, but a peer left the pool (sys.exit(0), a return)
    // while this one was in a collective with it: that is what broke it.
    if (in_collective) {
      const auto left = [raw] {
        py::gil_scoped_release unlocked;
        return raw->a_process_that_left();
      }();
      if (left) {
        fail_pool(*raw,
                  "process " + std::to_string(*left) +
                      " left the pool (its program ended) while the others were still running: a collective with it "
                      "broke on process " +
                      std::to_string(raw->rank()),
                  1, {*left});
      }
    }
    traceback.attr("print_exception")(type, value, tb);
    const std::string line =
        py::str(type.attr("__name__")).cast<std::string>() + ": " + py::str(value).cast<std::string>();
    // An agreement's patience ran out: the late processes are the failure,
    // not this one that waited for them.
    std::vector<int> late;
    if (!value.is_none() && py::hasattr(value, "late_ranks")) late = value.attr("late_ranks").cast<std::vector<int>>();
    fail_pool(*raw, "uncaught exception: " + one_line(line), 1, late);
  };
  sys.attr("excepthook") = py::cpp_function(fail_with);
  py::object exit = sys.attr("exit");
  sys.attr("exit") = py::cpp_function(
      [exit](py::object status) {
        g_exit_asked = exit_status_code(status);
        exit(status);
      },
      py::arg("status") = py::none());
  threading.attr("excepthook") = py::cpp_function([fail_with](py::handle args) {
    fail_with(args.attr("exc_type"), args.attr("exc_value"), args.attr("exc_traceback"));
  });
  runtime::set_before_exit(before_exit);
}

void bind_failure(py::module_& m) {
  g_pool_failed = PyErr_NewExceptionWithDoc(
      "dew.PoolFailed",
      "Raised in the main thread when the pool is ending (this process's own failure in another thread, or a "
      "peer's), so that finally: blocks and then atexit run before the process ends with the failure's exit code. "
      "A BaseException: `except Exception:` lets it through. Bounded by DEW_EXIT_BOUND_SECONDS (2 s).",
      PyExc_BaseException, nullptr);
  m.attr("PoolFailed") = py::handle(g_pool_failed);
}

}  // namespace dew::python
