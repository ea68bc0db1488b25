// The pure rules every topology source shares: PCIe path classes, the
// NVLink closure through NVSwitches, bandwidth estimates, the small parsers,
// and merging what NVML says into what hwloc saw.
#include "build.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dew/nvml.h"
#include "dew/topology.h"

namespace dew::topology::detail {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

PciPlace place(std::string root, std::vector<std::string> switches, std::optional<int> numa) {
  return PciPlace{std::move(root), std::move(switches), numa};
}

TEST(PciePathClass, OneSharedSwitchIsPix) {
  EXPECT_EQ(pcie_path_class(place("hb0", {"sw1"}, 0), place("hb0", {"sw1"}, 0), false), PathClass::kPIX);
}

TEST(PciePathClass, SwitchesBelowTheSharedOneArePxb) {
  EXPECT_EQ(pcie_path_class(place("hb0", {"sw1", "sw2"}, 0), place("hb0", {"sw1", "sw3"}, 0), false), PathClass::kPXB);
  EXPECT_EQ(pcie_path_class(place("hb0", {"sw1", "sw2"}, 0), place("hb0", {"sw1"}, 0), false), PathClass::kPXB);
}

TEST(PciePathClass, SameHostBridgeWithoutSharedSwitchIsPhb) {
  EXPECT_EQ(pcie_path_class(place("hb0", {}, 0), place("hb0", {}, 0), false), PathClass::kPHB);
  EXPECT_EQ(pcie_path_class(place("hb0", {"sw1"}, 0), place("hb0", {"sw2"}, 0), false), PathClass::kPHB);
}

TEST(PciePathClass, HostBridgesOfOneNumaNodeAreNodeAndOfTwoAreSys) {
  EXPECT_EQ(pcie_path_class(place("hb0", {}, 0), place("hb1", {}, 0), false), PathClass::kNODE);
  EXPECT_EQ(pcie_path_class(place("hb0", {}, 0), place("hb1", {}, 1), false), PathClass::kSYS);
}

TEST(PciePathClass, UnknownNumaNodesAreNodeOnlyOnASingleNodeMachine) {
  EXPECT_EQ(pcie_path_class(place("hb0", {}, std::nullopt), place("hb1", {}, std::nullopt), true), PathClass::kNODE);
  EXPECT_EQ(pcie_path_class(place("hb0", {}, std::nullopt), place("hb1", {}, std::nullopt), false), PathClass::kSYS);
}

GpuSite site(std::string bus_id, double per_link = 25.0) {
  GpuSite s;
  s.gpu.pci_bus_id = std::move(bus_id);
  s.nvlink_gbps_per_link = per_link;
  return s;
}

NvLinkBundle to_gpu(std::string from, std::string to, int links) {
  return NvLinkBundle{std::move(from), std::move(to), false, links, 0};
}

NvLinkBundle to_switch(std::string from, std::string sw, int links) {
  return NvLinkBundle{std::move(from), std::move(sw), true, links, 0};
}

TEST(NvlinkMatrix, ABundleReportedFromBothEndsCountsOnce) {
  std::vector<GpuSite> gpus{site("a"), site("b")};
  NvLinkMatrix m = nvlink_matrix(gpus, {to_gpu("a", "b", 4), to_gpu("b", "a", 4)}, 25.0);
  EXPECT_THAT(m.links, ElementsAre(0, 4, 4, 0));
  EXPECT_THAT(m.gbps, ElementsAre(0, 100.0, 100.0, 0));
  EXPECT_FALSE(m.guessed_rate);
}

TEST(NvlinkMatrix, ABundleReportedFromOneEndStillJoinsBoth) {
  std::vector<GpuSite> gpus{site("a"), site("b")};
  NvLinkMatrix m = nvlink_matrix(gpus, {to_gpu("a", "b", 2)}, 25.0);
  EXPECT_THAT(m.links, ElementsAre(0, 2, 2, 0));
}

TEST(NvlinkMatrix, SwitchesJoinEveryPairAtTheSmallerSide) {
  // Three GPUs on the switch fabric with 6, 6 and 4 links: the closure.
  std::vector<GpuSite> gpus{site("a"), site("b"), site("c")};
  std::vector<NvLinkBundle> bundles;
  for (const char* sw : {"s1", "s2", "s3", "s4", "s5", "s6"}) {
    bundles.push_back(to_switch("a", sw, 1));
    bundles.push_back(to_switch("b", sw, 1));
  }
  for (const char* sw : {"s1", "s2", "s3", "s4"}) bundles.push_back(to_switch("c", sw, 1));
  NvLinkMatrix m = nvlink_matrix(gpus, bundles, 25.0);
  EXPECT_THAT(m.links, ElementsAre(0, 6, 4, 6, 0, 4, 4, 4, 0));
  EXPECT_DOUBLE_EQ(m.gbps[0 * 3 + 1], 150.0);
  EXPECT_DOUBLE_EQ(m.gbps[0 * 3 + 2], 100.0);
}

TEST(NvlinkMatrix, DirectLinksAddToSwitchLinks) {
  std::vector<GpuSite> gpus{site("a"), site("b")};
  NvLinkMatrix m = nvlink_matrix(gpus, {to_gpu("a", "b", 2), to_switch("a", "s", 3), to_switch("b", "s", 3)}, 25.0);
  EXPECT_EQ(m.links[1], 5);
  EXPECT_DOUBLE_EQ(m.gbps[1], 125.0);
}

TEST(NvlinkMatrix, BundlesOfUnknownGpusAndSelfLoopsAreIgnored) {
  std::vector<GpuSite> gpus{site("a"), site("b")};
  NvLinkMatrix m = nvlink_matrix(gpus, {to_gpu("x", "b", 2), to_gpu("a", "a", 2), to_gpu("a", "y", 2)}, 25.0);
  EXPECT_THAT(m.links, ElementsAre(0, 0, 0, 0));
}

TEST(NvlinkMatrix, UnknownRateFallsBackAndSaysSo) {
  std::vector<GpuSite> gpus{site("a", 0), site("b", 0)};
  NvLinkMatrix m = nvlink_matrix(gpus, {to_gpu("a", "b", 2)}, 25.0);
  EXPECT_DOUBLE_EQ(m.gbps[1], 50.0);
  EXPECT_TRUE(m.guessed_rate);
}

TEST(NvlinkRate, ComputeCapabilityNamesTheGeneration) {
  EXPECT_DOUBLE_EQ(nvlink_gbps_per_link("", 60), 20.0);
  EXPECT_DOUBLE_EQ(nvlink_gbps_per_link("", 70), 25.0);
  EXPECT_DOUBLE_EQ(nvlink_gbps_per_link("", 86), 14.0625);
  EXPECT_DOUBLE_EQ(nvlink_gbps_per_link("", 100), 50.0);
  EXPECT_DOUBLE_EQ(nvlink_gbps_per_link("", 0), 0.0);
}

TEST(NvlinkRate, ModelNamesTheGenerationAndA10IsNotA100) {
  EXPECT_DOUBLE_EQ(nvlink_gbps_per_link("Tesla P100-SXM2-16GB", 0), 20.0);
  EXPECT_DOUBLE_EQ(nvlink_gbps_per_link("NVIDIA A100-SXM4-40GB", 0), 25.0);
  EXPECT_DOUBLE_EQ(nvlink_gbps_per_link("NVIDIA GeForce RTX 3090", 0), 14.0625);
  EXPECT_DOUBLE_EQ(nvlink_gbps_per_link("NVIDIA A10", 0), 0.0);
  EXPECT_DOUBLE_EQ(nvlink_gbps_per_link("Tesla K40m", 0), 0.0);
}

TEST(PcieLink, EncodingDependsOnTheGeneration) {
  EXPECT_NEAR(pcie_link_gbps(8.0, 16), 15.75, 0.01);
  EXPECT_NEAR(pcie_link_gbps(16.0, 16), 31.51, 0.01);
  EXPECT_NEAR(pcie_link_gbps(2.5, 16), 4.0, 0.001);
  EXPECT_EQ(pcie_link_gbps(0, 16), 0.0);
  EXPECT_EQ(pcie_link_gbps(8.0, 0), 0.0);
}

TEST(PcieBandwidth, FartherIsSlower) {
  const double link = 15.75;
  EXPECT_GT(pcie_bandwidth_gbps(PathClass::kPIX, link), pcie_bandwidth_gbps(PathClass::kPXB, link));
  EXPECT_GT(pcie_bandwidth_gbps(PathClass::kPXB, link), pcie_bandwidth_gbps(PathClass::kPHB, link));
  EXPECT_GT(pcie_bandwidth_gbps(PathClass::kPHB, link), pcie_bandwidth_gbps(PathClass::kNODE, link));
  EXPECT_GT(pcie_bandwidth_gbps(PathClass::kNODE, link), pcie_bandwidth_gbps(PathClass::kSYS, link));
  EXPECT_NEAR(pcie_bandwidth_gbps(PathClass::kSYS, link), 6.3, 0.001);  // measured across sockets, Gen3 x16
}

TEST(CpuMask, LinuxMaskBecomesAList) {
  EXPECT_EQ(cpumask_to_list("0000ffff,0000ffff").value(), "0-15,32-47");
  EXPECT_EQ(cpumask_to_list("00000000,0fffff00,000fffff").value(), "0-19,40-59");
  EXPECT_EQ(cpumask_to_list("00000005").value(), "0,2");
  EXPECT_EQ(cpumask_to_list("0x3,,0x0").value(), "64-65");  // hwloc writes zero words as nothing
  EXPECT_EQ(cpumask_to_list("0").value(), "");
}

TEST(CpuMask, NonHexIsAnErrorNamingTheMask) {
  auto list = cpumask_to_list("0000ffzz");
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(list.error().message,
            "cpu mask '0000ffzz' is not allowed; allowed: comma-separated words of up to 8 hex digits");
  EXPECT_FALSE(cpumask_to_list("123456789").ok());  // 9 digits: not a 32-bit word
}

TEST(PciBusId, NormalizedToNvidiaSmiForm) {
  EXPECT_EQ(normalize_pci_bus_id("00000000:07:00.0"), "0000:07:00.0");
  EXPECT_EQ(normalize_pci_bus_id("0000:C3:00.0"), "0000:c3:00.0");
  EXPECT_EQ(normalize_pci_bus_id("07:00.0"), "0000:07:00.0");
  EXPECT_EQ(normalize_pci_bus_id("0002:01:00"), "0002:01:00.0");
  EXPECT_EQ(normalize_pci_bus_id("fffffff:ffff:ff"), std::nullopt);
  EXPECT_EQ(normalize_pci_bus_id("0000:07:20.0"), std::nullopt);  // device numbers stop at 0x1f
  EXPECT_EQ(normalize_pci_bus_id("gpu0"), std::nullopt);
}

TEST(PathClassLabel, AsNvidiaSmiPrintsIt) {
  EXPECT_EQ(path_class_label(PathClass::kSelf, 0), "X");
  EXPECT_EQ(path_class_label(PathClass::kNVLink, 12), "NV12");
  EXPECT_EQ(path_class_label(PathClass::kPIX, 0), "PIX");
  EXPECT_EQ(path_class_label(PathClass::kPXB, 0), "PXB");
  EXPECT_EQ(path_class_label(PathClass::kPHB, 0), "PHB");
  EXPECT_EQ(path_class_label(PathClass::kNODE, 0), "NODE");
  EXPECT_EQ(path_class_label(PathClass::kSYS, 0), "SYS");
  EXPECT_EQ(path_class_label(PathClass::kUnknown, 0), "?");
}

GpuSite placed(std::string bus_id, PciPlace where, double pcie = 31.5) {
  GpuSite s = site(std::move(bus_id));
  s.place = std::move(where);
  s.pcie_gbps = pcie;
  return s;
}

TEST(Assemble, OrdersByBusIdAndFillsEveryMatrix) {
  Draft draft;
  draft.numa_nodes = 2;
  draft.gpus = {placed("0000:81:00.0", place("hb1", {}, 1)), placed("0000:07:00.0", place("hb0", {"s"}, 0)),
                placed("0000:08:00.0", place("hb0", {"s"}, 0))};
  draft.nvlinks = {to_gpu("0000:07:00.0", "0000:08:00.0", 4)};
  Topology t = assemble(draft);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t.gpus[0].pci_bus_id, "0000:07:00.0");
  EXPECT_EQ(t.gpus[2].pci_bus_id, "0000:81:00.0");
  EXPECT_EQ(t.gpus[2].index, 2);
  EXPECT_THAT(t.path, ElementsAre(PathClass::kSelf, PathClass::kNVLink, PathClass::kSYS,  //
                                  PathClass::kNVLink, PathClass::kSelf, PathClass::kSYS,  //
                                  PathClass::kSYS, PathClass::kSYS, PathClass::kSelf));
  EXPECT_THAT(t.nvlinks, ElementsAre(0, 4, 0, 4, 0, 0, 0, 0, 0));
  EXPECT_DOUBLE_EQ(t.bandwidth_gbps[1], 100.0);
  EXPECT_NEAR(t.bandwidth_gbps[2], 0.4 * 31.5, 1e-9);
  EXPECT_EQ(t.bandwidth_gbps[0], 0.0);
  EXPECT_TRUE(t.notes.empty());
}

