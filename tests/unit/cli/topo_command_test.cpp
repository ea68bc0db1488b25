// `dew topo` run as a user runs it: the matrix as nvidia-smi prints it, the
// JSON programs read, and one line on stderr with exit code 1 for a bad file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dew/nvml.h"
#include "dew/topology.h"
#include "process.h"
#include "test_paths.h"

namespace dew::topology {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

testing::RunResult topo(std::vector<std::string> args) {
  args.insert(args.begin(), {dew::testing::dew_exe(), "topo"});
  return testing::run(args);
}

TEST(TopoCommand, Dgx2PrintsTheMatrixLikeNvidiaSmi) {
  auto result = topo({"--topology", dew::testing::topology_fixture("nvidiaDGX2.xml")});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.err, "");
  EXPECT_THAT(result.out, StartsWith("Topology: hwloc XML v2 (nvidiaDGX2.xml)\nGPUs: 16    NUMA nodes: 2\n"));
  EXPECT_THAT(result.out, HasSubstr("\tGPU0\tGPU1\tGPU2\t"));
  EXPECT_THAT(result.out, HasSubstr("\tGPU15\tCPU Affinity\tNUMA Affinity\n"));
  EXPECT_THAT(result.out, HasSubstr("\nGPU0\t X \tNV6\tNV6\t"));
  EXPECT_THAT(result.out, HasSubstr("\nGPU15\tNV6\t"));
  EXPECT_THAT(result.out, HasSubstr("  NV#  = Connection traversing a bonded set of # NVLinks\n"));
  EXPECT_THAT(result.out, HasSubstr("GPU0\t0000:34:00.0\t0\tTesla V100-SXM3-32GB-H\n"));
  EXPECT_THAT(result.out, HasSubstr("Bandwidth estimates, GB/s"));
  EXPECT_THAT(result.out, HasSubstr("\nGPU0\t X \t150.0\t150.0\t"));
}

TEST(TopoCommand, NotesAndAffinityArePrinted) {
  auto result = topo({"--topology", dew::testing::topology_fixture("aws-p4d-24xl.hwloc.xml")});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("\nGPU0\t X \tPHB\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t0-23,48-71\t0\n"));
  EXPECT_THAT(result.out,
              HasSubstr("Notes:\n  - 6 NVSwitch devices present but no NVLink data: PCIe/NUMA classes only\n"));
}

TEST(TopoCommand, ItsOwnOutputReadsBackAsNvidiaSmiText) {
  for (const char* name :
       {"nvidiaDGX2.xml", "power8gpudistances.xml", "32em64t-2n8c2t-pci-wholeio.xml", "aws-p4d-24xl.hwloc.xml",
        "dgx1v.nccl-topo.xml", "pcie-workstation.nccl-topo.xml", "rtx3090-4gpu.nvidia-smi-topo.txt"}) {
    SCOPED_TRACE(name);
    auto result = topo({"--topology", dew::testing::topology_fixture(name)});
    ASSERT_EQ(result.exit_code, 0) << result.err;
    auto original = load_topology_file(dew::testing::topology_fixture(name));
    auto reread = parse_topology_text(result.out, "dew-topo-output");
    ASSERT_TRUE(original.ok() && reread.ok()) << (reread.ok() ? "" : reread.error().message);
    EXPECT_EQ(reread.value().path, original.value().path);
    EXPECT_EQ(reread.value().nvlinks, original.value().nvlinks);
    ASSERT_EQ(reread.value().size(), original.value().size());
    for (std::size_t i = 0; i < original.value().size(); ++i) {
      EXPECT_EQ(reread.value().gpus[i].cpu_affinity, original.value().gpus[i].cpu_affinity);
      EXPECT_EQ(reread.value().gpus[i].numa_node, original.value().gpus[i].numa_node);
    }
  }
}

