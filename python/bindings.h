// What the dew module's binding files share. Private to python/.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "dew/pool.h"
#include "dew/result.h"
#include "dew/task_contract.h"

namespace dew::python {

// A pool error on its way to Python: raised as dew.PoolError with .code.
// late_ranks: the processes an agreement's patience ran out waiting for.
struct PendingPoolError {
  ErrorCode code;
  std::string message;
  std::vector<int> late_ranks = {};
};
[[noreturn]] inline void throw_pool_error(ErrorCode code, const std::string& message) {
  throw PendingPoolError{code, message};
}
// Any other dew error: ValueError for bad arguments, else dew.PoolError.
[[noreturn]] void throw_error(const Error& error);

// Fast failure (failure_bindings.cpp): the excepthooks and libdew's
// before-exit hook; a failure from Python (GIL released: the hook takes it);
// in a blocking call's wait, dew.PoolFailed once the pool is ending; the
// streams, logging's handlers.
void install_fast_failure(runtime::Pool& pool);
[[noreturn]] void fail_pool(runtime::Pool& pool, const std::string& message, int code, const std::vector<int>& late);
void check_unwind();
// Runs `work` with the GIL, from a thread that is not Python's, unless the
// interpreter has begun to end (then false, nothing run): the one way other
// threads take the GIL.
bool with_python(const std::function<void()>& work);
// True once the pool is ending (a peer failed, or this process is failing).
bool pool_is_ending();
// Set by the SIGTERM handler: the main thread is unwinding for the launcher.
extern std::atomic<bool> g_sigterm_unwinding;
void flush_python_buffers();

// StepWatchdog's collective probe: Python's main thread in torch's waits
// (stall_probe.cpp). files_in_collective (with the GIL): whether frames of
// these files are inside a collective: torch.distributed or DDP, or
// autograd's backward once a process group exists (DDP all-reduces the
// gradients inside backward and waits there for every peer's).
void install_collective_probe();
bool files_in_collective(const std::vector<std::string>& files);

// Pool.stop_requested() (stop_request.cpp): arm_stop_request() makes
// SIGTERM and SIGUSR1 mark a stop instead of ending the script (main thread
// only); stop_signal_seen() is the first such signal, or 0.
void arm_stop_request();
int stop_signal_seen();
// From the join on, Slurm's warning (SIGUSR1, whose default ends the
// process) marks a stop too, unless the script set its own handler: a
// warning that came between the join and the first stop_requested() ended
// every rank and the job was lost (slurmctld sends it when its periodic look
// finds it due, as early as the start of a job with a short limit).
void take_the_warning_from_now();
// A stop taken (stop_requested() returned True): creates the empty file
// DEW_STOP_MARK names, when it is set and its folder exists on this node,
// so that a job script can tell tasks that stopped early from tasks that
// finished (scripts/sbatch/python-requeue.sbatch requeues only the first).
inline constexpr const char* kStopMarkVariable = contract::kStopMark.name;
void leave_stop_mark();

void bind_pool(pybind11::module_& m);
void bind_failure(pybind11::module_& m);
void bind_mesh(pybind11::module_& m);
void bind_torch(pybind11::module_& m);

}  // namespace dew::python