TEST(Assemble, UnplacedGpusHaveNoClassAndANote) {
  Draft draft;
  draft.gpus = {site("0000:07:00.0"), site("0000:08:00.0")};
  Topology t = assemble(draft);
  EXPECT_EQ(t.path[1], PathClass::kUnknown);
  EXPECT_EQ(t.bandwidth_gbps[1], 0.0);
  EXPECT_THAT(t.notes, ElementsAre(HasSubstr("no path class")));
}

TEST(Assemble, UnknownLinkSpeedIsAssumedAndSaid) {
  Draft draft;
  draft.gpus = {placed("0000:07:00.0", place("hb0", {}, 0), 0), placed("0000:08:00.0", place("hb0", {}, 0), 0)};
  Topology t = assemble(draft);
  EXPECT_EQ(t.path[1], PathClass::kPHB);
  EXPECT_NEAR(t.bandwidth_gbps[1], 0.7 * kDefaultPcieGbps, 1e-9);
  EXPECT_THAT(t.notes, ElementsAre("PCIe link speed unknown: Gen3 x16 (15.75 GB/s) assumed"));
}

TEST(Assemble, NotesAreSaidOnce) {
  Draft draft;
  draft.notes = {"no NVLink data: PCIe/NUMA classes only", "no NVLink data: PCIe/NUMA classes only"};
  Topology t = assemble(draft);
  EXPECT_THAT(t.notes, ElementsAre("no NVLink data: PCIe/NUMA classes only"));
}

