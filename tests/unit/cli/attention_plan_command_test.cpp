// `dew attention-plan` as a user runs it: the design page's case, the exchange that
// only one side can run, and one-line errors (1) and usage errors (2).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "process.h"
#include "test_paths.h"

namespace {

using ::testing::HasSubstr;

dew::testing::RunResult plan(std::vector<std::string> args) {
  args.insert(args.begin(), {dew::testing::dew_exe(), "attention-plan"});
  return dew::testing::run(args);
}

TEST(AttentionPlanCommandTest, SeedGroupedQueryGathers) {
  const auto r = plan({"--heads", "32", "--kv-heads", "8", "--length", "4096", "--sequence", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("exchange  gather\n"));
  EXPECT_THAT(r.out, HasSubstr("reason    unmasked, and the gather sends fewer bytes: 16 against 40 units"));
  EXPECT_THAT(r.out, HasSubstr("  all-to-all  40 units, 20971520 bytes (20 MiB)\n"));
  EXPECT_THAT(r.out, HasSubstr("  gather      16 units, 8388608 bytes (8 MiB)\n"));
  EXPECT_THAT(r.out, HasSubstr("K' = 8"));
}

TEST(AttentionPlanCommandTest, CausalTakesTheAllToAll) {
  const auto r = plan({"--heads", "32", "--kv-heads", "8", "--length", "4096", "--sequence", "2", "--mask", "causal",
                       "--tensor", "2", "--head-dim", "64", "--bytes-per-value", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("exchange  all-to-all\n"));
  EXPECT_THAT(r.out, HasSubstr("dense bias"));
  EXPECT_THAT(r.out, HasSubstr("per tensor shard: 16 query, 4 key"));
  EXPECT_THAT(r.out, HasSubstr("mask causal, head dim 64, 4 bytes per value, gather kernel dense-bias"));
}

TEST(AttentionPlanCommandTest, CausalOnDewsCpuKernelGoesByBytes) {
  const auto r = plan({"--heads", "32", "--kv-heads", "8", "--length", "4096", "--sequence", "2", "--mask", "causal",
                       "--gather-kernel", "skips-masked-blocks"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("exchange  gather\n"));
  EXPECT_THAT(r.out, HasSubstr("reason    a causal call on a gather kernel that skips masked blocks (the same work "
                               "either way), and the gather sends fewer bytes: 16 against 40 units"));
  EXPECT_THAT(r.out, HasSubstr("gather kernel skips-masked-blocks"));
}

TEST(AttentionPlanCommandTest, CrossAttentionGathers) {
  const auto r = plan({"--heads", "16", "--kv-heads", "16", "--length", "4096", "--kv-length", "77", "--sequence", "2",
                       "--mask", "window=64,8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("exchange  gather\n"));
  EXPECT_THAT(r.out, HasSubstr("  all-to-all  cannot run: the key length 77 does not divide by sequence 2\n"));
}

TEST(AttentionPlanCommandTest, ErrorsAreOneLine) {
  auto r = plan({"--heads", "12", "--kv-heads", "4", "--length", "4097", "--sequence", "8", "--mask", "causal"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("dew attention-plan: neither exchange can run: all-to-all: "));
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1);
  r = plan({"--heads", "16", "--kv-heads", "16", "--length", "4096", "--sequence", "2", "--mask", "sliding"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("dew attention-plan: mask: 'sliding' is not allowed; allowed: none, causal, documents"));
  r = plan({"--heads", "8", "--kv-heads", "3", "--length", "4096", "--sequence", "2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("dew attention-plan: kv_heads: 3 does not divide heads 8"));
  r = plan({"--heads", "16", "--kv-heads", "16", "--length", "4096", "--sequence", "2", "--gather-kernel", "gpu"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "dew attention-plan: gather kernel: 'gpu' is not allowed; allowed: dense-bias (cuDNN-like, the design "
            "page's rule) or skips-masked-blocks (Dew's CPU kernel)\n");
}

TEST(AttentionPlanCommandTest, UsageErrorsExitTwo) {
  EXPECT_EQ(plan({"--heads", "x", "--kv-heads", "8", "--length", "4096", "--sequence", "2"}).exit_code, 2);
  EXPECT_EQ(plan({"--kv-heads", "8", "--length", "4096", "--sequence", "2"}).exit_code, 2);
  EXPECT_EQ(plan({"--help"}).exit_code, 0);
}

}  // namespace
