// Topology files as users hand them to `dew topo --topology`: the real hwloc
// fixtures of tests/fixtures/topology (see SOURCES.md), NCCL topology XML,
// saved `nvidia-smi topo -m` text. Broken files: broken_files_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "dew/text.h"
#include "dew/topology.h"
#include "topology_fixtures.h"

namespace dew::topology {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::Contains;
using testing::fixture;
using testing::fixture_dir;
using testing::fixture_files;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::read;
using ::testing::StartsWith;

Topology load(const std::string& name) {
  auto topology = load_topology_file(fixture(name));
  EXPECT_TRUE(topology.ok()) << (topology.ok() ? "" : topology.error().message);
  return topology.ok() ? topology.value() : Topology{};
}

std::string cell(const Topology& t, std::size_t i, std::size_t j) {
  return path_class_label(t.path[i * t.size() + j], t.nvlinks[i * t.size() + j]);
}

// Matrices n x n, X exactly on the diagonal, classes and bandwidth symmetric,
// NV# exactly where links are: what every loaded topology must satisfy.
void expect_consistent(const Topology& t) {
  const std::size_t n = t.size();
  ASSERT_EQ(t.path.size(), n * n);
  ASSERT_EQ(t.nvlinks.size(), n * n);
  ASSERT_EQ(t.bandwidth_gbps.size(), n * n);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(t.gpus[i].index, static_cast<int>(i));
    for (std::size_t j = 0; j < n; ++j) {
      EXPECT_EQ(t.path[i * n + j] == PathClass::kSelf, i == j) << i << "," << j;
      EXPECT_EQ(t.path[i * n + j], t.path[j * n + i]) << i << "," << j;
      EXPECT_EQ(t.nvlinks[i * n + j], t.nvlinks[j * n + i]) << i << "," << j;
      EXPECT_EQ(t.path[i * n + j] == PathClass::kNVLink, t.nvlinks[i * n + j] > 0) << i << "," << j;
      EXPECT_DOUBLE_EQ(t.bandwidth_gbps[i * n + j], t.bandwidth_gbps[j * n + i]) << i << "," << j;
      EXPECT_GE(t.bandwidth_gbps[i * n + j], 0.0);
    }
  }
}

TEST(TopologyFixtures, EveryFixtureLoadsConsistently) {
  const std::vector<std::string> names = fixture_files();
  ASSERT_EQ(names.size(), 20u) << "fixtures missing from " << fixture_dir();
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    auto topology = load_topology_file(fixture(name));
    ASSERT_TRUE(topology.ok()) << topology.error().message;
    expect_consistent(topology.value());
    EXPECT_THAT(topology.value().source, HasSubstr("(" + name + ")"));
    EXPECT_FALSE(topology.value().granule.empty());
  }
}

TEST(TopologyFixtures, FormatIsDetectedFromTheContent) {
  for (const std::string& name : fixture_files()) {
    SCOPED_TRACE(name);
    const TopologyFormat expected = name.find(".nccl-topo.xml") != std::string::npos ? TopologyFormat::kNcclXml
                                    : name.find(".txt") != std::string::npos         ? TopologyFormat::kNvidiaSmiText
                                                                                     : TopologyFormat::kHwlocXml;
    EXPECT_EQ(detect_topology_format(read(fixture(name))), expected);
  }
  EXPECT_EQ(detect_topology_format(read(fixture("SOURCES.md"))), TopologyFormat::kUnknown);
  EXPECT_EQ(detect_topology_format("<?xml version=\"1.0\"?>\n<!-- c -->\n<html/>"), TopologyFormat::kUnknown);
  EXPECT_EQ(detect_topology_format("\xEF\xBB\xBF  <system version=\"1\"/>"), TopologyFormat::kNcclXml);
  EXPECT_EQ(detect_topology_format(""), TopologyFormat::kUnknown);
  EXPECT_EQ(format_name(TopologyFormat::kHwlocXml), "hwloc XML");
  EXPECT_EQ(format_name(TopologyFormat::kNvidiaSmiText), "nvidia-smi topo -m text");
}

