// Which processes are behind when a step outlives its StepWatchdog bound
// (pure). Every process whose bound passed says its step count and whether
// its main thread was waiting on its peers inside a collective; the
// processes named are those the others wait for, not a waiting one.
// Private to pool/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dew::runtime {

struct StepReport {
  std::uint64_t step = 0;       // steps begun through the watchdog
  bool waits_on_peers = false;  // inside a collective (the pool's or a framework's)
};

// "3 1": what one process puts for the others; nullopt for anything else.
std::string encode_step_report(const StepReport& report);
std::optional<StepReport> decode_step_report(std::string_view text);

struct StallVerdict {
  std::vector<int> behind;  // ascending; never empty
  std::string why;          // "…" after "rank R is behind: "; empty when no one is known to wait
};

// reports[r]: process r's report, nullopt when it gave none in time (its
// bound had not passed: it was outside a step, or its step began later, or
// it could not answer). `self` is the process asking: named alone when no
// one is known to wait for anyone (every step is just slow, or every
// process waits inside a collective: a hang below Dew).
//   - some process waits on its peers: behind are those that do not (no
//     report, or a report outside a collective), and those at a lower step;
//   - no one waits: those at the lowest step when the steps differ.
StallVerdict stalled_processes(const std::vector<std::optional<StepReport>>& reports, int self);

}  // namespace dew::runtime
