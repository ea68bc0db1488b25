// What the dew module's binding files share. Private to python/.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "dew/result.h"

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

void bind_pool(pybind11::module_& m);
void bind_mesh(pybind11::module_& m);
void bind_torch(pybind11::module_& m);

}  // namespace dew::python
