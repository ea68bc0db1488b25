// When srun has waited long enough for a step Slurm has ended (pool_plan.h).
#include <string>

#include "pool_plan.h"

namespace dew::spank {

std::optional<std::string> SrunWatch::after_look(StepRecord record) {
  switch (record) {
    case StepRecord::kListed:
      gone_looks_ = 0;
      return std::nullopt;
    case StepRecord::kUnknown:
      // Neither way: slurmctld busy or restarting says nothing of the step.
      return std::nullopt;
    case StepRecord::kGone:
      break;
  }
  if (++gone_looks_ < kSrunWatchGoneLooks) return std::nullopt;
  const auto waited = std::chrono::duration_cast<std::chrono::seconds>(kSrunWatchEvery * (kSrunWatchGoneLooks - 1));
  return "step " + std::to_string(job_id_) + "." + std::to_string(step_id_) + " has ended in Slurm (slurmctld has " +
         "no record of it for " + std::to_string(waited.count()) + " s), but srun still waits: the exits of " +
         "some tasks never reached it (their node's link was down when they ended); ending srun, which exits " +
         "with the largest exit code it heard";
}

}  // namespace dew::spank
