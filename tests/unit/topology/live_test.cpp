// detect_topology() on the machine the tests run on: a topology, never a
// crash, with the host's boot id as the granule (or the NVLink fabric's).
// Where NVML cannot be loaded (no NVIDIA driver, as on the build machines) a
// note says so; where it works, every GPU NVML sees is in the topology.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "dew/nvml.h"
#include "dew/topology.h"

namespace dew::topology {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
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
  const NvmlReport nvml = read_nvml();
  if (nvml.available) GTEST_SKIP() << "NVML works on this machine (" << nvml.gpus.size() << " GPUs): see WithNvml";
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

TEST(DetectTopology, WithNvmlEveryGpuItSeesIsThere) {
  const NvmlReport nvml = read_nvml();
  if (!nvml.available) GTEST_SKIP() << "no NVML on this machine (" << nvml.problem << "): see WithoutNvml";
  auto topology = detect_topology();
  ASSERT_TRUE(topology.ok()) << topology.error().message;
  const Topology& t = topology.value();
  EXPECT_THAT(t.source, HasSubstr("NVML"));
  for (const NvmlGpu& gpu : nvml.gpus) {
    EXPECT_TRUE(std::any_of(t.gpus.begin(), t.gpus.end(), [&](const Gpu& g) { return g.pci_bus_id == gpu.pci_bus_id; }))
        << gpu.pci_bus_id;
  }
  EXPECT_THAT(t.granule, AnyOf(StartsWith("host:"), HasSubstr("/")));
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
