// python3 for the ThreadSanitizer tree: Debian's interpreter with the TSan
// runtime in its executable. An instrumented extension module needs the
// runtime loaded before anything else runs, and clang 14's shared TSan
// runtime cannot be preloaded on Debian 12 (it depends on libstdc++, whose
// initializer calls the intercepted __cxa_atexit before the runtime is set up:
// every process segfaults), so the tests run this program instead: libpython,
// started as `python3` starts it, in an executable linked with the static
// runtime, which exports the interceptors and __tsan_* to the module.
// sys.executable is this program, so the scripts the tests start under
// `dew launch` run under it too.
#include <Python.h>

int main(int argc, char** argv) { return Py_BytesMain(argc, argv); }
