// The calls of a C library libdew loads when it first needs it (MUNGE, PMIx)
// rather than links: a program that never meets it runs where it is not
// installed.
#pragma once

#include <dlfcn.h>

#include <string>

#include "dew/result.h"

namespace dew::runtime {

// The library `soname`, loaded once by the caller and never closed; else
// one line naming it, `what` needs it, and the Debian package that has it.
inline Result<void*> open_library(const char* soname, int flags, const std::string& what, const char* package) {
  void* handle = ::dlopen(soname, flags);
  if (handle) return handle;
  const char* why = ::dlerror();
  return unavailable(what + " " + soname + " cannot be loaded (" + (why ? why : "not found") +
                     "; Debian's package: " + package + ")");
}

// `function` set to `name` in the library `handle`; false when it is not there.
template <typename Function>
bool bind_call(void* handle, const char* name, Function& function) {
  function = reinterpret_cast<Function>(::dlsym(handle, name));
  return function != nullptr;
}

}  // namespace dew::runtime