TEST(TopologyFixtures, HwlocVersionIsNamed) {
  EXPECT_EQ(load("16amd64-4distances.v1.xml").source, "hwloc XML v1 (16amd64-4distances.v1.xml)");
  EXPECT_EQ(load("16amd64-4distances.xml").source, "hwloc XML v2 (16amd64-4distances.xml)");
}

TEST(TopologyFixtures, Dgx2HasSixteenGpusAllJoinedThroughNvswitchAtOneBandwidth) {
  Topology t = load("nvidiaDGX2.xml");
  ASSERT_EQ(t.size(), 16u);
  EXPECT_EQ(t.numa_nodes, 2);
  EXPECT_EQ(t.gpus[0].pci_bus_id, "0000:34:00.0");
  EXPECT_EQ(t.gpus[0].model, "Tesla V100-SXM3-32GB-H");
  EXPECT_EQ(t.gpus[0].numa_node, 0);
  EXPECT_EQ(t.gpus[15].numa_node, 1);
  // hwloc lists GPU-to-switch-port links only (1 link, 25 GB/s, to each of
  // the 6 switches of its board); through the switches every pair has 6.
  for (std::size_t i = 0; i < 16; ++i) {
    for (std::size_t j = 0; j < 16; ++j) {
      if (i == j) continue;
      EXPECT_EQ(cell(t, i, j), "NV6") << i << "," << j;
      EXPECT_DOUBLE_EQ(t.bandwidth_gbps[i * 16 + j], 150.0) << i << "," << j;
    }
  }
  EXPECT_TRUE(t.notes.empty()) << t.notes.front();
}

TEST(TopologyFixtures, Power8HasNvlinkPairsZeroOneAndTwoThree) {
  Topology t = load("power8gpudistances.xml");
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t.gpus[0].model, "Tesla P100-SXM2-16GB");
  EXPECT_EQ(cell(t, 0, 1), "NV2");  // 40000 MB/s = 2 NVLink 1 links of 20 GB/s
  EXPECT_EQ(cell(t, 2, 3), "NV2");
  EXPECT_DOUBLE_EQ(t.bandwidth_gbps[0 * 4 + 1], 40.0);
  for (auto [i, j] : {std::pair{0, 2}, {0, 3}, {1, 2}, {1, 3}}) {
    EXPECT_EQ(cell(t, i, j), "SYS") << i << "," << j;  // across the two sockets
    EXPECT_LT(t.bandwidth_gbps[i * 4 + j], t.bandwidth_gbps[0 * 4 + 1]);
  }
  EXPECT_EQ(t.gpus[0].cpu_affinity, "0-1,8-9,16-17,24-25");
}

TEST(TopologyFixtures, K40mBoxHasNoNvlinkOnlyPcieAndNumaClasses) {
  Topology t = load("32em64t-2n8c2t-pci-wholeio.xml");
  // Three NVIDIA 3D controllers; the one with a CUDA device is the K40m.
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t.gpus[0].pci_bus_id, "0000:03:00.0");
  EXPECT_EQ(t.gpus[2].pci_bus_id, "0000:84:00.0");
  EXPECT_EQ(t.gpus[2].model, "Tesla K40m");
  EXPECT_THAT(t.gpus[0].model, HasSubstr("M2075"));
  EXPECT_EQ(t.gpus[0].numa_node, 0);
  EXPECT_EQ(t.gpus[1].numa_node, 1);
  EXPECT_EQ(t.gpus[0].cpu_affinity, "0-7,16-23");
  for (int links : t.nvlinks) EXPECT_EQ(links, 0);
  EXPECT_EQ(cell(t, 0, 1), "SYS");
  EXPECT_EQ(cell(t, 0, 2), "SYS");
  EXPECT_EQ(cell(t, 1, 2), "PHB");  // two root ports of one host bridge
  EXPECT_EQ(t.numa_nodes, 2);
  EXPECT_THAT(t.notes, Contains("no NVLink data: PCIe/NUMA classes only"));
}

