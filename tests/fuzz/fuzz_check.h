// The fuzz targets' invariant check: on a violation, name the condition and
// trap, which libFuzzer records as a crash with the input that caused it.
#pragma once

#include <cstdio>

#define FUZZ_CHECK(condition)                                                                    \
  do {                                                                                           \
    if (!(condition)) {                                                                          \
      std::fprintf(stderr, "invariant violated at %s:%d: %s\n", __FILE__, __LINE__, #condition); \
      __builtin_trap();                                                                          \
    }                                                                                            \
  } while (false)
