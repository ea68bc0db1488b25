// dew.prepare_process() and dew.Pool: the runtime pool for Python training
// scripts. Blocking calls run with the GIL released on a helper thread while
// the calling thread waits in short slices, checking for Ctrl-C; fast
// failure hooks sys.excepthook and threading.excepthook.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "bindings.h"
#include "dew/exit_status.h"
#include "dew/log.h"
#include "dew/pool.h"
#include "dew/task_contract.h"
#include "dew/text.h"
#include "dew/topology.h"
#include "dew/watchdog.h"

namespace py = pybind11;

namespace dew::python {
namespace {

// Pool calls running on interruptible()'s helper threads.
std::atomic<int> g_calls_in_flight{0};

// The one pool of this process (prepare_process returns it every time).
// Destroyed at the process's exit, which leaves the pool, unless a pool call
// is still running on a helper thread (the main thread left it for a
// SIGTERM's SystemExit, a Ctrl-C, or dew.PoolFailed): that call uses the
// pool, so the pool stays as it is and the process's end closes its
// connections (the peers hear of it as of a process that ended).
struct PoolHolder {
  std::unique_ptr<runtime::Pool> pool;
  ~PoolHolder() {
    if (g_calls_in_flight.load() > 0) static_cast<void>(pool.release());
  }
};
std::unique_ptr<runtime::Pool>& the_pool() {
  static PoolHolder holder;
  return holder.pool;
}

// Runs `work` without the GIL on a helper thread; the caller waits in slices
// of 20 ms and turns a pending Ctrl-C into KeyboardInterrupt (the helper
// keeps waiting on the pool: the process is expected to end).
template <typename T>
T interruptible(std::function<T()> work) {
  auto task = std::make_shared<std::packaged_task<T()>>(std::move(work));
  std::future<T> done = task->get_future();
  ++g_calls_in_flight;
  std::thread([task] {
    (*task)();
    --g_calls_in_flight;
  }).detach();
  while (true) {
    std::future_status status;
    {
      py::gil_scoped_release unlocked;
      status = done.wait_for(std::chrono::milliseconds(20));
    }
    if (status == std::future_status::ready) return done.get();
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    check_unwind();  // the pool is ending: dew.PoolFailed, so finally: blocks run
  }
}

std::chrono::milliseconds millis_of(double seconds, const char* what) {
  if (!(seconds >= 0) || seconds > 365.0 * 24 * 3600) {
    throw py::value_error(std::string(what) + "=" + py::repr(py::float_(seconds)).cast<std::string>() +
                          " is not allowed; allowed: seconds from 0 to one year");
  }
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

// The execution watchdog in XLA_FLAGS, as srun --dew-pool and dew launch set
// it: DEW_WATCHDOG's bound, unless the flags set one already or it is off.
void add_xla_watchdog() {
  const char* bound = std::getenv(contract::kWatchdog.name);
  auto watchdog = chosen_watchdog("", "", bound ? std::optional<std::string>(bound) : std::nullopt);
  if (!watchdog.ok()) throw py::value_error(watchdog.error().message);
  // Through os.environ: Python's copy of the environment is what JAX reads
  // (and setting it there sets the process's too).
  py::object environ = py::module_::import("os").attr("environ");
  std::optional<std::string> flags;
  if (environ.contains("XLA_FLAGS")) flags = environ["XLA_FLAGS"].cast<std::string>();
  auto merged = merge_xla_flags(flags, watchdog.value());
  if (merged) environ["XLA_FLAGS"] = *merged;
}

// A join that failed raises dew.PoolError, which a script may catch; left
// uncaught, it ends the process with kJoinFailedExitCode (69) as libdew's
// join() does, so launchers tell "never joined" from "failed while running".
void install_join_failure_hook(const std::string& message) {
  py::module_ sys = py::module_::import("sys");
  py::object previous = sys.attr("excepthook");
  sys.attr("excepthook") = py::cpp_function([previous, message](py::handle type, py::handle value, py::handle tb) {
    if (!value.is_none() && py::str(value).cast<std::string>() == message) {
      py::module_::import("traceback").attr("print_exception")(type, value, tb);
      log_error("error: cannot join the pool: " + message);
      py::module_::import("sys").attr("stderr").attr("flush")();
      std::_Exit(kJoinFailedExitCode);
    }
    previous(type, value, tb);
  });
}

// The launcher (or srun, scancel, a time limit, a preemption) stops a pool
// with SIGTERM, which would end Python without flushing: unless the script
// handles SIGTERM itself, it tells the peers, flushes and raises
// SystemExit(143) in the main thread, so buffers, finally: blocks and atexit
// run (the launcher's grace bounds it); then the process ends by SIGTERM
// (at_interpreter_exit), so Slurm's plugin and launchers see a stop.
void handle_sigterm() {
  py::module_ signal = py::module_::import("signal");
  py::module_ threading = py::module_::import("threading");
  if (!threading.attr("current_thread")().is(threading.attr("main_thread")())) return;  // only the main thread may
  if (!signal.attr("getsignal")(signal.attr("SIGTERM")).is(signal.attr("SIG_DFL"))) return;
  signal.attr("signal")(signal.attr("SIGTERM"), py::cpp_function([](int signum, const py::object&) {
                          flush_python_buffers();
                          // The pool is ending already: libdew ends this process within its
                          // bound, with the failure's own exit code; nothing to raise.
                          if (pool_is_ending()) return;
                          g_sigterm_unwinding = true;
                          // The peers hear of the stop at once, as a stop;
                          // the process ends by SIGTERM once atexit has run.
                          if (auto& pool = the_pool()) {
                            py::gil_scoped_release unlocked;
                            pool->stopped_by_signal(signum);
                          }
                          PyErr_SetObject(PyExc_SystemExit, py::int_(128 + signum).ptr());
                          throw py::error_already_set();
                        }));
}

runtime::Pool& prepare_process(std::optional<bool> multi_host, std::optional<double> patience) {
  auto& pool = the_pool();
  if (pool) return *pool;
  runtime::JoinOptions options;
  options.multi_host = multi_host.value_or(false);
  if (patience) options.agreement_patience = millis_of(*patience, "patience");
  // A script has no agreement loop to unwind a peer's failure through: end
  // as soon as it is heard, even inside C code (unless the user set a grace).
  options.failure_grace_fallback = std::chrono::milliseconds(1);
  add_xla_watchdog();
  take_the_warning_from_now();
  auto joined = interruptible<Result<runtime::Pool>>([options] { return runtime::try_join(options); });
  if (!joined.ok()) {
    install_join_failure_hook(joined.error().message);
    throw_pool_error(joined.error().code, joined.error().message);
  }
  pool = std::make_unique<runtime::Pool>(std::move(joined.value()));
  // torchrun's variables and JAX_COORDINATOR_ADDRESS, as the pool agreed
  // them: an unmodified init_process_group("gloo") or
  // jax.distributed.initialize() finds its rendezvous under any launcher.
  py::object environ = py::module_::import("os").attr("environ");
  for (const auto& [name, value] : pool->framework_variables()) environ[py::str(name)] = value;
  // join() took the secret out of the process's environment; Python's copy
  // (what subprocess gives a child) loses it too.
  environ.attr("pop")(contract::kPoolSecret.name, py::none());
  install_fast_failure(*pool);
  handle_sigterm();
  return *pool;
}

// Calls a pool method, turning its Error into dew.PoolError.
template <typename T>
T guarded(std::function<Result<T>()> work) {
  return interruptible<T>([work]() -> T {
    auto result = work();
    // Carried back to the calling thread, which holds the GIL.
    if (!result.ok())
      throw PendingPoolError{result.error().code, result.error().message, result.error().late_processes};
    return std::move(result.value());
  });
}

// JAX_LOCAL_DEVICE_IDS as a list, or nullopt when unset.
std::optional<std::vector<int>> local_device_ids() {
  const char* ids = std::getenv("JAX_LOCAL_DEVICE_IDS");
  if (!ids || !*ids) return std::nullopt;
  auto local = parse_index_list(ids);
  if (!local) throw py::value_error(std::string("JAX_LOCAL_DEVICE_IDS='") + ids + "' is not a list of indices");
  return *local;
}

py::dict jax_distributed_kwargs(const runtime::Pool& pool) {
  py::dict kwargs;
  const runtime::Identity& id = pool.identity();
  // The framework's own coordinator, never Dew's: JAX's binds a port of its own.
  kwargs["coordinator_address"] = pool.framework_coordinator().text();
  kwargs["num_processes"] = id.size;
  kwargs["process_id"] = id.rank;
  if (auto local = local_device_ids()) kwargs["local_device_ids"] = *local;
  return kwargs;
}

}  // namespace

// One step of a StepWatchdog as Python's `with` sees it.
struct WatchedStep {
  runtime::StepWatchdog* watchdog;
};

std::unique_ptr<runtime::StepWatchdog> make_step_watchdog(std::optional<double> seconds) {
  std::optional<std::chrono::milliseconds> bound;
  if (seconds) {
    if (!(*seconds > 0)) {
      throw py::value_error("seconds=" + py::repr(py::float_(*seconds)).cast<std::string>() +
                            " is not allowed; allowed: more than 0 seconds (None: DEW_WATCHDOG, else 30 minutes)");
    }
    bound = millis_of(*seconds, "seconds");
  }
  auto watchdog = runtime::StepWatchdog::create(bound);
  if (!watchdog.ok()) throw py::value_error(watchdog.error().message);  // a bad DEW_WATCHDOG
  return std::move(watchdog.value());
}

void bind_step_watchdog(py::module_& m) {
  py::class_<WatchedStep>(m, "_WatchedStep", "One step of a StepWatchdog (a context manager).")
      .def("__enter__", [](WatchedStep& s) { s.watchdog->begin_step(); })
      .def("__exit__", [](WatchedStep& s, const py::args&) {
        s.watchdog->end_step();
        return false;
      });
  py::class_<runtime::StepWatchdog>(
      m, "StepWatchdog",
      "Ends the pool when one step runs longer than its bound, even when the step is stuck in a read or in C code. "
      "In a pool, the processes behind are named and end with exit 124 (those outside a collective while their "
      "peers wait in one: torch.distributed, DDP's backward, a pool call; else those at an earlier step), not "
      "the peers that wait for them; the launcher or srun's plugin ends the rest. "
      "`with watchdog.step(): ...` is one step.")
      .def(py::init(&make_step_watchdog), py::arg("seconds") = py::none(),
           "seconds: the bound; None takes DEW_WATCHDOG (srun --dew-watchdog, plugstack watchdog=, dew launch "
           "--watchdog), else 30 minutes.")
      .def_property_readonly(
          "bound",
          [](const runtime::StepWatchdog& w) -> std::optional<double> {
            if (auto bound = w.bound()) return std::chrono::duration<double>(*bound).count();
            return std::nullopt;
          },
          "The bound in seconds, or None when it is off.")
      .def(
          "step", [](runtime::StepWatchdog& w) { return WatchedStep{&w}; }, py::keep_alive<0, 1>(),
          "A context manager: the time inside it is one step.");
}

void bind_pool(py::module_& m) {
  install_collective_probe();
  bind_step_watchdog(m);
  py::class_<runtime::Pool>(m, "Pool", "This process's pool (from dew.prepare_process()).")
      .def_property_readonly("rank", &runtime::Pool::rank, "This process's rank, 0..size-1.")
      .def_property_readonly("size", &runtime::Pool::size, "The number of processes.")
      .def_property_readonly(
          "local_rank", [](const runtime::Pool& p) { return p.identity().local_rank; },
          "This process's index among the pool's processes on its node.")
      .def_property_readonly(
          "local_size", [](const runtime::Pool& p) { return p.identity().local_size; },
          "The pool's processes on this node.")
      .def(
          "agree",
          [](runtime::Pool& p, const std::string& name, std::optional<double> patience) {
            const auto wait = patience ? std::optional(millis_of(*patience, "patience")) : std::nullopt;
            guarded<Done>([&p, name, wait] { return wait ? p.try_agree(name, *wait) : p.try_agree(name); });
          },
          py::arg("name"), py::arg("patience") = py::none(),
          "Returns when every process has called agree(name) as often; raises dew.PoolError naming the missing "
          "processes when the patience (seconds; default DEW_AGREEMENT_PATIENCE_SECONDS) runs out.")
      .def(
          "all_gather",
          [](runtime::Pool& p, const py::bytes& data) {
            const std::string mine = data;
            auto all = guarded<runtime::Gathered>([&p, mine] { return p.try_all_gather(mine); });
            py::list out;
            for (const auto part : all) out.append(py::bytes(part.data(), part.size()));
            return out;
          },
          py::arg("data"), "Every process's bytes, in rank order.")
      .def(
          "stop_requested",
          [](runtime::Pool& p) {
            arm_stop_request();
            const char mine = static_cast<char>(stop_signal_seen() != 0);
            auto all = guarded<runtime::Gathered>([&p, mine] { return p.try_all_gather(std::string(1, mine)); });
            for (std::size_t rank = 0; rank < all.size(); ++rank) {
              if (all[rank] == std::string_view("\1", 1)) {
                log_info("stopping at this stop_requested(), with every process: process " + std::to_string(rank) +
                         " was asked to stop");
                leave_stop_mark();
                return true;
              }
            }
            return false;
          },
          "An agreed stop for time limits and preemption: True on every process at the same call once any process "
          "got SIGTERM (scancel, a preemption, the time limit) or SIGUSR1 (Slurm's --signal=USR1@SECONDS warning) "
          "since the first call (SIGUSR1 since prepare_process(), unless the script set its own handler). Call it at "
          "the same point of every step on every process (one all_gather of a byte); when it is True, save a "
          "checkpoint and return. The first call (on the main thread) arms it: from then on those signals no longer "
          "end the script. When True it also creates the empty file DEW_STOP_MARK names, if that is set and its "
          "folder exists here: a job script's way to tell a stop from the training's end.")
      .def(
          "put",
          [](runtime::Pool& p, const std::string& key, const py::bytes& value) {
            const std::string v = value;
            guarded<Done>([&p, key, v] { return p.try_put(key, v); });
          },
          py::arg("key"), py::arg("value"), "Publishes value under key to every later get().")
      .def(
          "get",
          [](runtime::Pool& p, const std::string& key, double timeout) {
            const auto wait = millis_of(timeout, "timeout");
            return py::bytes(guarded<std::string>([&p, key, wait] { return p.try_get(key, wait); }));
          },
          py::arg("key"), py::arg("timeout"), "The value under key, waiting up to timeout seconds.")
      .def(
          "require_shared_directory",
          [](runtime::Pool& p, const std::string& path) {
            guarded<Done>([&p, path] { return p.check_shared_directory(path); });
          },
          py::arg("path"), "Raises dew.PoolError naming who sees what when path is not one shared directory.")
      .def(
          "compile_cache_key",
          [](runtime::Pool& p) {
            return guarded<std::optional<std::string>>(
                [&p] { return p.try_compile_cache_key(topology::accelerator_fingerprint()); });
          },
          "A hash of every process's accelerator fingerprint, or None (with a line naming who differs).")
      .def(
          "fail",
          [](runtime::Pool& p, const std::string& message, int code) {
            if (code < 1 || code > 255 || code == kPeerFailedExitCode) {
              throw py::value_error(
                  "code=" + std::to_string(code) +
                  " is not allowed; allowed: 1 to 255 except 75 (a failed pool never ends with 0, and "
                  "75 says a peer failed)");
            }
            fail_pool(p, message, code, {});
          },
          py::arg("message"), py::arg("code") = 1,
          "Prints message once, publishes it to every peer and ends this process with code.")
      .def_property_readonly(
          "local_device_ids", [](const runtime::Pool&) { return local_device_ids(); },
          "This task's accelerators as JAX numbers them (JAX_LOCAL_DEVICE_IDS, which srun --dew-pool and dew launch "
          "--devices-per-process set), or None when nothing bound them.")
      .def_property_readonly(
          "coordinator", [](const runtime::Pool& p) { return p.framework_coordinator().text(); },
          "host:port of the framework's coordinator the pool agreed on (MASTER_ADDR:MASTER_PORT, "
          "JAX_COORDINATOR_ADDRESS): process 0 listens there for jax.distributed or torch.distributed; never Dew's "
          "own port.")
      .def("jax_distributed_kwargs", &jax_distributed_kwargs,
           "coordinator_address, num_processes, process_id (and local_device_ids when JAX_LOCAL_DEVICE_IDS is "
           "set): jax.distributed.initialize(**pool.jax_distributed_kwargs()).");
  m.def("prepare_process", &prepare_process, py::arg("multi_host") = py::none(), py::arg("patience") = py::none(),
        py::return_value_policy::reference,
        "Joins this process's pool (srun --dew-pool, srun --mpi=pmix, mpirun, dew launch, or alone), appends the "
        "XLA execution watchdog to XLA_FLAGS unless set, sets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, "
        "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) and JAX_COORDINATOR_ADDRESS to the framework "
        "coordinator the pool agreed on, and installs fast failure: an uncaught exception is "
        "printed once, published, and ends the process; a peer's failure ends this one with exit code 75. "
        "Calling it again returns the same pool.");
}

}  // namespace dew::python
