// A bad plugstack.conf line refuses only the steps that ask for Dew, and says
// why once where each reader looks: the user's stderr, slurmd's log.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pool_plan.h"

namespace dew::spank {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The error parse_plugstack_args gives for the typo the verdicts carry.
Error typo() {
  auto parsed = parse_plugstack_args({"watchdog=forever"});
  EXPECT_FALSE(parsed.ok());
  return parsed.ok() ? Error{} : parsed.error();
}

constexpr std::string_view kTypoLine =
    "plugstack.conf watchdog: 'forever' is not allowed; allowed: a duration such as 90s, 30m, 2h or 1h30m (at most "
    "8760h), or off";

const std::vector<std::string> kNoDew;
const std::vector<std::string> kPool = {"--dew-pool"};

TEST(PlugstackFault, AGoodConfigNeverRefusesNorSaysAnything) {
  for (auto site : {FaultSite::kSrun, FaultSite::kAllocator, FaultSite::kNodeStep, FaultSite::kNodeTask}) {
    for (const auto& options : {kNoDew, kPool}) {
      const auto verdict = judge_plugstack_fault(site, std::nullopt, options);
      EXPECT_FALSE(verdict.refuse);
      EXPECT_EQ(verdict.line_to, FaultLineTo::kNowhere);
      EXPECT_EQ(verdict.line, "");
    }
  }
}

TEST(PlugstackFault, SrunRefusesADewStepInOneLineNamingTheArgumentTheAllowedValuesAndTheOption) {
  const auto verdict = judge_plugstack_fault(FaultSite::kSrun, typo(), kPool);
  EXPECT_TRUE(verdict.refuse);
  EXPECT_EQ(verdict.line_to, FaultLineTo::kError);
  EXPECT_EQ(verdict.line,
            std::string(kTypoLine) +
                "; this step asked for --dew-pool, which cannot run until the admin fixes plugstack.conf");
  EXPECT_EQ(verdict.line.find('\n'), std::string::npos);
}

TEST(PlugstackFault, AnyDewOptionIsAskingForDewAndEveryOneGivenIsNamed) {
  const auto verdict = judge_plugstack_fault(FaultSite::kSrun, typo(), {"--dew-pool", "--dew-port"});
  EXPECT_TRUE(verdict.refuse);
  EXPECT_THAT(verdict.line, HasSubstr("this step asked for --dew-pool, --dew-port, which cannot run"));
  // An option without --dew-pool asks for Dew too: refused, by the config's fault first.
  EXPECT_TRUE(judge_plugstack_fault(FaultSite::kSrun, typo(), {"--dew-watchdog"}).refuse);
}

TEST(PlugstackFault, SrunRunsAStepWithoutDewSayingSoOnlyAtDebugLevel) {
  const auto verdict = judge_plugstack_fault(FaultSite::kSrun, typo(), kNoDew);
  EXPECT_FALSE(verdict.refuse);
  EXPECT_EQ(verdict.line_to, FaultLineTo::kDebug);
  EXPECT_THAT(verdict.line, HasSubstr(kTypoLine));
}

TEST(PlugstackFault, SbatchAndSallocRefuseOnlyAJobThatAskedForDew) {
  const auto refused = judge_plugstack_fault(FaultSite::kAllocator, typo(), kPool);
  EXPECT_TRUE(refused.refuse);
  EXPECT_EQ(refused.line_to, FaultLineTo::kError);
  EXPECT_THAT(refused.line, HasSubstr("; this job asked for --dew-pool, which cannot run until the admin fixes"));
  const auto plain = judge_plugstack_fault(FaultSite::kAllocator, typo(), kNoDew);
  EXPECT_FALSE(plain.refuse);
  EXPECT_NE(plain.line_to, FaultLineTo::kError);
}

TEST(PlugstackFault, ANodeLogsTheErrorOncePerDewStepAndRefusesItsTasks) {
  // Once per node and step, in slurmd's log; the step is not failed there.
  const auto step = judge_plugstack_fault(FaultSite::kNodeStep, typo(), kPool);
  EXPECT_FALSE(step.refuse);
  EXPECT_EQ(step.line_to, FaultLineTo::kError);
  EXPECT_THAT(step.line, HasSubstr(kTypoLine));
  EXPECT_THAT(step.line, HasSubstr("this step asked for --dew-pool: its tasks are refused"));
  // Each task is refused; the first on the node tells srun why, on its own stderr only.
  const auto first = judge_plugstack_fault(FaultSite::kNodeTask, typo(), kPool, true);
  EXPECT_TRUE(first.refuse);
  EXPECT_EQ(first.line_to, FaultLineTo::kTaskStderr);
  EXPECT_THAT(first.line, HasSubstr(kTypoLine));
  EXPECT_THAT(first.line, HasSubstr("this step asked for --dew-pool, which cannot run until the admin fixes "
                                    "plugstack.conf on its nodes"));
  const auto other = judge_plugstack_fault(FaultSite::kNodeTask, typo(), kPool, false);
  EXPECT_TRUE(other.refuse);
  EXPECT_EQ(other.line_to, FaultLineTo::kNowhere);
}

TEST(PlugstackFault, ANodeRunsAStepWithoutDewWithOneInfoLineAndNothingPerTask) {
  const auto step = judge_plugstack_fault(FaultSite::kNodeStep, typo(), kNoDew);
  EXPECT_FALSE(step.refuse);
  EXPECT_EQ(step.line_to, FaultLineTo::kInfo);
  EXPECT_THAT(step.line, HasSubstr(kTypoLine));
  EXPECT_THAT(step.line, HasSubstr("steps without --dew-* options run as usual"));
  EXPECT_THAT(step.line, Not(HasSubstr("\n")));
  for (bool first : {true, false}) {
    const auto task = judge_plugstack_fault(FaultSite::kNodeTask, typo(), kNoDew, first);
    EXPECT_FALSE(task.refuse);
    EXPECT_EQ(task.line_to, FaultLineTo::kNowhere);
  }
}

TEST(PlugstackFault, EveryKindOfBadArgumentIsJudgedAlike) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"kill_on_bad_exit=maybe"}, {"prot_range=1-2"}, {"watchdog"}, {"port_range=15000-15100"}}) {
    auto parsed = parse_plugstack_args(args);
    ASSERT_FALSE(parsed.ok()) << args[0];
    const std::optional<Error> error = parsed.error();
    EXPECT_TRUE(judge_plugstack_fault(FaultSite::kSrun, error, kPool).refuse) << args[0];
    EXPECT_FALSE(judge_plugstack_fault(FaultSite::kSrun, error, kNoDew).refuse) << args[0];
    EXPECT_THAT(judge_plugstack_fault(FaultSite::kSrun, error, kPool).line, HasSubstr(parsed.error().message));
  }
}

}  // namespace
}  // namespace dew::spank
