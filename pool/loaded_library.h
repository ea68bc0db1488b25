// The calls of a C library libdew loads when it first needs it (MUNGE, PMIx)
// rather than links: a program that never meets it runs where it is not
// installed.
#pragma once

#include <dlfcn.h>

namespace dew::runtime {

// `function` set to `name` in the library `handle`; false when it is not there.
template <typename Function>
bool bind_call(void* handle, const char* name, Function& function) {
  function = reinterpret_cast<Function>(::dlsym(handle, name));
  return function != nullptr;
}

}  // namespace dew::runtime