TEST(SmiWords, EscapesAndTheirRemainsAreDropped) {
  EXPECT_THAT(smi_words("\t\x1b[4mGPU0\tGPU1\tCPU Affinity\x1b[0m"), ElementsAre("GPU0", "GPU1", "CPU", "Affinity"));
  EXPECT_THAT(smi_words("[4mGPU0  GPU1[0m"), ElementsAre("GPU0", "GPU1"));
  EXPECT_THAT(smi_words("GPU0\t X \tNV4\r"), ElementsAre("GPU0", "X", "NV4"));
}

// --- NVML merged into a live draft (the dlopen itself: topology_nvml_test) ---

Draft live_draft() {
  Draft draft;
  draft.source = "live: hwloc";
  draft.numa_nodes = 1;
  for (const char* id : {"0000:1a:00.0", "0000:1b:00.0", "0000:1c:00.0", "0000:1d:00.0"}) {
    draft.gpus.push_back(placed(id, place("hb0", {}, 0)));
    draft.gpus.back().nvlink_gbps_per_link = 0;
  }
  return draft;
}

NvmlGpu nvml_gpu(std::string id, std::vector<NvmlLinks> links, std::string fabric = "") {
  return NvmlGpu{std::move(id), "NVIDIA A100-SXM4-80GB", 80, std::move(links), std::move(fabric), ""};
}

