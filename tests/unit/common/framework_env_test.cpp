#include "dew/framework_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

namespace dew {
namespace {

using ::testing::HasSubstr;

std::map<std::string, std::string> as_map(const std::vector<std::pair<std::string, std::string>>& vars) {
  return {vars.begin(), vars.end()};
}

TEST(FrameworkVariables, TorchrunsContractAndJaxsAddressNameTheFrameworkCoordinator) {
  const auto vars = as_map(framework_variables({5, 8, 1, 2, 2, "n1", 12345}));
  EXPECT_EQ(vars.at("RANK"), "5");
  EXPECT_EQ(vars.at("WORLD_SIZE"), "8");
  EXPECT_EQ(vars.at("LOCAL_RANK"), "1");
  EXPECT_EQ(vars.at("LOCAL_WORLD_SIZE"), "2");
  EXPECT_EQ(vars.at("GROUP_RANK"), "2");
  EXPECT_EQ(vars.at("MASTER_ADDR"), "n1");
  EXPECT_EQ(vars.at("MASTER_PORT"), "12345");
  EXPECT_EQ(vars.at("JAX_COORDINATOR_ADDRESS"), "n1:12345");
  EXPECT_EQ(vars.at("DEW_FRAMEWORK_COORDINATOR"), "n1:12345");
  EXPECT_EQ(vars.size(), std::size(kFrameworkVariableNames));
  for (const char* name : kFrameworkVariableNames) EXPECT_EQ(vars.count(name), 1u) << name;
}

TEST(FrameworkVariables, AnIpv6HostIsBracketedInAddressesButBareInMasterAddr) {
  const auto vars = as_map(framework_variables({0, 2, 0, 1, 0, "fe80::1", 10001}));
  EXPECT_EQ(vars.at("JAX_COORDINATOR_ADDRESS"), "[fe80::1]:10001");
  EXPECT_EQ(vars.at("MASTER_ADDR"), "fe80::1");
}

TEST(FrameworkPortRange, NeverMeetsDewsDefaultRangeNorTheEphemeralPorts) {
  EXPECT_TRUE(check_framework_range(PortRange{}, kFrameworkPortRange).ok());
  EXPECT_LT(kFrameworkPortRange.high, 32768);
  // Every step of every job: the two derived ports differ.
  for (std::uint32_t job = 0; job < 300; job += 7) {
    for (std::uint32_t step = 0; step < 40; ++step) {
      EXPECT_NE(derive_port(job, step), derive_port(job, step, kFrameworkPortRange));
    }
  }
}

TEST(FrameworkPortRange, AnOverlapIsRefusedNamingBothRanges) {
  auto overlap = check_framework_range(PortRange{20000, 29999}, PortRange{29000, 30000});
  ASSERT_FALSE(overlap.ok());
  EXPECT_THAT(overlap.error().message, HasSubstr("framework_port_range 29000-30000 shares ports with port_range "
                                                 "20000-29999"));
  EXPECT_FALSE(check_framework_range(PortRange{35000, 35000}, PortRange{35000, 35000}).ok());
  EXPECT_TRUE(check_framework_range(PortRange{35000, 35000}, PortRange{34999, 34999}).ok());
}

}  // namespace
}  // namespace dew
