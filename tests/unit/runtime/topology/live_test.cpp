// detect_topology() on the machine the tests run on. The build machines
// have no GPU and no NVIDIA driver: the answer is a topology (zero or more
// GPUs, from hwloc's PCI scan), never a crash, with a note that NVML is
// unavailable and the host's boot id as the granule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "dew/topology.h"

namespace dew::topology {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

TEST(DetectTopology, WithoutNvmlSaysSoAndUsesTheHostAsGranule) {
  auto topology = detect_topology();
  ASSERT_TRUE(topology.ok()) << topology.error().message;
  const Topology& t = topology.value();
  EXPECT_THAT(t.source, StartsWith("live: hwloc"));
  EXPECT_GE(t.numa_nodes, 1);
  EXPECT_EQ(t.path.size(), t.size() * t.size());
  EXPECT_EQ(t.bandwidth_gbps.size(), t.size() * t.size());
  EXPECT_THAT(t.notes, Contains(AllOf(StartsWith("NVML unavailable ("), HasSubstr("libnvidia-ml.so.1"),
                                      HasSubstr("no NVLink data: PCIe/NUMA classes only"))));
  ASSERT_FALSE(boot_id().empty());
  EXPECT_EQ(t.granule, "host:" + boot_id());
}

TEST(DetectTopology, TwoCallsAgree) {
  auto first = detect_topology();
  auto second = detect_topology();
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first.value().size(), second.value().size());
  EXPECT_EQ(first.value().path, second.value().path);
  EXPECT_EQ(first.value().granule, second.value().granule);
}

}  // namespace
}  // namespace dew::topology