TEST(TopologyFixtures, P4dHasEightA100sAsPciDevicesAndSaysThereIsNoNvlinkData) {
  Topology t = load("aws-p4d-24xl.hwloc.xml");
  ASSERT_EQ(t.size(), 8u);
  for (const Gpu& gpu : t.gpus) EXPECT_THAT(gpu.model, HasSubstr("A100"));
  EXPECT_EQ(t.gpus[0].pci_bus_id, "0000:10:1c.0");
  for (int links : t.nvlinks) EXPECT_EQ(links, 0);
  EXPECT_EQ(cell(t, 0, 1), "PHB");   // one host bridge
  EXPECT_EQ(cell(t, 0, 2), "NODE");  // two host bridges of one socket
  EXPECT_EQ(cell(t, 0, 4), "SYS");
  EXPECT_EQ(cell(t, 6, 7), "PHB");
  EXPECT_EQ(t.numa_nodes, 2);
  EXPECT_THAT(t.notes, Contains("6 NVSwitch devices present but no NVLink data: PCIe/NUMA classes only"));
  // Gen4 x16 links: PHB > NODE > SYS.
  EXPECT_GT(t.bandwidth_gbps[1], t.bandwidth_gbps[2]);
  EXPECT_GT(t.bandwidth_gbps[2], t.bandwidth_gbps[4]);
}

TEST(TopologyFixtures, TeslaM20BoxFindsGpusAsPciDevicesOnly) {
  Topology t = load("24em64t-2n6c2t-pci.xml");
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(cell(t, 0, 1), "SYS");
  EXPECT_EQ(cell(t, 1, 2), "PHB");
}

TEST(TopologyFixtures, CpuOnlyFilesHaveNoGpusAndReportNuma) {
  const std::vector<std::pair<std::string, int>> files{{"16amd64-4distances.xml", 8},
                                                       {"16amd64-4distances.v1.xml", 8},
                                                       {"16amd64-8n2c-cpusets.xml", 5},
                                                       {"32em64t-2n8c2t-pci-noio.xml", 2},
                                                       {"8ia64-2n2s2c+1n.v1.xml", 3}};
  for (const auto& [name, numa] : files) {
    SCOPED_TRACE(name);
    Topology t = load(name);
    EXPECT_EQ(t.size(), 0u);
    EXPECT_TRUE(t.path.empty());
    EXPECT_EQ(t.numa_nodes, numa);
    EXPECT_THAT(t.notes, Contains("no NVIDIA GPU found"));
  }
}

TEST(TopologyFixtures, HostNameInTheFileNamesTheGranule) {
  EXPECT_EQ(load("power8gpudistances.xml").granule, "host:drac-12.grenoble.grid5000.fr");
  EXPECT_EQ(load("nvidiaDGX2.xml").granule, "file:nvidiaDGX2.xml");
}

// --- NCCL topology XML ---

TEST(NcclXml, Dgx1HybridCubeMeshHasItsNvlinkCounts) {
  Topology t = load("dgx1v.nccl-topo.xml");
  ASSERT_EQ(t.size(), 8u);
  EXPECT_EQ(t.source, "NCCL topology XML (dgx1v.nccl-topo.xml)");
  EXPECT_EQ(cell(t, 0, 1), "NV1");
  EXPECT_EQ(cell(t, 0, 3), "NV2");
  EXPECT_EQ(cell(t, 0, 4), "NV2");
  EXPECT_EQ(cell(t, 6, 7), "NV2");
  EXPECT_EQ(cell(t, 0, 5), "SYS");
  EXPECT_EQ(cell(t, 3, 4), "SYS");
  EXPECT_DOUBLE_EQ(t.bandwidth_gbps[0 * 8 + 3], 50.0);  // sm 70: 25 GB/s a link
  for (std::size_t g = 0; g < 8; ++g) {
    int links = 0;
    for (std::size_t h = 0; h < 8; ++h) links += t.nvlinks[g * 8 + h];
    EXPECT_EQ(links, 6) << "V100 has 6 NVLinks; GPU" << g;
  }
  EXPECT_EQ(t.gpus[0].cpu_affinity, "0-19,40-59");
  EXPECT_EQ(t.gpus[4].cpu_affinity, "20-39,60-79");
  EXPECT_EQ(t.gpus[4].numa_node, 1);
  EXPECT_EQ(t.numa_nodes, 2);
}

