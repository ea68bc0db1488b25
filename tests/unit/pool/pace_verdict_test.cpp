// The pace verdict (pool/pace_verdict.h): which processes a running pool
// names as slow, from each one's samples of a window.
#include "pace_verdict.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dew::runtime {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using Stats = std::vector<std::optional<PaceStats>>;

// 10 steps of 0.5 s in window 7, `waiting` of 20 samples spent waiting.
PaceStats of(std::uint64_t waiting) { return PaceStats{7, 20, waiting, 10, 5'000'000}; }

TEST(PaceVerdict, TheRankTheOthersWaitForIsNamedWithItsWorkAgainstTheMedian) {
  const auto lines = slow_processes(Stats{of(16), of(2), of(16), of(14)}, 7, 60);
  EXPECT_THAT(lines, ElementsAre("rank 1 is slow: its own work took 0.450 s a step over the last 60 s, against the "
                                 "pool's median 0.125 s (3.6x); the median process waited for its peers 75% of its "
                                 "step time, rank 1 10%"));
}

TEST(PaceVerdict, ABalancedPoolOrOneThatBarelyWaitsNamesNoOne) {
  EXPECT_THAT(slow_processes(Stats{of(10), of(10), of(11), of(9)}, 7, 60), IsEmpty());
  EXPECT_THAT(slow_processes(Stats{of(2), of(0), of(3), of(2)}, 7, 60), IsEmpty());  // no one waits
}

// test_torch on a loaded machine: rank 0 was "slow" at 0.02 s of work a
// step against the median's 0.01 s (one sample in 15 not waiting), in a
// 0.3 s step that rank 1's 0.3 s of work set. What a rank adds must be a
// tenth of the step.
TEST(PaceVerdict, ASampleOrTwoNotWaitingInALongStepIsNotSlow) {
  // 10 steps of 0.3 s, 15 samples: ranks 2 and 3 wait 14 of them (0.02 s
  // of work), rank 0 waits 12 (0.06 s: 1.5x the median's 0.04 s, but 0.02 s
  // more in a 0.3 s step), rank 1 none (0.3 s).
  const auto at = [](std::uint64_t waiting) { return PaceStats{7, 15, waiting, 10, 3'000'000}; };
  const auto lines = slow_processes(Stats{at(12), at(0), at(14), at(14)}, 7, 3);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], ::testing::StartsWith("rank 1 is slow"));
}

TEST(PaceVerdict, OtherWindowsTooFewSamplesAndNoStepsAreLeftOut) {
  PaceStats old = of(2);
  old.window = 6;
  PaceStats few = of(1);
  few.samples = 4;
  PaceStats idle = of(2);
  idle.steps = 0;
  EXPECT_THAT(slow_processes(Stats{of(16), old, few, idle, std::nullopt}, 7, 60), IsEmpty());
}

TEST(PaceVerdict, WhenTheOthersOnlyWaitTheRatioIsLeftOut) {
  const auto lines = slow_processes(Stats{of(20), of(1), of(20)}, 7, 3);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "rank 1 is slow: its own work took 0.475 s a step over the last 3 s, against the pool's median "
            "0.000 s; the median process waited for its peers 100% of its step time, rank 1 5%");
}

TEST(PaceVerdict, StatsRoundTripAndAnythingElseIsNone) {
  const auto back = decode_pace(encode_pace(PaceStats{3, 20, 5, 9, 123456}));
  ASSERT_TRUE(back);
  EXPECT_EQ(encode_pace(*back), "3 20 5 9 123456");
  for (const char* bad : {"", "3 20 5 9", "3 20 21 9 1", "3 20 5 9 x", "3 20 5 9 1 2"}) {
    EXPECT_FALSE(decode_pace(bad)) << bad;
  }
}

}  // namespace
}  // namespace dew::runtime
