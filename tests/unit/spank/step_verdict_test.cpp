// One verdict per pool step (spank/step_verdict.h): the nodes' failure
// notices as srun reads them, and which one srun names.
#include "step_verdict.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace dew::spank {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr std::string_view kSecret = "6b1f0e2a9c4d4e7f8a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6071";

FailureNotice notice(std::uint32_t rank, std::int64_t at_us, std::string node) {
  return {rank, at_us, std::move(node),
          "rank " + std::to_string(rank) + " ended with exit code 1; ending step 12.0 (kill-on-bad-exit)", 1};
}

TEST(FailureNotice, ANoticeReadsBackAsSent) {
  auto sent = notice(2, 1765000000123456, "n2");
  sent.line += " with spaces; and a\nnewline";
  const auto text = encode_failure_notice(sent, 12, 0, kSecret);
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << "one line on the wire";
  auto read = decode_failure_notice(text, 12, 0, kSecret);
  ASSERT_TRUE(read.ok()) << read.error().message;
  EXPECT_EQ(read.value().rank, 2u);
  EXPECT_EQ(read.value().ended_at_us, 1765000000123456);
  EXPECT_EQ(read.value().node, "n2");
  EXPECT_EQ(read.value().exit_code, 1) << "the launcher's exit code comes from it";
  EXPECT_EQ(read.value().line,
            "rank 2 ended with exit code 1; ending step 12.0 (kill-on-bad-exit) with spaces; and a newline")
      << "control bytes of a line never reach srun's stderr";
}

// The fuzz target: a clock before the epoch was written with its sign,
// which the reader (digits only) refused.
TEST(FailureNotice, AClockBeforeTheEpochIsSentAsZero) {
  auto read = decode_failure_notice(encode_failure_notice(notice(2, -88, "n2"), 12, 0, kSecret), 12, 0, kSecret);
  ASSERT_TRUE(read.ok()) << read.error().message;
  EXPECT_EQ(read.value().ended_at_us, 0);
}

TEST(FailureNotice, AnotherSecretAnotherStepOrAnAlteredFieldIsRefused) {
  const auto text = encode_failure_notice(notice(2, 5, "n2"), 12, 0, kSecret);
  auto other_secret = decode_failure_notice(text, 12, 0, "0000");
  ASSERT_FALSE(other_secret.ok());
  EXPECT_EQ(other_secret.error().message,
            "failure notice refused: not tagged with this step's pool secret; allowed: a notice of this step from one "
            "of its nodes");
  auto other_step = decode_failure_notice(text, 12, 1, kSecret);
  ASSERT_FALSE(other_step.ok());
  EXPECT_THAT(other_step.error().message, HasSubstr("of step '12.0', not 12.1"));
  // The rank changed on the way (2 -> 3): the tag no longer matches.
  std::string altered = text;
  altered.replace(altered.find(" 2 1 5 "), 7, " 3 1 5 ");
  EXPECT_FALSE(decode_failure_notice(altered, 12, 0, kSecret).ok());
  for (const std::string& bad :
       std::vector<std::string>{"", "\n", "hello\n", "dew-failure-notice 2 12.0 2 1 5 6e32 72 00\n",
                                "dew-failure-notice 1 12.0 2 5 6e32 72 00\n", std::string(5000, 'x')}) {
    auto read = decode_failure_notice(bad, 12, 0, kSecret);
    ASSERT_FALSE(read.ok()) << bad;
    EXPECT_THAT(read.error().message, StartsWith("failure notice refused: ")) << bad;
  }
}

TEST(StepVerdict, TheEarliestFailureIsNamedOnceWhateverOrderTheNoticesCameIn) {
  StepVerdict verdict;
  EXPECT_FALSE(verdict.say()) << "nothing to say before a notice";
  // Rank 1's node (a peer whose Gloo pair broke) reached srun first; rank
  // 2 failed 210 ms before it by the nodes' clocks.
  EXPECT_FALSE(verdict.add(notice(1, 2'000'210'000, "n1")));
  EXPECT_TRUE(verdict.waiting());
  EXPECT_FALSE(verdict.add(notice(2, 2'000'000'000, "n2")));
  auto lines = verdict.say();
  ASSERT_TRUE(lines);
  EXPECT_EQ(lines->verdict,
            "rank 2 ended with exit code 1; ending step 12.0 (kill-on-bad-exit); node n2; the first of 2 nodes' "
            "failures (the others ended after it)");
  ASSERT_EQ(lines->after.size(), 1u);
  EXPECT_EQ(lines->after[0],
            "after rank 2's failure, rank 1 on n1 also ended with exit code 1, 210 ms later: not named as the step's "
            "failure");
  EXPECT_FALSE(verdict.say()) << "said once";
  EXPECT_FALSE(verdict.waiting());
  // A node heard from after the verdict: said as ending after it, not named.
  auto late = verdict.add(notice(3, 2'000'500'000, "n3"));
  auto later = verdict.add(notice(4, 2'003'000'000, "n4"));
  ASSERT_TRUE(later);
  EXPECT_THAT(*later, HasSubstr("rank 4 on n4 also ended with exit code 1, 3 s later"));
  ASSERT_TRUE(late);
  EXPECT_THAT(*late, StartsWith("after rank 2's failure, rank 3 on n3 also ended with exit code 1, 500 ms later"));
}

TEST(StepVerdict, OneNodesNoticeIsTheVerdictAsItsNodeWouldHaveSaidIt) {
  StepVerdict verdict;
  verdict.add(notice(3, 7, "node-b"));
  auto lines = verdict.say();
  ASSERT_TRUE(lines);
  EXPECT_EQ(lines->verdict, "rank 3 ended with exit code 1; ending step 12.0 (kill-on-bad-exit); node node-b");
  EXPECT_TRUE(lines->after.empty());
}

TEST(StepVerdict, NoticesAtTheSameMomentAreOrderedByArrival) {
  StepVerdict verdict;
  verdict.add(notice(5, 100, "a"));
  verdict.add(notice(4, 100, "b"));
  EXPECT_THAT(verdict.say()->verdict, StartsWith("rank 5 ended"));
}

}  // namespace
}  // namespace dew::spank
