// The pace verdict (pace_verdict.h): pure.
#include "pace_verdict.h"

#include <algorithm>
#include <cstdio>

#include "dew/text.h"

namespace dew::runtime {
namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace

std::string encode_pace(const PaceStats& s) {
  return std::to_string(s.window) + " " + std::to_string(s.samples) + " " + std::to_string(s.waiting) + " " +
         std::to_string(s.steps) + " " + std::to_string(s.step_microseconds);
}

std::optional<PaceStats> decode_pace(std::string_view text) {
  const auto parts = split(text, ' ');
  if (parts.size() != 5) return std::nullopt;
  const auto window = parse_whole<std::uint64_t>(parts[0]);
  const auto samples = parse_whole<std::uint64_t>(parts[1]);
  const auto waiting = parse_whole<std::uint64_t>(parts[2]);
  const auto steps = parse_whole<std::uint64_t>(parts[3]);
  const auto micros = parse_whole<std::uint64_t>(parts[4]);
  if (!window || !samples || !waiting || !steps || !micros || *waiting > *samples) return std::nullopt;
  return PaceStats{*window, *samples, *waiting, *steps, *micros};
}

std::vector<std::string> slow_processes(const std::vector<std::optional<PaceStats>>& stats, std::uint64_t window,
                                        double interval_seconds) {
  std::vector<int> ranks;
  std::vector<double> work, waited, step;
  for (std::size_t r = 0; r < stats.size(); ++r) {
    const auto& s = stats[r];
    if (!s || s->window != window || s->samples < 5 || s->steps == 0) continue;
    const double share = static_cast<double>(s->waiting) / static_cast<double>(s->samples);
    ranks.push_back(static_cast<int>(r));
    step.push_back(static_cast<double>(s->step_microseconds) / 1e6 / static_cast<double>(s->steps));
    work.push_back(step.back() * (1 - share));
    waited.push_back(share);
  }
  std::vector<std::string> lines;
  if (ranks.size() < 2) return lines;
  const double median_work = median(work), median_waited = median(waited), median_step = median(step);
  if (median_waited < 0.25) return lines;
  for (std::size_t k = 0; k < ranks.size(); ++k) {
    if (work[k] < 1.5 * median_work || work[k] <= 0) continue;
    // What a rank adds must be a tenth of the step or more: a sample or two
    // not waiting, on a loaded machine, made a rank whose work was 0.02 s
    // against the median's 0.01 s "slow" in a 0.3 s step.
    if (work[k] - median_work < kSlowShareOfStep * median_step) continue;
    char ratio[32] = "";
    if (median_work >= 0.0005) std::snprintf(ratio, sizeof ratio, " (%.1fx)", work[k] / median_work);
    char line[320];
    std::snprintf(line, sizeof line,
                  "rank %d is slow: its own work took %.3f s a step over the last %g s, against the pool's median "
                  "%.3f s%s; the median process waited for its peers %.0f%% of its step time, rank %d %.0f%%",
                  ranks[k], work[k], interval_seconds, median_work, ratio, 100 * median_waited, ranks[k],
                  100 * waited[k]);
    lines.emplace_back(line);
  }
  return lines;
}

}  // namespace dew::runtime