TEST(MergeNvml, WithoutNvmlTheNoteSaysWhyAndTheHostIsTheGranule) {
  Draft draft = live_draft();
  merge_nvml(draft, NvmlReport{false, "libnvidia-ml.so.1: cannot open shared object file", {}}, "b00t");
  EXPECT_EQ(draft.granule, "host:b00t");
  EXPECT_THAT(draft.notes, ElementsAre("NVML unavailable (libnvidia-ml.so.1: cannot open shared object file): "
                                       "no NVLink data: PCIe/NUMA classes only"));
  Topology t = assemble(draft);
  EXPECT_EQ(t.path[1], PathClass::kPHB);
}

TEST(MergeNvml, GpuPairsAndModelsComeFromNvml) {
  Draft draft = live_draft();
  NvmlReport report{true, "", {}};
  report.gpus = {nvml_gpu("0000:1a:00.0", {{"0000:1b:00.0", true, NvmlPeer::kUnknown, 4}}),
                 nvml_gpu("0000:1b:00.0", {{"0000:1a:00.0", true, NvmlPeer::kGpu, 4}}),
                 nvml_gpu("0000:1c:00.0", {{"0000:1d:00.0", true, NvmlPeer::kUnknown, 4}}),
                 nvml_gpu("0000:1d:00.0", {{"0000:1c:00.0", true, NvmlPeer::kUnknown, 4}})};
  merge_nvml(draft, report, "b00t");
  Topology t = assemble(draft);
  EXPECT_EQ(t.source, "live: hwloc + NVML");
  EXPECT_EQ(t.gpus[0].model, "NVIDIA A100-SXM4-80GB");
  EXPECT_EQ(path_class_label(t.path[0 * 4 + 1], t.nvlinks[1]), "NV4");
  EXPECT_EQ(path_class_label(t.path[2 * 4 + 3], t.nvlinks[2 * 4 + 3]), "NV4");
  EXPECT_EQ(t.path[0 * 4 + 2], PathClass::kPHB);
  EXPECT_DOUBLE_EQ(t.bandwidth_gbps[1], 100.0);  // A100: 25 GB/s a link
  EXPECT_EQ(t.granule, "host:b00t");
  EXPECT_TRUE(t.notes.empty());
}

