// Which processes hold a pool back while it runs (pure): from each
// process's samples of its steps (how often its main thread waited on its
// peers, and its steps' time), the ones whose own work per step is well over
// the pool's median while the others wait. Private to pool/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dew::runtime {

struct PaceStats {
  std::uint64_t window = 0;   // which interval (wall clock / interval)
  std::uint64_t samples = 0;  // looks at the main thread during steps
  std::uint64_t waiting = 0;  // of which it waited on its peers
  std::uint64_t steps = 0;
  std::uint64_t step_microseconds = 0;  // the steps' total time
};

std::string encode_pace(const PaceStats& stats);
std::optional<PaceStats> decode_pace(std::string_view text);

// A slow process's own work a step exceeds the median's by at least this
// share of the median step.
inline constexpr double kSlowShareOfStep = 0.1;

// One line per slow process ("rank 2 is slow: …"), for the processes with
// at least 5 samples and a step in `window`: slow when its own work a step
// (step time x the share not spent waiting) is at least 1.5 times the
// median's, and over it by kSlowShareOfStep of the median step, while the
// median process waited at least a quarter of its time.
std::vector<std::string> slow_processes(const std::vector<std::optional<PaceStats>>& stats, std::uint64_t window,
                                        double interval_seconds);

}  // namespace dew::runtime
