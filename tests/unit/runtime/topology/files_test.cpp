// Topology files as users hand them to `dew topo --topology`: the real hwloc
// fixtures of tests/fixtures/topology (see SOURCES.md), NCCL topology XML,
// saved `nvidia-smi topo -m` text, and broken files of each kind.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dew/topology.h"

namespace dew::topology {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string fixture_dir() {
  const char* root = std::getenv("DEW_FIXTURES");
  return std::string(root != nullptr ? root : "tests/fixtures") + "/topology";
}

std::string fixture(const std::string& name) { return fixture_dir() + "/" + name; }

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

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

std::vector<std::string> fixture_files() {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(fixture_dir())) {
    const std::string name = entry.path().filename().string();
    if (name != "SOURCES.md") names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(TopologyFixtures, EveryFixtureLoadsConsistently) {
  const std::vector<std::string> names = fixture_files();
  ASSERT_EQ(names.size(), 16u) << "fixtures missing from " << fixture_dir();
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
                                    : name.find(".txt") != std::string::npos ? TopologyFormat::kNvidiaSmiText
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

// --- Broken files: one line naming the file and the problem ---

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dew-topology-test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  fs::path dir_;
};

using BrokenFiles = TempDir;

void expect_one_line_error(const Result<Topology>& result, const std::string& path) {
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.error().message, StartsWith(path + ": "));
  EXPECT_EQ(result.error().message.find('\n'), std::string::npos) << result.error().message;
}

TEST_F(BrokenFiles, EveryXmlFixtureCutShortIsATruncationError) {
  for (const std::string& name : fixture_files()) {
    if (name.find(".xml") == std::string::npos) continue;
    SCOPED_TRACE(name);
    const std::string content = read(fixture(name));
    for (std::size_t keep : {content.size() / 2, content.size() - 20}) {
      const std::string path = write("cut-" + name, content.substr(0, keep));
      auto result = load_topology_file(path);
      expect_one_line_error(result, path);
      EXPECT_THAT(result.error().message, HasSubstr("truncated XML"));
    }
  }
}

TEST_F(BrokenFiles, MalformedXmlSaysWhere) {
  const std::string path = write("bad.xml", "<topology version=\"2.0\"><object type=\"Machine\"></topology>");
  auto result = load_topology_file(path);
  expect_one_line_error(result, path);
  EXPECT_THAT(result.error().message, AllOf(HasSubstr("malformed XML at byte"), HasSubstr("mismatch")));
}

TEST_F(BrokenFiles, WellFormedXmlThatHwlocRejects) {
  const std::string path = write("odd.xml", "<topology version=\"2.0\"><object type=\"Bogus\"/></topology>");
  auto result = load_topology_file(path);
  expect_one_line_error(result, path);
  EXPECT_THAT(result.error().message, HasSubstr("hwloc rejected it"));
}

TEST_F(BrokenFiles, AFileThatCrashesHwlocIsAnErrorHere) {
  // hwloc 2.9 dereferences the complete_cpuset of a Package that has a
  // cpuset but no complete_cpuset (found by topology_loaders_fuzz).
  std::string content = read(fixture("16amd64-4distances.xml"));
  const std::string attribute = "complete_cpuset=\"0x00000003\"";
  ASSERT_NE(content.find(attribute), std::string::npos);
  content.replace(content.find(attribute), attribute.size(), "completX_cpuset=\"0x00000003\"");
  const std::string path = write("crashes-hwloc.xml", content);
  auto result = load_topology_file(path);
  expect_one_line_error(result, path);
  EXPECT_THAT(result.error().message, HasSubstr("hwloc crashed reading it (Segmentation fault)"));
}

TEST_F(BrokenFiles, APuWithoutOsIndexIsRefusedBeforeHwlocSpendsSecondsOnIt) {
  std::string content = read(fixture("16amd64-8n2c-cpusets.xml"));
  const std::size_t pu = content.find("type=\"PU\" os_index=");
  ASSERT_NE(pu, std::string::npos);
  content.replace(pu, std::string("type=\"PU\" os_index=").size(), "type=\"PU\" no_index=");
  const std::string path = write("pu.xml", content);
  auto result = load_topology_file(path);
  expect_one_line_error(result, path);
  EXPECT_THAT(result.error().message,
              HasSubstr("<object type=\"PU\" os_index=\"\"> is not allowed; allowed: an os_index from 0 to 1048575"));
}

TEST_F(BrokenFiles, MoreGpusThanATopologyHolds) {
  std::string header;
  for (int g = 0; g <= 1024; ++g) header += "\tGPU" + std::to_string(g);
  const std::string path = write("wide.txt", header + "\nGPU0\t X \n");
  auto result = load_topology_file(path);
  expect_one_line_error(result, path);
  EXPECT_THAT(result.error().message, HasSubstr("the header names 1025 GPUs; allowed: at most 1024"));
}

TEST_F(BrokenFiles, XmlOfAnotherKind) {
  const std::string path = write("page.xml", "<?xml version=\"1.0\"?><html><body/></html>");
  auto result = load_topology_file(path);
  expect_one_line_error(result, path);
  EXPECT_THAT(result.error().message, HasSubstr("XML root element <html> is neither hwloc's <topology> nor NCCL's"));
}

TEST_F(BrokenFiles, EmptyBinaryMissingAndDirectory) {
  const std::string empty = write("empty.xml", " \n\t\n");
  expect_one_line_error(load_topology_file(empty), empty);
  EXPECT_THAT(load_topology_file(empty).error().message, HasSubstr("empty file"));

  const std::string binary = write("blob.bin", std::string("\x7f" "ELF\0\0\x01\x02", 8));
  expect_one_line_error(load_topology_file(binary), binary);
  EXPECT_THAT(load_topology_file(binary).error().message, HasSubstr("not a topology file"));

  const std::string missing = (dir_ / "missing.xml").string();
  EXPECT_EQ(load_topology_file(missing).error().message, missing + ": cannot read: No such file or directory");

  EXPECT_EQ(load_topology_file(dir_.string()).error().message, dir_.string() + ": cannot read: it is a directory");
}

TEST_F(BrokenFiles, NcclXmlProblemsNameTheElement) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"<system><cpu numaid=\"0\"><gpu dev=\"0\"/></cpu></system>", "<gpu dev=\"0\"> outside a <pci> element"},
      {"<system><cpu numaid=\"0\"><pci busid=\"zz\" class=\"0x030200\"><gpu dev=\"0\"/></pci></cpu></system>",
       "<pci busid=\"zz\"> is not a PCI address"},
      {"<system><cpu numaid=\"x\"/></system>", "<cpu numaid=\"x\"> is not allowed"},
      {"<system><cpu numaid=\"0\" affinity=\"ffff,zz\"/></system>", "cpu mask 'ffff,zz' is not allowed"},
      {"<system><cpu numaid=\"0\"><pci busid=\"0000:07:00.0\" class=\"0x030200\"><gpu dev=\"0\">"
       "<nvlink target=\"0000:08:00.0\" count=\"-2\"/></gpu></pci></cpu></system>",
       "count=\"-2\"> is not allowed; allowed: a count of 1 to 1024 links"},
      {"<system><cpu numaid=\"0\"><pci busid=\"0000:07:00.0\" class=\"0x030200\"><gpu dev=\"0\"/></pci>"
       "<pci busid=\"0000:07:00.0\" class=\"0x030200\"><gpu dev=\"1\"/></pci></cpu></system>",
       "two <pci> elements have busid 0000:07:00.0"},
  };
  for (const auto& [content, problem] : cases) {
    SCOPED_TRACE(content);
    const std::string path = write("nccl.xml", content);
    auto result = load_topology_file(path);
    expect_one_line_error(result, path);
    EXPECT_THAT(result.error().message, HasSubstr(problem));
  }
}