TEST(MergeNvml, SwitchLinksCloseOverTheFabricAndTheCliqueIsTheGranule) {
  Draft draft = live_draft();
  NvmlReport report{true, "", {}};
  for (const GpuSite& s : draft.gpus) {
    std::vector<NvmlLinks> links;
    for (const char* sw : {"0000:c0:00.0", "0000:c1:00.0", "0000:c2:00.0"}) {
      links.push_back({sw, true, NvmlPeer::kUnknown, 4});  // NVIDIA, not a GPU: a switch
    }
    links.push_back({"0000:00:00.0", false, NvmlPeer::kUnknown, 2});  // not NVIDIA: a CPU, ignored
    report.gpus.push_back(nvml_gpu(s.gpu.pci_bus_id, links, "9c1f-uuid/7"));
  }
  merge_nvml(draft, report, "b00t");
  Topology t = assemble(draft);
  for (std::size_t i = 0; i < 4; ++i) {
    for (std::size_t j = 0; j < 4; ++j) {
      if (i != j) {
        EXPECT_EQ(path_class_label(t.path[i * 4 + j], t.nvlinks[i * 4 + j]), "NV12");
      }
    }
  }
  EXPECT_EQ(t.granule, "9c1f-uuid/7");
}

TEST(MergeNvml, AGpuHwlocMissedIsKeptWithoutAPlace) {
  Draft draft = live_draft();
  NvmlReport report{true, "", {nvml_gpu("0000:99:00.0", {})}};
  merge_nvml(draft, report, "b00t");
  Topology t = assemble(draft);
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(t.gpus[4].pci_bus_id, "0000:99:00.0");
  EXPECT_EQ(t.path[0 * 5 + 4], PathClass::kUnknown);
  EXPECT_THAT(t.notes, ::testing::Contains("GPU 0000:99:00.0 is seen by NVML but not by hwloc: its PCIe place is "
                                           "unknown"));
}

TEST(MergeNvml, GpusInSeveralCliquesTakeTheFirstAndSaySo) {
  Draft draft = live_draft();
  NvmlReport report{true, "", {nvml_gpu("0000:1a:00.0", {}, "u/2"), nvml_gpu("0000:1b:00.0", {}, "u/1")}};
  merge_nvml(draft, report, "b00t");
  EXPECT_EQ(draft.granule, "u/1");
  EXPECT_THAT(draft.notes, ElementsAre(HasSubstr("2 NVLink cliques")));
}

}  // namespace
}  // namespace dew::topology::detail
