#include "dew/hostlist.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "expect_error.h"

namespace dew {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> expand(std::string_view list) {
  auto hosts = expand_hostlist(list);
  EXPECT_TRUE(hosts.ok()) << list << ": " << (hosts.ok() ? "" : hosts.error().message);
  return hosts.ok() ? hosts.value() : std::vector<std::string>{};
}

std::string error_of(std::string_view list, std::size_t max_hosts = 1u << 16) {
  return dew::testing::invalid_argument_of(expand_hostlist(list, max_hosts));
}

TEST(Hostlist, SingleHost) { EXPECT_THAT(expand("node0"), ElementsAre("node0")); }

TEST(Hostlist, RangesAndSingles) { EXPECT_THAT(expand("n[1-3,7]"), ElementsAre("n1", "n2", "n3", "n7")); }

TEST(Hostlist, ZeroPaddedRange) {
  EXPECT_THAT(expand("gpu[08-11]"), ElementsAre("gpu08", "gpu09", "gpu10", "gpu11"));
  EXPECT_THAT(expand("x[001-002,010]"), ElementsAre("x001", "x002", "x010"));
  // Unpadded lower bound: no padding, whatever the upper bound's width.
  EXPECT_THAT(expand("n[9-10]"), ElementsAre("n9", "n10"));
}

TEST(Hostlist, SeveralBracketGroupsFirstVariesSlowest) {
  EXPECT_THAT(expand("r[1-2]-n[1-2]"), ElementsAre("r1-n1", "r1-n2", "r2-n1", "r2-n2"));
  EXPECT_THAT(expand("r[1-2]n[3]x"), ElementsAre("r1n3x", "r2n3x"));
}

TEST(Hostlist, CommaListsMixedWithRanges) {
  EXPECT_THAT(expand("a,b[1-2],c"), ElementsAre("a", "b1", "b2", "c"));
  EXPECT_THAT(expand("login1,n[3-4,6],gpu[01-02]"), ElementsAre("login1", "n3", "n4", "n6", "gpu01", "gpu02"));
}

TEST(Hostlist, SuffixAfterBrackets) { EXPECT_THAT(expand("n[1-2].cluster"), ElementsAre("n1.cluster", "n2.cluster")); }

TEST(Hostlist, Errors) {
  EXPECT_THAT(error_of(""), HasSubstr("empty"));
  EXPECT_THAT(error_of("n[1-3"), HasSubstr("'[' without a matching ']'"));
  EXPECT_THAT(error_of("n1-3]"), HasSubstr("']' without '['"));
  EXPECT_THAT(error_of("n[3-1]"), HasSubstr("range '3-1' runs backwards"));
  EXPECT_THAT(error_of("n[a-b]"), HasSubstr("numbers or ranges"));
  EXPECT_THAT(error_of("n[]"), HasSubstr("numbers or ranges"));
  EXPECT_THAT(error_of("n[1-]"), HasSubstr("numbers or ranges"));
  EXPECT_THAT(error_of("n[[1]]"), HasSubstr("without a matching"));
  EXPECT_THAT(error_of("a,,b"), HasSubstr("empty host name"));
  EXPECT_THAT(error_of("a,"), HasSubstr("empty host name"));
  EXPECT_THAT(error_of("n[1-3],x[2-1]"), HasSubstr("hostlist 'n[1-3],x[2-1]'")) << "the message names the list";
}

TEST(Hostlist, RefusesListsLargerThanTheLimit) {
  EXPECT_THAT(error_of("n[0-999999999]"), HasSubstr("more than the allowed number"));
  EXPECT_THAT(error_of("a[0-999]b[0-999]c[0-999]"), HasSubstr("more than the allowed number"));
  EXPECT_THAT(error_of("n[1-3],m[1-3]", 5), HasSubstr("more than the allowed number"));
  EXPECT_EQ(expand_hostlist("n[1-3],m[1-2]", 5).value().size(), 5u);
  EXPECT_THAT(error_of("a", 0), HasSubstr("more than the allowed number"));
  EXPECT_THAT(error_of("a,b,c", 2), HasSubstr("more than the allowed number"));
}

}  // namespace
}  // namespace dew
