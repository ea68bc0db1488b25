// detect_topology() through a real dlopen of libnvidia-ml.so.1, here the
// stand-in fake_nvml.cpp that meson puts first on LD_LIBRARY_PATH (the
// machines the tests run on have no NVIDIA driver). hwloc finds none of
// these GPUs on this machine, so they come from NVML alone.
#include "dew/nvml.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "dew/topology.h"

namespace dew::topology {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

std::string cell(const Topology& t, std::size_t i, std::size_t j) {
  return path_class_label(t.path[i * t.size() + j], t.nvlinks[i * t.size() + j]);
}

class FakeNvml : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv("FAKE_NVML_MODE"); }
};

TEST_F(FakeNvml, ReadsEveryGpuAndItsLinks) {
  setenv("FAKE_NVML_MODE", "pairs", 1);
  NvmlReport report = read_nvml();
  ASSERT_TRUE(report.available) << report.problem;
  ASSERT_EQ(report.gpus.size(), 4u);
  EXPECT_EQ(report.gpus[0].pci_bus_id, "0000:1a:00.0");
  EXPECT_EQ(report.gpus[0].model, "NVIDIA A100-SXM4-80GB");
  EXPECT_EQ(report.gpus[0].sm, 80);
  EXPECT_EQ(report.gpus[2].uuid, "GPU-00000002-aaaa-bbbb-cccc-dddddddddddd");
  ASSERT_EQ(report.gpus[0].links.size(), 1u);
  EXPECT_EQ(report.gpus[0].links[0].remote_bus_id, "0000:1b:00.0");
  EXPECT_EQ(report.gpus[0].links[0].links, 4);
  EXPECT_TRUE(report.gpus[0].fabric.empty());
}

TEST_F(FakeNvml, NvlinkPairsBecomeNv4AndTheHostStaysTheGranule) {
  setenv("FAKE_NVML_MODE", "pairs", 1);
  auto topology = detect_topology();
  ASSERT_TRUE(topology.ok()) << topology.error().message;
  const Topology& t = topology.value();
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t.source, "live: hwloc + NVML");
  EXPECT_EQ(cell(t, 0, 1), "NV4");
  EXPECT_EQ(cell(t, 2, 3), "NV4");
  EXPECT_EQ(cell(t, 0, 2), "?");  // NVML alone does not place a GPU on PCIe
  EXPECT_DOUBLE_EQ(t.bandwidth_gbps[1], 100.0);
  EXPECT_EQ(t.gpus[3].uuid, "GPU-00000003-aaaa-bbbb-cccc-dddddddddddd") << "what CUDA_VISIBLE_DEVICES may name";
  EXPECT_THAT(t.granule, ::testing::StartsWith("host:"));
  EXPECT_THAT(t.notes, Contains(HasSubstr("is seen by NVML but not by hwloc")));
}

TEST_F(FakeNvml, SwitchFabricJoinsEveryPairAndNamesTheGranule) {
  setenv("FAKE_NVML_MODE", "switch", 1);
  auto topology = detect_topology();
  ASSERT_TRUE(topology.ok()) << topology.error().message;
  const Topology& t = topology.value();
  ASSERT_EQ(t.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    for (std::size_t j = 0; j < 4; ++j) {
      if (i != j) {
        EXPECT_EQ(cell(t, i, j), "NV18");
      }
    }
  }
  EXPECT_DOUBLE_EQ(t.bandwidth_gbps[1], 450.0);
  EXPECT_EQ(t.granule, "a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf/7");
}

TEST_F(FakeNvml, ADriverThatIsNotLoadedIsANoteNotAnError) {
  setenv("FAKE_NVML_MODE", "nodriver", 1);
  auto topology = detect_topology();
  ASSERT_TRUE(topology.ok()) << topology.error().message;
  EXPECT_THAT(topology.value().notes, Contains("NVML unavailable (nvmlInit failed: Driver Not Loaded): "
                                               "no NVLink data: PCIe/NUMA classes only"));
}

}  // namespace
}  // namespace dew::topology
