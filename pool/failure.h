// The process-wide failure path, for parts of libdew that are not Pool
// methods (StepWatchdog). Private to pool/.
#pragma once

#include <string>

namespace dew::runtime::detail {

// As Pool::fail() when this process has joined a pool; otherwise prints
// "error: <message>" and exits with exit_code.
[[noreturn]] void fail_process(const std::string& message, int exit_code);

}  // namespace dew::runtime::detail
