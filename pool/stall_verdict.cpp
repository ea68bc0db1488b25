// The stall verdict (stall_verdict.h): pure.
#include "stall_verdict.h"

#include <algorithm>

#include "dew/text.h"

namespace dew::runtime {
namespace {

std::string ranks_text(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

}  // namespace

std::string encode_step_report(const StepReport& report) {
  return std::to_string(report.step) + (report.waits_on_peers ? " 1" : " 0");
}

std::optional<StepReport> decode_step_report(std::string_view text) {
  const auto space = text.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const auto step = parse_whole<std::uint64_t>(text.substr(0, space));
  const auto waits = text.substr(space + 1);
  if (!step || (waits != "0" && waits != "1")) return std::nullopt;
  return StepReport{*step, waits == "1"};
}

StallVerdict stalled_processes(const std::vector<std::optional<StepReport>>& reports, int self) {
  std::vector<int> waiting;
  std::uint64_t top_step = 0;
  std::optional<std::uint64_t> lowest;
  for (std::size_t r = 0; r < reports.size(); ++r) {
    if (!reports[r]) continue;
    top_step = std::max(top_step, reports[r]->step);
    lowest = std::min(lowest.value_or(reports[r]->step), reports[r]->step);
    if (reports[r]->waits_on_peers) waiting.push_back(static_cast<int>(r));
  }
  StallVerdict verdict;
  if (!waiting.empty()) {
    std::vector<int> silent, working, earlier;
    for (std::size_t r = 0; r < reports.size(); ++r) {
      const int rank = static_cast<int>(r);
      if (!reports[r]) {
        silent.push_back(rank);
      } else if (!reports[r]->waits_on_peers) {
        working.push_back(rank);
      } else if (reports[r]->step < top_step) {
        earlier.push_back(rank);
      } else {
        continue;
      }
      verdict.behind.push_back(rank);
    }
    if (verdict.behind.empty()) return StallVerdict{{self}, ""};
    std::vector<int> waiters;
    for (int rank : waiting) {
      if (std::find(earlier.begin(), earlier.end(), rank) == earlier.end()) waiters.push_back(rank);
    }
    std::vector<std::string> parts;
    if (!working.empty())
      parts.push_back(ranks_text(working) + (working.size() == 1 ? " was" : " were") + " not inside a collective");
    if (!silent.empty())
      parts.push_back(ranks_text(silent) + " gave no step report (outside a watched step, or not answering)");
    if (!earlier.empty())
      parts.push_back(ranks_text(earlier) + (earlier.size() == 1 ? " was" : " were") + " still at an earlier step");
    verdict.why = dew::join(parts, "; ") + " while " + ranks_text(waiters) + " waited for " +
                  (verdict.behind.size() == 1 ? "it" : "them") + " inside a collective at step " +
                  std::to_string(top_step);
    return verdict;
  }
  if (lowest && *lowest < top_step) {
    for (std::size_t r = 0; r < reports.size(); ++r) {
      if (reports[r] && reports[r]->step == *lowest) verdict.behind.push_back(static_cast<int>(r));
    }
    verdict.why = ranks_text(verdict.behind) + (verdict.behind.size() == 1 ? " was" : " were") + " at step " +
                  std::to_string(*lowest) + ", the others at step " + std::to_string(top_step);
    return verdict;
  }
  return StallVerdict{{self}, ""};
}

}  // namespace dew::runtime
