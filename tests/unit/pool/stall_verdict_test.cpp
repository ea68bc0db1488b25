// The stall verdict (pool/stall_verdict.h): which processes a step over its
// bound names, from the reports of those whose bounds passed.
#include "stall_verdict.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dew::runtime {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Reports = std::vector<std::optional<StepReport>>;

constexpr StepReport kWaiting{4, true};
constexpr StepReport kWorking{4, false};

TEST(StallVerdict, TheOneOutsideACollectiveIsNamedByEveryProcessNotTheOnesWaitingForIt) {
  const Reports reports{kWaiting, kWaiting, kWorking, kWaiting};
  for (int self = 0; self < 4; ++self) {
    const auto verdict = stalled_processes(reports, self);
    EXPECT_THAT(verdict.behind, ElementsAre(2)) << self;
    EXPECT_EQ(verdict.why,
              "rank 2 was not inside a collective while ranks 0, 1, 3 waited for it inside a collective at step 4");
  }
}

TEST(StallVerdict, AProcessThatGaveNoReportWhileOthersWaitIsBehind) {
  // Stalled between two watched steps: its own bound never passed.
  const auto verdict = stalled_processes(Reports{kWaiting, std::nullopt, kWaiting}, 0);
  EXPECT_THAT(verdict.behind, ElementsAre(1));
  EXPECT_THAT(verdict.why, HasSubstr("rank 1 gave no step report"));
  EXPECT_THAT(verdict.why, HasSubstr("ranks 0, 2 waited for it"));
}

TEST(StallVerdict, AWaiterAtAnEarlierStepIsBehindTheOthers) {
  const auto verdict = stalled_processes(Reports{kWaiting, StepReport{3, true}, kWaiting}, 2);
  EXPECT_THAT(verdict.behind, ElementsAre(1));
  EXPECT_THAT(verdict.why, HasSubstr("rank 1 was still at an earlier step while ranks 0, 2 waited for it"));
}

TEST(StallVerdict, SeveralBehindAreAllNamed) {
  const auto verdict = stalled_processes(Reports{kWorking, kWaiting, kWorking, std::nullopt}, 1);
  EXPECT_THAT(verdict.behind, ElementsAre(0, 2, 3));
  EXPECT_THAT(verdict.why, HasSubstr("ranks 0, 2 were not inside a collective; rank 3 gave no step report"));
  EXPECT_THAT(verdict.why, HasSubstr("while rank 1 waited for them"));
}

TEST(StallVerdict, WhenNoOneWaitsTheLowestStepIsBehind) {
  const auto verdict = stalled_processes(Reports{kWorking, StepReport{2, false}, std::nullopt}, 0);
  EXPECT_THAT(verdict.behind, ElementsAre(1));
  EXPECT_EQ(verdict.why, "rank 1 was at step 2, the others at step 4");
}

TEST(StallVerdict, EveryStepJustSlowOrEveryProcessWaitingNamesTheAskerAlone) {
  for (const Reports& reports : {Reports{kWorking, kWorking, kWorking}, Reports{kWaiting, kWaiting},
                                 Reports{kWorking, std::nullopt, std::nullopt}}) {
    const auto verdict = stalled_processes(reports, 1);
    EXPECT_THAT(verdict.behind, ElementsAre(1));
    EXPECT_EQ(verdict.why, "");
  }
}

TEST(StallVerdict, ReportsRoundTripAndAnythingElseIsNoReport) {
  EXPECT_EQ(encode_step_report(StepReport{12, true}), "12 1");
  const auto back = decode_step_report("12 1");
  ASSERT_TRUE(back);
  EXPECT_EQ(back->step, 12u);
  EXPECT_TRUE(back->waits_on_peers);
  for (const char* bad : {"", "12", "12 2", "x 1", "-1 0", "12  1", "12 1 "})
    EXPECT_FALSE(decode_step_report(bad)) << bad;
}

}  // namespace
}  // namespace dew::runtime