TEST(NcclXml, AgreesWithTheSameMachinesNvidiaSmiText) {
  Topology xml = load("dgx1v.nccl-topo.xml");
  Topology text = load("dgx1v.nvidia-smi-topo.txt");
  ASSERT_EQ(xml.size(), text.size());
  EXPECT_EQ(xml.path, text.path);
  EXPECT_EQ(xml.nvlinks, text.nvlinks);
}

TEST(NcclXml, SwitchesAndRootPortsGiveEveryPcieClass) {
  Topology t = load("pcie-workstation.nccl-topo.xml");
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(cell(t, 0, 1), "NV4");  // the 3090 bridge
  EXPECT_DOUBLE_EQ(t.bandwidth_gbps[1], 4 * 14.0625);
  EXPECT_EQ(cell(t, 2, 3), "PIX");  // one switch
  EXPECT_EQ(cell(t, 0, 2), "PXB");  // two levels of switches
  EXPECT_EQ(cell(t, 0, 4), "PHB");  // a GPU on a root port of the same CPU
  EXPECT_EQ(cell(t, 0, 5), "SYS");
  EXPECT_NEAR(t.bandwidth_gbps[2 * 6 + 3], 31.5, 0.01);  // Gen4 x16
  // The far GPU's Gen3 x8 link is the slower end.
  EXPECT_NEAR(t.bandwidth_gbps[0 * 6 + 5], 0.4 * 8 * 8 * 128.0 / 130.0 / 8, 0.01);
}

TEST(NcclXml, NvswitchLinksAreClosedOverTheFabric) {
  Topology t = load("dgx-h100.nccl-topo.xml");
  ASSERT_EQ(t.size(), 8u);
  for (std::size_t i = 0; i < 8; ++i) {
    for (std::size_t j = 0; j < 8; ++j) {
      if (i != j) {
        EXPECT_EQ(cell(t, i, j), "NV18") << i << "," << j;
      }
    }
  }
  EXPECT_DOUBLE_EQ(t.bandwidth_gbps[1], 450.0);
  EXPECT_EQ(t.granule, "host:0x6b3c1e2f9a8d7c45");
}

// --- nvidia-smi topo -m text ---

// Cloud images' files: GPUs are display-class PCI devices of NVIDIA's with no
// <gpu> child, inside a VM (numaid -1), with no NVLink data.
TEST(NcclXml, CloudFilesWithoutGpuElementsFindEveryGpu) {
  const Topology t = load("cloud-vm-8gpu.nccl-topo.xml");
  ASSERT_EQ(t.size(), 8u) << "the NIC and the other vendor's display device are not GPUs";
  expect_consistent(t);
  EXPECT_EQ(cell(t, 0, 1), "PIX");
  EXPECT_EQ(cell(t, 0, 2), "PHB");
  EXPECT_EQ(t.gpus[0].numa_node, std::nullopt);
  EXPECT_THAT(t.notes, Contains(HasSubstr("no NVLink data in the file")));
  EXPECT_THAT(t.notes, Not(Contains(HasSubstr("no NVIDIA GPU"))));
}

