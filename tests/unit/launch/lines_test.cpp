// dew launch's output: processes' bytes into whole lines with their rank,
// srun's labels, and which failure the launcher names and exits with.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <optional>
#include <string>
#include <vector>

#include "dew/launch_plan.h"

namespace dew::launch {
namespace {

using ::testing::ElementsAre;

TEST(Output, LinesAreSplitWholeAndPrefixed) {
  LineSplitter s;
  EXPECT_TRUE(s.feed("par").empty());
  EXPECT_THAT(s.feed("tial\nnext\n\nlast"), ElementsAre("partial", "next", ""));
  EXPECT_EQ(s.finish(), std::optional<std::string>("last"));
  EXPECT_EQ(s.finish(), std::nullopt);
  EXPECT_EQ(rank_line(12, "hello"), "[12] hello\n");
  EXPECT_EQ(rank_line(0, ""), "[0] \n");
}

TEST(Output, OverlongLinesAreCutAtTheLimit) {
  LineSplitter s(4);
  EXPECT_THAT(s.feed("abcdefghij\nxy"), ElementsAre("abcd", "efgh", "ij"));
  EXPECT_THAT(s.feed("zw"), ElementsAre("xyzw"));
  EXPECT_EQ(s.finish(), std::nullopt);
}

TEST(Output, SrunLabelsBecomeRankPrefixes) {
  EXPECT_EQ(relabel_srun_line(" 3: hello: world"), "[3] hello: world\n");
  EXPECT_EQ(relabel_srun_line("12: x"), "[12] x\n");
  EXPECT_EQ(relabel_srun_line(" 0: "), "[0] \n");
  EXPECT_EQ(relabel_srun_line("srun: error: n1: task 1: Exited with exit code 3"),
            "srun: error: n1: task 1: Exited with exit code 3\n");
  EXPECT_EQ(relabel_srun_line(""), "\n");
}

TEST(Output, TheFailureNamedIsNotAPeerFailedExit) {
  EXPECT_EQ(pick_failure({{1, 75 << 8}, {2, 1 << 8}, {3, 75 << 8}}), 1u);
  EXPECT_EQ(pick_failure({{3, 75 << 8}, {1, 75 << 8}}), 1u) << "all peer-failed: the lowest rank";
  EXPECT_EQ(pick_failure({{3, 2 << 8}, {0, SIGSEGV}}), 1u) << "a signal counts as a failure of its own";
  EXPECT_EQ(pick_failure({{5, 3 << 8}}), 0u);
}

TEST(Output, SrunsTaskLinesGiveTasksAndCodes) {
  auto end = srun_task_end("srun: error: n1: tasks 0,2-3: Exited with exit code 75");
  ASSERT_TRUE(end);
  EXPECT_EQ(end->tasks, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(end->code, 75);
  end = srun_task_end("srun: error: n2: task 3: Killed");
  ASSERT_TRUE(end);
  EXPECT_EQ(end->code, 128 + SIGKILL);
  EXPECT_EQ(srun_task_end("srun: error: n1: task 1: Segmentation fault (core dumped)")->code, 128 + SIGSEGV);
  EXPECT_EQ(srun_task_end("srun: error: n1: task 0: Terminated")->code, 128 + SIGTERM);
  for (const char* other : {"srun: error: n1: task 1: Something else", "srun: Job step aborted",
                            "srun: error: n1: tasks 3-1: Killed", "[1] srun: error: n1: task 1: Killed"}) {
    EXPECT_FALSE(srun_task_end(other)) << other;
  }
}

TEST(Output, UnderSlurmTheLauncherExitsWithTheFailingRanksCodeNever75) {
  const std::vector<SrunTaskEnd> peers_first = {{{3}, 75}, {{0, 2}, 75}, {{1}, 3}};
  EXPECT_EQ(slurm_exit_code(75, peers_first, std::nullopt), 3);
  EXPECT_EQ(slurm_exit_code(75, peers_first, PeerBlame{1, "x", std::nullopt, ""}), 3);
  // Killed bystanders do not hide the task that exited on its own.
  EXPECT_EQ(slurm_exit_code(143, {{{3}, 143}, {{1}, 2}}, std::nullopt), 2);
  // A frozen rank, blamed by its peers, ended by the step's end.
  EXPECT_EQ(
      slurm_exit_code(75, {{{0, 2, 3}, 75}, {{1}, 128 + SIGTERM}}, PeerBlame{1, "stopped answering", std::nullopt, ""}),
      128 + SIGTERM);
  EXPECT_EQ(slurm_exit_code(75, {{{0, 1}, 75}}, std::nullopt), 1) << "only 75s and nobody named: 1, never 75";
  EXPECT_EQ(slurm_exit_code(0, {}, std::nullopt), 0);
  EXPECT_EQ(slurm_exit_code(1, {}, std::nullopt), 1) << "srun's own failure";
}

// The plugin's verdict, or the failing process's own record, says its exit
// code: srun's lines (their wording, their order) are not read for it.
TEST(Output, UnderSlurmARecordsExitCodeIsTheLaunchersWhateverSrunsLinesSaid) {
  const PeerBlame said{1, "ended with exit code 7", 7, "n2"};
  EXPECT_EQ(slurm_exit_code(75, {}, said), 7) << "no srun line at all";
  EXPECT_EQ(slurm_exit_code(75, {{{0, 2, 3}, 75}, {{1}, 9}}, said), 7);
  EXPECT_EQ(slurm_exit_code(0, {}, said), 0) << "srun ended well: nothing failed";
  const PeerBlame peer_word{1, "stopped answering", 75, ""};
  EXPECT_EQ(slurm_exit_code(75, {}, peer_word), 1) << "never 75";
}

}  // namespace
}  // namespace dew::launch
