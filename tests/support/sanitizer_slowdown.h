// How much slower a sanitized test program runs. A unit test's wall-clock
// guard (against a search that explodes or a wait that hangs, never a speed
// claim: benchmarks measure speed) multiplies its bound by this, so the
// ASan+UBSan and TSan trees, which CI runs beside other tests, keep it.
#pragma once

namespace dew::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr double kSanitizerSlowdown = 5.0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr double kSanitizerSlowdown = 5.0;
#else
inline constexpr double kSanitizerSlowdown = 1.0;
#endif
#else
inline constexpr double kSanitizerSlowdown = 1.0;
#endif

}  // namespace dew::testing