// The files cloud images ship for NCCL_TOPO_FILE give a GPU only its class
// (no vendor, no <gpu> child); NCCL reads any 0x03xxxx as a GPU, and so must
// Dew. The NICs (0x0207xx) are not GPUs; each NUMA node keeps its pair.
TEST(NcclXml, ClassOnlyDisplayControllersAreGpus) {
  const Topology t = load("cloud-8gpu-4numa-classonly.nccl-topo.xml");
  ASSERT_EQ(t.size(), 8u);
  expect_consistent(t);
  EXPECT_EQ(t.numa_nodes, 4);
  for (std::size_t i = 0; i < 8; ++i) EXPECT_EQ(t.gpus[i].numa_node, int(i / 2)) << i;
  EXPECT_EQ(t.gpus[0].pci_bus_id, "0001:00:00.0");
  EXPECT_EQ(cell(t, 0, 1), "PIX");
  EXPECT_EQ(cell(t, 0, 2), "SYS");
  EXPECT_THAT(t.notes, Contains(HasSubstr("no NVLink data in the file")));
}

// Only a vendor attribute naming another vendor keeps a display controller
// out: the same element with NVIDIA's vendor, with none, or with another's.
TEST(NcclXml, ADisplayControllerOfAnotherVendorIsNotAGpu) {
  auto count = [](const std::string& vendor) {
    const std::string xml =
        "<system version=\"1\"><cpu numaid=\"0\" affinity=\"ff\">"
        "<pci busid=\"0000:01:00.0\" class=\"0x030000\"" +
        vendor + "/></cpu></system>";
    auto loaded = parse_topology_text(xml, "inline.xml");
    return loaded.ok() ? loaded.value().size() : std::size_t(99);
  };
  EXPECT_EQ(count(""), 1u);
  EXPECT_EQ(count(" vendor=\"0x10DE\""), 1u);
  EXPECT_EQ(count(" vendor=\"0x1414\""), 0u) << "Microsoft's Hyper-V video device";
}

TEST(NcclXml, EveryDroppedNvlinkGetsANote) {
  const Topology t = load("odd-nvlinks.nccl-topo.xml");
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(cell(t, 0, 1), "NV4");
  EXPECT_THAT(t.notes, Contains(HasSubstr("dropped an NVLink of GPU 0000:21:00.0 to itself")));
  EXPECT_THAT(t.notes, Contains(HasSubstr("dropped an NVLink of GPU 0000:21:00.0 to 0000:99:00.0: no GPU with that "
                                          "bus id in the file")));
  EXPECT_THAT(t.notes, Contains(HasSubstr("dropped <nvlink target=\"0000:41:00.0\" count=\"lots\"> of GPU "
                                          "0000:21:00.0: the count must be 1 to 1024 links")));
  EXPECT_THAT(t.notes, Not(Contains(HasSubstr("no NVLink data"))));
}

TEST(NvidiaSmiText, Rtx3090BoxWithEscapesGivesClassesNvCountsAndAffinity) {
  Topology t = load("rtx3090-4gpu.nvidia-smi-topo.txt");
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(cell(t, 0, 1), "NV4");
  EXPECT_EQ(cell(t, 2, 3), "PHB");
  EXPECT_EQ(cell(t, 0, 2), "SYS");
  EXPECT_EQ(t.gpus[0].cpu_affinity, "0-11,24-35");
  EXPECT_EQ(t.gpus[2].cpu_affinity, "12-23,36-47");
  EXPECT_EQ(t.gpus[2].numa_node, 1);
  EXPECT_EQ(t.numa_nodes, 2);
  EXPECT_TRUE(t.gpus[0].pci_bus_id.empty());
  EXPECT_GT(t.bandwidth_gbps[0 * 4 + 1], t.bandwidth_gbps[2 * 4 + 3]);
  EXPECT_GT(t.bandwidth_gbps[2 * 4 + 3], t.bandwidth_gbps[0 * 4 + 2]);
  EXPECT_THAT(t.notes, Contains("NVLink generation unknown: 25 GB/s per link assumed"));
}

