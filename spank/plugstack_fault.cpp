// A plugstack.conf line that does not parse: which steps are refused, and
// which line goes where. One admin's typo refuses only the steps that asked
// for Dew; every other step runs as if the plugin were not there.
#include "dew/text.h"
#include "pool_plan.h"

namespace dew::spank {
namespace {

// "--dew-pool" or "--dew-pool, --dew-port".
std::string asked_for(const std::vector<std::string>& dew_options) { return join(dew_options, ", "); }

FaultVerdict refusal(FaultLineTo line_to, const Error& error, std::string_view what, std::string_view until) {
  return {true, line_to,
          error.message + "; " + std::string(what) + ", which cannot run until the admin fixes " + std::string(until)};
}

}  // namespace

FaultVerdict judge_plugstack_fault(FaultSite site, const std::optional<Error>& config_error,
                                   const std::vector<std::string>& dew_options, bool first_task_on_node) {
  if (!config_error) return {};
  const Error& error = *config_error;
  const bool asked = !dew_options.empty();
  switch (site) {
    case FaultSite::kSrun:
    case FaultSite::kAllocator: {
      if (!asked) {
        // Said only to a user who asks srun to be verbose: nothing of theirs is wrong.
        return {false, FaultLineTo::kDebug, error.message + "; steps without --dew-* options run as usual"};
      }
      const std::string what =
          (site == FaultSite::kSrun ? "this step asked for " : "this job asked for ") + asked_for(dew_options);
      return refusal(FaultLineTo::kError, error, what, "plugstack.conf");
    }
    case FaultSite::kNodeStep:
      // The admin's line in slurmd's log, once per step on each node: an
      // error where a step is refused, else a note that steps still run.
      if (!asked) {
        return {false, FaultLineTo::kInfo,
                error.message +
                    "; steps without --dew-* options run as usual, steps with them are refused until it is fixed"};
      }
      // Not refused here: a failed init on a node reaches only this log, and
      // srun would see a launch failure that names nothing. Each task is
      // refused at kNodeTask, where the line reaches srun.
      return {false, FaultLineTo::kError,
              error.message + "; this step asked for " + asked_for(dew_options) +
                  ": its tasks are refused until the admin fixes plugstack.conf"};
    case FaultSite::kNodeTask: {
      if (!asked) return {};
      auto verdict = refusal(FaultLineTo::kTaskStderr, error, "this step asked for " + asked_for(dew_options),
                             "plugstack.conf on its nodes");
      if (!first_task_on_node) verdict.line_to = FaultLineTo::kNowhere, verdict.line.clear();
      return verdict;
    }
  }
  return {};
}

}  // namespace dew::spank