TEST_F(BrokenFiles, NcclXmlNestedTooDeepIsRefusedNotRecursedInto) {
  std::string deep = "<system>";
  for (int i = 0; i < 200; ++i) deep += "<pci busid=\"0000:" + std::to_string(10 + i % 80) + ":00." +
                                        std::to_string(i / 80) + "\" class=\"0x060400\">";
  for (int i = 0; i < 200; ++i) deep += "</pci>";
  deep += "</system>";
  const std::string path = write("deep.xml", deep);
  auto result = load_topology_file(path);
  expect_one_line_error(result, path);
  EXPECT_THAT(result.error().message, HasSubstr("nested more than 64 deep"));
}

TEST_F(BrokenFiles, NvidiaSmiTextProblemsNameTheLineAndCell) {
  const std::string header = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n";
  const std::vector<std::pair<std::string, std::string>> cases{
      {header + "GPU0\t X \tNV4\t0-7\t0\n", "the matrix has no row for GPU1 (truncated?)"},
      {header + "GPU0\t X \tNV4\t0-7\t0\nGPU1\tNV4\n", "line 3: row GPU1 has 1 cells; the header names 2 devices"},
      {header + "GPU0\t X \tNVX\t0-7\t0\nGPU1\tNV4\t X \t0-7\t0\n",
       "line 2: GPU0/GPU1 cell 'NVX' is not one of X, NV#, PIX, PXB, PHB, NODE, SYS"},
      {header + "GPU0\t X \tNV4\t0-7\t0\nGPU1\tPHB\t X \t0-7\t0\n", "GPU1/GPU0 says 'PHB' but GPU0/GPU1 says 'NV4'"},
      {header + "GPU0\t X \tNV4\t0-7\t0\nGPU1\tNV4\tSYS\t0-7\t0\n", "GPU1/GPU1 cell 'SYS' must be X"},
      {"GPU0\t X \tNV4\nGPU1\tNV4\t X \n", "line 1: the matrix has no header line above it"},
      {header + "GPU0\t X \tNV4\t0-7\t0\nGPU7\tNV4\t X \t0-7\t0\n", "line 3: row 'GPU7' is not a device"},
      {"\tGPU0\tGPU2\nGPU0\t X \tNV4\n", "line 1: the header names GPU2 where GPU1 belongs"},
  };
  for (const auto& [content, problem] : cases) {
    SCOPED_TRACE(content);
    const std::string path = write("topo.txt", content);
    auto result = load_topology_file(path);
    expect_one_line_error(result, path);
    EXPECT_THAT(result.error().message, HasSubstr(problem));
  }
}

TEST(ParseTopologyText, TheNameStandsForTheFile) {
  auto result = parse_topology_text("<topology", "pasted");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.error().message, StartsWith("pasted: truncated XML: it ends before </topology> ("));
}

}  // namespace
}  // namespace dew::topology
