#include "dew/text.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dew/hex.h"
#include "dew/median.h"

namespace dew {
namespace {

using ::testing::ElementsAre;

TEST(ParseWhole, DigitsOnly) {
  EXPECT_EQ(parse_whole<int>("0"), 0);
  EXPECT_EQ(parse_whole<int>("2048"), 2048);
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "0x10", "1.5", "99999999999"}) {
    EXPECT_FALSE(parse_whole<int>(bad)) << bad;
  }
}

TEST(ParseIndexList, WholeNumbersOrNothing) {
  EXPECT_THAT(parse_index_list("0,2,3").value(), ElementsAre(0, 2, 3));
  EXPECT_THAT(parse_index_list("7").value(), ElementsAre(7));
  EXPECT_EQ(join(parse_index_list("4,1").value(), ","), "4,1");
  for (const char* bad : {"", "0,,1", "0,-1", "GPU-8f2c", "MIG-1/2/3", "0, 1", "1,"}) {
    EXPECT_FALSE(parse_index_list(bad)) << bad;
  }
}

TEST(SplitJoin, RoundTrip) {
  EXPECT_THAT(split("a,b,,c", ','), ElementsAre("a", "b", "", "c"));
  EXPECT_THAT(split("", ','), ElementsAre(""));
  EXPECT_EQ(join(split("a,b,,c", ','), ","), "a,b,,c");
  EXPECT_EQ(join(std::vector<int>{0, 2, 3}, ","), "0,2,3");
  EXPECT_EQ(processes_text({2}), "process 2");
  EXPECT_EQ(processes_text({0, 3}), "processes 0,3");
}

TEST(HostPort, BracketsBareIpv6) {
  EXPECT_EQ(host_port("fe80::1", "5"), "[fe80::1]:5");
  EXPECT_EQ(host_port("[fe80::1]", "5"), "[fe80::1]:5");
  EXPECT_EQ(host_port("n1", "29500"), "n1:29500");
}

TEST(Printable, OneLineWhateverTheBytes) {
  EXPECT_EQ(printable("ok"), "ok");
  EXPECT_EQ(printable("a\nb\x7f\xff"), "a\\x0ab\\x7f\\xff");
  EXPECT_EQ(printable(std::string(70, 'x'), 64), std::string(64, 'x') + "...");
  EXPECT_EQ(quoted("it"), "'it'");
  EXPECT_EQ(one_line("a\nb\rc"), "a b c");
}

TEST(Hex, EncodesBytesAndDrawsRandomText) {
  const unsigned char bytes[] = {0x00, 0x0f, 0xa5, 0xff};
  EXPECT_EQ(to_hex(bytes), "000fa5ff");
  const auto a = random_hex(32), b = random_hex(32);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a.value().size(), 64u);
  EXPECT_EQ(a.value().find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a.value(), b.value());
}

TEST(Text, CountsTakeTheirNounsNumber) {
  EXPECT_EQ(counted(1, "task"), "1 task");
  EXPECT_EQ(counted(0, "GPU"), "0 GPUs");
  EXPECT_EQ(counted(2, "process", "processes"), "2 processes");
  EXPECT_EQ(counted(1, "process", "processes"), "1 process");
}

TEST(Text, APoolSecretIs64HexDigits) {
  EXPECT_TRUE(is_pool_secret(std::string(64, 'a')));
  EXPECT_TRUE(is_pool_secret("5f0c3a0e8d2b4f6a9c1e7d3b5a8f2c4e6b9d1a3c5e7f9b2d4a6c8e0f1a3b5C7D"));
  for (const std::string& bad :
       {std::string("abc"), std::string(63, 'a'), std::string(65, 'a'), std::string(63, 'a') + "g", std::string()}) {
    EXPECT_FALSE(is_pool_secret(bad)) << bad;
  }
}

TEST(Median, OddEvenAndSummary) {
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(median({}), 0);
  const Summary s = summarize({5, 1, 3});
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.median, 3);
  EXPECT_EQ(s.max, 5);
}

}  // namespace
}  // namespace dew
