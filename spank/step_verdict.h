// One verdict per pool step (core: no Slurm, no sockets). Each node's
// slurmstepd names the first failure it sees among its own tasks; on
// several nodes that was one line per node, the later ones usually peers
// that failed because the first one had (a broken Gloo pair). Instead each
// node sends srun a failure notice (the rank, when its node saw the exit,
// the line it would print), tagged with the step's pool secret; srun's
// plugin gathers them for kVerdictSettle and names the earliest once; the
// others go to srun's -v output as having ended after it. A node that
// cannot reach srun names its failure itself, as before.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dew/failure_timings.h"
#include "dew/result.h"

namespace dew::spank {

using timings::kNoticeBound;
using timings::kVerdictSettle;

// What a node's slurmstepd tells srun of the first failed task it saw.
struct FailureNotice {
  std::uint32_t rank = 0;
  // The node's wall clock when its slurmstepd saw the exit, in microseconds
  // since the epoch: the nodes' clocks order failures across nodes (a clock
  // before the epoch is sent as 0).
  std::int64_t ended_at_us = 0;
  std::string node;
  // classify_task_end's line: "rank 2 ended with exit code 1; ending step 12.0 (kill-on-bad-exit)".
  std::string line;
  // The task's own exit code as a shell gives it (128 + a signal).
  int exit_code = 0;
};

// A notice is one line of text, at most this long with its newline.
inline constexpr std::size_t kFailureNoticeMaxBytes = 2048;

// "dew-failure-notice 2 JOB.STEP RANK EXIT_CODE ENDED_US NODE_HEX LINE_HEX MAC_HEX\n";
// MAC: HMAC-SHA-256 keyed by the step's pool secret over the text before it.
std::string encode_failure_notice(const FailureNotice& notice, std::uint32_t job, std::uint32_t step,
                                  std::string_view secret);
// Refuses, naming what is wrong, a notice of another step, not tagged with
// this step's secret, or not in the form above.
Result<FailureNotice> decode_failure_notice(std::string_view text, std::uint32_t job, std::uint32_t step,
                                            std::string_view secret);

// srun's book of one step's notices.
class StepVerdict {
 public:
  struct Lines {
    FailureNotice named;             // the notice of the rank named
    std::uint32_t rank = 0;          // the rank named
    std::string verdict;             // the step's failure, for srun's stderr
    std::vector<std::string> after;  // the others, for srun -v
  };
  // Keeps a notice (arrival order breaks ties of the clocks). Once the
  // verdict is said, a later notice's line is returned at once instead.
  std::optional<std::string> add(FailureNotice notice);
  bool waiting() const { return !notices_.empty() && !said_; }
  // The verdict and what ended after it, once; nullopt before any notice or
  // after it was said.
  std::optional<Lines> say();

 private:
  std::string after_line(const FailureNotice& later) const;

  std::vector<FailureNotice> notices_;
  std::optional<FailureNotice> first_;
  bool said_ = false;
};

}  // namespace dew::spank