TEST(NvidiaSmiText, DgxA100WithNicRowsAndGpuNumaIdColumn) {
  Topology t = load("dgx-a100.nvidia-smi-topo.txt");
  ASSERT_EQ(t.size(), 8u);  // NIC rows and columns are not GPUs
  EXPECT_EQ(cell(t, 0, 7), "NV12");
  EXPECT_EQ(t.gpus[0].numa_node, 3);
  EXPECT_EQ(t.gpus[4].cpu_affinity, "112-127,240-255");
  EXPECT_EQ(t.numa_nodes, 4);
}

TEST(NvidiaSmiText, OlderDriverWithSpacesAndMlxColumns) {
  Topology t = load("dgx1v.nvidia-smi-topo.txt");
  ASSERT_EQ(t.size(), 8u);
  EXPECT_EQ(cell(t, 1, 5), "NV2");
  EXPECT_EQ(t.gpus[7].cpu_affinity, "20-39,60-79");
  EXPECT_EQ(t.gpus[7].numa_node, std::nullopt);
  EXPECT_THAT(t.notes, Contains("no NUMA Affinity column (an older driver): NUMA nodes unknown"));
}

TEST(NvidiaSmiText, SocIsTheOldNameOfSys) {
  auto t = parse_topology_text("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSOC\t0-7\nGPU1\tSOC\t X \t8-15\n", "old.txt");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t.value().path[1], PathClass::kSYS);
}

// The text as people paste it: after the prompt that ran it, inside a
// Markdown code block whose closing fence follows the last row, behind # on
// every line (from a script's comments), behind > (a quoted reply), with the
// legend right after the rows.
TEST(NvidiaSmiText, AScriptsLoggedPasteReadsAsTheMachine) {
  const Topology pasted = load("pasted-in-comments.nvidia-smi-topo.txt");
  const Topology plain = load("dgx1v.nvidia-smi-topo.txt");
  ASSERT_EQ(pasted.size(), 8u);
  EXPECT_EQ(pasted.path, plain.path);
  EXPECT_EQ(pasted.nvlinks, plain.nvlinks);
  EXPECT_EQ(cell(pasted, 0, 3), cell(plain, 0, 3));
}

TEST(NvidiaSmiText, PastesWithPromptsFencesCommentMarkersAndLegends) {
  const std::string text = read(fixture("dgx1v.nvidia-smi-topo.txt"));
  auto plain = parse_topology_text(text, "plain.txt");
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  std::string matrix;  // the header and rows only, without the blank line and legend
  for (const auto& line : split(text, '\n')) {
    if (line.find("Legend") != std::string::npos) break;
    if (!line.empty()) matrix += line + "\n";
  }
  const auto each_line = [](const std::string& body, const std::string& prefix) {
    std::string out;
    for (const auto& line : split(body, '\n')) out += prefix + line + "\n";
    return out;
  };
  const std::vector<std::pair<std::string, std::string>> pastes = {
      {"fence", "$ nvidia-smi topo -m\n```\n" + matrix + "```\n"},
      {"fence with language", "```text\n" + matrix + "```\nmore text after it\n"},
      {"hash", each_line(text, "# ")},
      {"hash, no space", each_line(matrix, "#")},
      {"quote", each_line(matrix, "> ")},
      {"legend at once", matrix + "Legend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe\n"},
      {"prompt", "user@dgx:~$ nvidia-smi topo -m\n" + matrix},
  };
  for (const auto& [what, paste] : pastes) {
    SCOPED_TRACE(what);
    EXPECT_EQ(detect_topology_format(paste), TopologyFormat::kNvidiaSmiText);
    auto t = parse_topology_text(paste, "paste.txt");
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(t.value().path, plain.value().path);
    EXPECT_EQ(t.value().nvlinks, plain.value().nvlinks);
  }
}

}  // namespace
}  // namespace dew::topology
