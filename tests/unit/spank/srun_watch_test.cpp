// SrunWatch: when srun, waiting for exits that will never come, is ended.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pool_plan.h"

namespace dew::spank {
namespace {

using ::testing::HasSubstr;

TEST(SrunWatch, AStepSlurmStillListsNeverEndsSrun) {
  SrunWatch watch(42, 0);
  for (int look = 0; look < 100; ++look) EXPECT_EQ(watch.after_look(StepRecord::kListed), std::nullopt);
}

TEST(SrunWatch, AStepGoneOnTwoLooksInARowEndsSrunNamingIt) {
  SrunWatch watch(42, 3);
  EXPECT_EQ(watch.after_look(StepRecord::kListed), std::nullopt);
  // One look can fall between the step's end and srun's own ordinary end.
  EXPECT_EQ(watch.after_look(StepRecord::kGone), std::nullopt);
  const auto line = watch.after_look(StepRecord::kGone);
  ASSERT_TRUE(line.has_value());
  EXPECT_THAT(*line, HasSubstr("step 42.3 has ended in Slurm (slurmctld has no record of it for 5 s)"));
  EXPECT_THAT(*line, HasSubstr("their node's link was down when they ended); ending srun"));
}

TEST(SrunWatch, TheLooksMustBeInARow) {
  SrunWatch watch(7, 0);
  EXPECT_EQ(watch.after_look(StepRecord::kGone), std::nullopt);
  EXPECT_EQ(watch.after_look(StepRecord::kListed), std::nullopt);
  EXPECT_EQ(watch.after_look(StepRecord::kGone), std::nullopt);
  EXPECT_TRUE(watch.after_look(StepRecord::kGone).has_value());
}

// slurmctld not answering (restarting, overloaded) says nothing of the step:
// it neither ends srun nor breaks a run of looks that found it gone.
TEST(SrunWatch, ASilentSlurmctldSaysNothing) {
  SrunWatch watch(7, 0);
  for (int look = 0; look < 10; ++look) EXPECT_EQ(watch.after_look(StepRecord::kUnknown), std::nullopt);
  EXPECT_EQ(watch.after_look(StepRecord::kGone), std::nullopt);
  EXPECT_EQ(watch.after_look(StepRecord::kUnknown), std::nullopt);
  EXPECT_TRUE(watch.after_look(StepRecord::kGone).has_value());
}

}  // namespace
}  // namespace dew::spank
