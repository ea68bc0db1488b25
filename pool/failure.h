// The process-wide failure path, for parts of libdew that are not Pool
// methods (StepWatchdog). Private to pool/.
#pragma once

#include <cstdint>
#include <string>

#include "dew/pool.h"
#include "pace_verdict.h"

namespace dew::runtime::detail {

// As Pool::fail() when this process has joined a pool; otherwise prints
// "error: <message>" and exits with exit_code.
[[noreturn]] void fail_process(const std::string& message, int exit_code);

// The pool this process's failure path publishes to, or null.
Pool::State* attached_pool();

// Step `step` of a StepWatchdog outlived its bound (`message` says so):
// alone, as fail_process(message, kWatchdogExitCode); in a pool, the
// processes behind are named (stall_inquiry.cpp, stall_verdict.h).
[[noreturn]] void end_step_over_bound(std::uint64_t step, const std::string& message);

// While steps run in a pool (stall_inquiry.cpp): whether this process's
// main thread waits on its peers now (nullopt: no pool to ask about);
// publishing a window's samples, after which process 0 names the slow
// processes of the window before.
std::optional<bool> sample_waits_on_peers();
void publish_pace(const PaceStats& ended, double interval_seconds);

}  // namespace dew::runtime::detail
