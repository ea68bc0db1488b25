// The `dew` Python module: the pool, fast failure and meshes for training
// scripts. pool_bindings.cpp: prepare_process and Pool; mesh_bindings.cpp:
// MeshSpec, build_mesh, choose_exchange; torch_bindings.cpp: torch_process_groups.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "dew/pool.h"

namespace py = pybind11;

namespace dew::python {
namespace {

// dew.PoolError, kept for the life of the process (never released: the
// interpreter may be gone when static destructors run).
PyObject* g_pool_error = nullptr;

void raise_pool_error(ErrorCode code, const std::string& message, const std::vector<int>& late_ranks) {
  py::object error = py::reinterpret_borrow<py::object>(g_pool_error)(message);
  error.attr("code") = std::string(error_code_name(code));
  error.attr("late_ranks") = late_ranks;
  PyErr_SetObject(g_pool_error, error.ptr());
}

}  // namespace

void throw_error(const Error& error) {
  if (error.code == ErrorCode::kInvalidArgument || error.code == ErrorCode::kNotFound ||
      error.code == ErrorCode::kUnsupported) {
    throw py::value_error(error.message);
  }
  throw_pool_error(error.code, error.message);
}

}  // namespace dew::python

PYBIND11_MODULE(dew, m) {
  using namespace dew::python;
  m.doc() =
      "Dew for training scripts: join the pool srun --dew-pool, srun --mpi=pmix or dew launch started "
      "(prepare_process), meet at agreements with a patience, fail fast, and lay meshes out (build_mesh).\n\n"
      "    import dew, jax\n"
      "    pool = dew.prepare_process()\n"
      "    jax.distributed.initialize(**pool.jax_distributed_kwargs())";
  g_pool_error = py::exception<PendingPoolError>(m, "PoolError", PyExc_RuntimeError).release().ptr();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const PendingPoolError& e) {
      raise_pool_error(e.code, e.message, e.late_ranks);
    } catch (const dew::runtime::PoolError& e) {
      raise_pool_error(e.code(), e.what(), e.late_ranks());
    }
  });
  bind_failure(m);
  bind_pool(m);
  bind_mesh(m);
  bind_torch(m);
}
