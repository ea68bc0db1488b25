// `dew attention-check` as a user runs it, here in a pool of one process
// whose devices are threads (tests/integration/pool_slurm_test.cpp runs it
// under srun --dew-pool): both exchanges checked against fp64 whole-sequence
// attention and timed, the rule's pick shown, and one-line errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include "process.h"
#include "test_paths.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

dew::testing::RunResult check(std::vector<std::string> args) {
  args.insert(args.begin(), {dew::testing::dew_exe(), "attention-check"});
  return dew::testing::run(args, {{"OPENBLAS_NUM_THREADS", "1"}});
}

// Each exchange's row, "<name>  <seconds> s  <relative error>  ok": a
// positive time and a real error within the tolerance the row says ok to.
void expect_rows(const std::string& out, const std::vector<std::string>& exchanges) {
  for (const std::string& name : exchanges) {
    SCOPED_TRACE(name);
    const std::size_t at = out.find("\n" + name + " ");
    ASSERT_NE(at, std::string::npos) << out;
    std::istringstream row(out.substr(at + 1, out.find('\n', at + 1) - at - 1));
    std::string row_name, unit, verdict;
    double seconds = -1, error = -1;
    row >> row_name >> seconds >> unit >> error >> verdict;
    EXPECT_EQ(unit, "s") << out;
    EXPECT_EQ(verdict, "ok") << out;
    EXPECT_GT(seconds, 0.0) << out;
    EXPECT_GE(error, 0.0) << out;
    EXPECT_LT(error, 1e-4) << out;
  }
}

TEST(AttentionCheckCommandTest, TwoDevicesCausalBothExchangesMatch) {
  const auto r = check({"--devices-per-process", "2", "--heads", "8", "--kv-heads", "4", "--length", "256",
                        "--head-dim", "32", "--runs", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("attention check: 2 devices (1 process x 2), mesh sequence=2; batch 1, heads 8/4, "
                               "length 256, head dim 32, mask causal, fp32 against fp64\n"));
  EXPECT_THAT(r.out, HasSubstr("rule: gather (a causal call on a gather kernel that skips masked blocks"));
  expect_rows(r.out, {"all-to-all", "gather"});
  EXPECT_THAT(r.out, HasSubstr("; the rule picked gather\n"));
  EXPECT_THAT(r.out, HasSubstr("result: every exchange matches whole-sequence attention\n"));
}

TEST(AttentionCheckCommandTest, ErrorsAboveTheToleranceFailTheCheck) {
  // fp32 against fp64 differs by about 1e-7: a tolerance of 1e-12 must fail.
  const auto r = check({"--devices-per-process", "2", "--heads", "4", "--kv-heads", "2", "--length", "64", "--head-dim",
                        "16", "--runs", "1", "--tolerance", "1e-12"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("TOO LARGE"));
  EXPECT_THAT(r.out, HasSubstr("result: FAILED"));
}

TEST(AttentionCheckCommandTest, TensorTimesSequenceWithDocuments) {
  const auto r =
      check({"--devices-per-process", "4", "--mesh", "tensor=2,sequence=2", "--heads", "8", "--kv-heads", "2",
             "--length", "192", "--head-dim", "16", "--mask", "documents", "--batch", "2", "--runs", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("4 devices (1 process x 4), mesh tensor=2,sequence=2; batch 2, heads 8/2"));
  expect_rows(r.out, {"all-to-all", "gather"});
}

TEST(AttentionCheckCommandTest, AnExchangeThatCannotRunIsSkippedWithItsReason) {
  // 6 heads do not split over 4 devices: only the gather runs.
  const auto r = check({"--devices-per-process", "4", "--heads", "6", "--kv-heads", "6", "--length", "128",
                        "--head-dim", "16", "--mask", "window=20", "--runs", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("skipped: all-to-all cannot run: the query heads per tensor shard, heads 6 / "
                               "tensor 1 = 6, do not divide by sequence 4\n"));
  expect_rows(r.out, {"gather"});
  EXPECT_THAT(r.out, Not(HasSubstr("faster here")));

  const auto only = check(
      {"--devices-per-process", "4", "--heads", "6", "--kv-heads", "6", "--length", "128", "--exchange", "all-to-all"});
  EXPECT_EQ(only.exit_code, 1);
  // A process of a pool (here a pool of one) writes its lines as "[rank] ".
  EXPECT_EQ(only.err.substr(only.err.find("[0] all-to-all")),
            "[0] all-to-all cannot run: the query heads per tensor shard, heads 6 / tensor 1 = 6, do not "
            "divide by sequence 4\n");
}

TEST(AttentionCheckCommandTest, BadValuesAreOneLineErrors) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--exchange", "ring"},
       "dew attention-check: --exchange: 'ring' is not allowed; allowed: both, auto, all-to-all, gather\n"},
      {{"--mesh", "tensor=3"},
       "[0] --mesh tensor=3 over 1 device (1 process x 1): mesh spec: tensor=3 asks for 3 devices, which does not "
       "divide the 1 device"},
      {{"--mesh", "tensor=2,sequence=2", "--devices-per-process", "4", "--heads", "6", "--kv-heads", "3"},
       "[0] --kv-heads: '3' is not allowed; allowed: key heads that divide by the tensor axis (2)\n"},
      {{"--mask", "diagonal"}, "[0] mask: 'diagonal' is not allowed; allowed: none, causal, documents"},
  };
  for (const auto& [args, error] : cases) {
    SCOPED_TRACE(args.front() + " " + args[1]);
    const auto r = check(args);
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr(error));
    EXPECT_EQ(r.out, "");
  }
  const auto usage = check({"--runs", "0"});
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_THAT(usage.err, HasSubstr("--runs: Value 0 not in range 1 to 1000"));
}

}  // namespace
