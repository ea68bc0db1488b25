// The execution watchdog's duration syntax and its XLA flag: the plugin's
// --dew-watchdog and plugstack `watchdog=`, the pool's DEW_WATCHDOG, and
// what a process of a pool appends to XLA_FLAGS.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "dew/result.h"

namespace dew {

// A watchdog bound in whole seconds; nullopt means "off".
using Watchdog = std::optional<std::chrono::seconds>;

inline constexpr std::chrono::seconds kDefaultWatchdog = std::chrono::minutes(30);
// Longer than any training run; keeps the arithmetic far from overflow.
inline constexpr std::chrono::seconds kLongestWatchdog = std::chrono::hours(24 * 365);

// "90s", "30m", "2h", "1h30m" (units h, m, s, each at most once and in that
// order: the forms absl durations, and so XLA, accept; at most 8760h) or
// "off". `name` names the value in the error (kInvalidArgument).
Result<Watchdog> parse_watchdog(std::string_view text, std::string_view name);

// The bound a process uses, one rule for the Python module, dew worker and
// StepWatchdog: `flag` when not empty (named `flag_name` in its error), else
// DEW_WATCHDOG's value `inherited` (srun --dew-pool and dew launch set it),
// else kDefaultWatchdog.
Result<Watchdog> chosen_watchdog(std::string_view flag, std::string_view flag_name,
                                 const std::optional<std::string>& inherited);

// "30m", "1h30m", "90s": the form parse_watchdog and XLA read back.
std::string format_duration(std::chrono::seconds duration);

inline constexpr std::string_view kXlaWatchdogFlag = "--xla_gpu_execution_terminate_timeout";

// XLA_FLAGS with the watchdog appended, unless the flags already set it or
// the watchdog is off (then nullopt: leave XLA_FLAGS untouched).
std::optional<std::string> merge_xla_flags(const std::optional<std::string>& xla_flags, const Watchdog& watchdog);

}  // namespace dew
