#include "dew/coordinator_port.h"

#include <gtest/gtest.h>

#include <set>

namespace dew {
namespace {

TEST(DerivePort, StaysInsideTheRange) {
  const PortRange range{20000, 20009};
  for (std::uint32_t job : {0u, 1u, 7u, 12345u, 0xffffffffu}) {
    for (std::uint32_t step : {0u, 1u, 2u, 9u, 10u, 0xfffffffbu, 0xffffffffu}) {
      const auto port = derive_port(job, step, range);
      EXPECT_GE(port, 20000);
      EXPECT_LE(port, 20009);
    }
  }
}

TEST(DerivePort, FullRangeAndSinglePortRange) {
  EXPECT_EQ(derive_port(5, 3, PortRange{40000, 40000}), 40000);
  const auto port = derive_port(0xffffffffu, 0xffffffffu, PortRange{1024, 65535});
  EXPECT_GE(port, 1024);
}

TEST(DerivePort, ConsecutiveStepsOfAJobNeverShareAPort) {
  const PortRange range{20000, 29999};
  for (std::uint32_t job : {1u, 4242u, 987654u}) {
    std::set<std::uint16_t> ports;
    for (std::uint32_t step = 0; step < 10000; ++step) ports.insert(derive_port(job, step, range));
    EXPECT_EQ(ports.size(), 10000u) << "job " << job;
  }
}

TEST(DerivePort, DependsOnJobAndStep) {
  const PortRange range{20000, 29999};
  EXPECT_NE(derive_port(100, 0, range), derive_port(101, 0, range));
  EXPECT_NE(derive_port(100, 0, range), derive_port(100, 1, range));
  // Neighbouring jobs' first steps stay apart.
  std::set<std::uint16_t> first_steps;
  for (std::uint32_t job = 1000; job < 1200; ++job) {
    for (std::uint32_t step = 0; step < 4; ++step) first_steps.insert(derive_port(job, step, range));
  }
  EXPECT_EQ(first_steps.size(), 800u);
}

TEST(DerivePort, SameStepOfTwoJobsMeetsOnlyEvery625JobsInTheDefaultRange) {
  const PortRange range{20000, 29999};
  for (std::uint32_t gap = 1; gap < 625; ++gap) {
    EXPECT_NE(derive_port(5000, 0, range), derive_port(5000 + gap, 0, range)) << gap;
  }
  EXPECT_EQ(derive_port(5000, 0, range), derive_port(5625, 0, range)) << "the period docs/admin.md states";
}

TEST(PortFromRandom, StaysInTheDefaultRangeBelowTheEphemeralPorts) {
  EXPECT_EQ(port_from_random(0), 20000);
  EXPECT_EQ(port_from_random(9999), 29999);
  EXPECT_EQ(port_from_random(10000), 20000);
  EXPECT_EQ(port_from_random(4294967295u), 20000 + 4294967295u % 10000);
  EXPECT_EQ(port_from_random(7, PortRange{31000, 31001}), 31001);
}

TEST(SteppedPort, StepsForwardAndWrapsPastTheTopToTheFirstUnprivilegedPort) {
  EXPECT_EQ(stepped_port(15000, 1), 15001);
  EXPECT_EQ(stepped_port(15000, 64), 15064);
  EXPECT_EQ(stepped_port(65535, 1), 1024);
  EXPECT_EQ(stepped_port(65530, 10), 1028);
  EXPECT_EQ(stepped_port(80, 1), 1025);  // a privileged port steps from 1024
  std::set<std::uint16_t> seen;
  for (unsigned step = 1; step <= 64; ++step) seen.insert(stepped_port(65500, step));
  EXPECT_EQ(seen.size(), 64u);
  EXPECT_EQ(seen.count(65500), 0u);
}

}  // namespace
}  // namespace dew