TEST(TopoCommand, JsonHasTheSameTopologyForPrograms) {
  auto result = topo({"--topology", dew::testing::topology_fixture("power8gpudistances.xml"), "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  EXPECT_EQ(json["source"], "hwloc XML v2 (power8gpudistances.xml)");
  EXPECT_EQ(json["granule"], "host:drac-12.grenoble.grid5000.fr");
  EXPECT_EQ(json["numa_nodes"], 2);
  ASSERT_EQ(json["gpus"].size(), 4u);
  EXPECT_EQ(json["gpus"][0]["pci_bus_id"], "0002:01:00.0");
  EXPECT_EQ(json["gpus"][0]["model"], "Tesla P100-SXM2-16GB");
  EXPECT_EQ(json["gpus"][2]["numa_node"], 1);
  EXPECT_EQ(json["path"][0], nlohmann::json({"X", "NV2", "SYS", "SYS"}));
  EXPECT_EQ(json["nvlinks"][2], nlohmann::json({0, 0, 0, 2}));
  EXPECT_DOUBLE_EQ(json["bandwidth_gbps"][0][1].get<double>(), 40.0);
  EXPECT_TRUE(json["notes"].is_array());
}

TEST(TopoCommand, JsonOfACpuOnlyFileHasNoGpusAndItsNumaNodes) {
  auto result = topo({"--topology", dew::testing::topology_fixture("16amd64-8n2c-cpusets.xml"), "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  EXPECT_TRUE(json["gpus"].empty());
  EXPECT_TRUE(json["path"].empty());
  EXPECT_EQ(json["numa_nodes"], 5);
  EXPECT_EQ(json["gpus"].size(), 0u);
}

TEST(TopoCommand, ThisMachineWithoutNvmlSaysSo) {
  const NvmlReport nvml = read_nvml();
  if (nvml.available) GTEST_SKIP() << "NVML works on this machine: the note cannot show";
  auto result = topo({});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, StartsWith("Topology: live: hwloc\n"));
  EXPECT_THAT(result.out, HasSubstr("Granule: host:"));
  EXPECT_THAT(result.out, HasSubstr("  - NVML unavailable ("));
  auto json = topo({"--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_THAT(nlohmann::json::parse(json.out)["granule"].get<std::string>(), StartsWith("host:"));
}

TEST(TopoCommand, AMissingFileIsOneLineAndExitCodeOne) {
  auto result = topo({"--topology", "/nonexistent/topo.xml"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.out, "");
  EXPECT_EQ(result.err, "dew topo: /nonexistent/topo.xml: cannot read: No such file or directory\n");
}

TEST(TopoCommand, ACorruptFileIsOneLineNamingTheFile) {
  const std::string path = ::testing::TempDir() + "dew-topo-corrupt.xml";
  std::ofstream(path) << "<?xml version=\"1.0\"?>\n<topology version=\"2.0\">\n  <object type=\"Machine\"";
  auto result = topo({"--topology", path, "--json"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.out, "");
  std::remove(path.c_str());
  EXPECT_THAT(result.err, StartsWith("dew topo: " + path + ": truncated XML: it ends before </topology> ("));
  EXPECT_EQ(result.err.find('\n'), result.err.size() - 1) << result.err;
}

TEST(TopoCommand, ABadLogLevelIsAUsageErrorNamingTheAllowedValues) {
  auto result = dew::testing::run(
      {dew::testing::dew_exe(), "topo", "--topology", dew::testing::topology_fixture("dgx1v.nccl-topo.xml")},
      {{"DEW_LOG_LEVEL", "verbose"}});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_EQ(result.out, "");
  EXPECT_EQ(result.err,
            "dew: DEW_LOG_LEVEL: 'verbose' is not allowed; allowed: trace, debug, info, warn, error or off\n");
  // At "off" even an error line is gone; the exit code still says it.
  auto quiet = dew::testing::run({dew::testing::dew_exe(), "topo", "--topology", "/nonexistent/topo.xml"},
                                 {{"DEW_LOG_LEVEL", "off"}});
  EXPECT_EQ(quiet.exit_code, 1);
  EXPECT_EQ(quiet.err, "");
}

TEST(TopoCommand, BadUsageIsCli11sError) {
  auto result = topo({"--no-such-option"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("--no-such-option"));
}

}  // namespace
}  // namespace dew::topology
