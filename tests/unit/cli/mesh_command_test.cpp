// `dew mesh` as a user runs it: the design page's pool, topology files, explicit
// orders, and one-line errors with exit status 1.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "process.h"
#include "test_paths.h"

namespace {

using ::testing::HasSubstr;
using Groups = std::vector<std::vector<int>>;

dew::testing::RunResult mesh(std::vector<std::string> args) {
  args.insert(args.begin(), {dew::testing::dew_exe(), "mesh"});
  return dew::testing::run(args);
}

nlohmann::json json_of(const dew::testing::RunResult& result) {
  EXPECT_EQ(result.exit_code, 0) << result.err;
  return nlohmann::json::parse(result.out);
}

TEST(MeshCommandTest, SeedPoolAsJson) {
  const auto json = json_of(
      mesh({"--spec", R"({"fsdp": 2, "replicas": 2})", "--processes", "4", "--devices-per-process", "2", "--json"}));
  EXPECT_EQ(json["fsdp_groups"].get<Groups>(), (Groups{{0, 1}, {0, 1}, {2, 3}, {2, 3}}));
  EXPECT_EQ(json["devices"].get<std::vector<int>>(), (std::vector<int>{0, 2, 1, 3, 4, 6, 5, 7}));
  EXPECT_EQ(json["shape"].get<std::vector<int>>(), (std::vector<int>{4, 1, 2, 1, 1, 1}));
  const auto plain = json_of(mesh({"--spec", "fsdp=2", "--processes", "4", "--devices-per-process", "2", "--json"}));
  EXPECT_EQ(plain["fsdp_groups"].get<Groups>(), (Groups{{0}, {1}, {2}, {3}}));
}

TEST(MeshCommandTest, SeedPoolAsText) {
  const auto result = mesh({"--spec", "fsdp=2,replicas=2", "--processes", "4", "--devices-per-process", "2"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("mesh      data=4 fsdp=2 (8 devices), replicas=2\n"));
  EXPECT_THAT(result.out, HasSubstr("devices   [0 2 1 3 4 6 5 7]\n"));
  EXPECT_THAT(result.out, HasSubstr("  fsdp=2:  [0 2] -> [0 1]  [1 3] -> [0 1]  [4 6] -> [2 3]  [5 7] -> [2 3]\n"));
  EXPECT_THAT(result.out, HasSubstr("  fsdp: 1 | 1\n"));
}

TEST(MeshCommandTest, TopologyFilePutsTensorOnTheNVLinkPairs) {
  // power8: P100 pairs 0-1 and 2-3 over NVLink.
  const auto power8 = json_of(
      mesh({"--spec", "tensor=2", "--topology", dew::testing::topology_fixture("power8gpudistances.xml"), "--json"}));
  EXPECT_EQ(power8["tensor_group_devices"].get<Groups>(), (Groups{{0, 1}, {2, 3}}));
  EXPECT_GT(power8["score"]["tensor"].get<double>(), power8["score"]["data"].get<double>());
  // The design page's 3090s: an NV4 pair and a PHB pair; a 2-way sequence axis on both.
  const auto rtx = json_of(mesh({"--spec", "sequence=2", "--topology",
                                 dew::testing::topology_fixture("rtx3090-4gpu.nvidia-smi-topo.txt"), "--json"}));
  EXPECT_EQ(rtx["sequence_group_devices"].get<Groups>(), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(rtx["exact"], true);
}

TEST(MeshCommandTest, ExplicitDevicesFillAsGiven) {
  const auto json =
      json_of(mesh({"--spec", "tensor=2", "--topology", dew::testing::topology_fixture("power8gpudistances.xml"),
                    "--devices", "0,2,1,3", "--json"}));
  EXPECT_EQ(json["tensor_group_devices"].get<Groups>(), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(json["layout"], "explicit");
  // Across the pairs: worse than the id order, and the output says so.
  EXPECT_LT(json["score"]["tensor"].get<double>(), json["id_order_score"]["tensor"].get<double>());
}

void expect_one_line_error(const dew::testing::RunResult& result, const std::string& line) {
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.err, line + "\n");
  EXPECT_EQ(result.out, "");
}

TEST(MeshCommandTest, ErrorsAreOneLineAndExitOne) {
  expect_one_line_error(
      mesh({"--spec", "fsd=2", "--processes", "2", "--devices-per-process", "2"}),
      "dew mesh: mesh spec: unknown axis 'fsd'; allowed: data, stage, fsdp, expert, tensor, sequence, "
      "replicas");
  expect_one_line_error(
      mesh({"--spec", R"({"fsdp": 2, "replicas": 3})", "--processes", "4", "--devices-per-process", "2"}),
      "dew mesh: mesh: replicas=3 does not divide the 4 granules (processes: every device shares one "
      "host or NVLink domain); allowed: a divisor of 4");
  expect_one_line_error(mesh({"--spec", "{}", "--processes", "0", "--devices-per-process", "2"}),
                        "dew mesh: --processes 0 x --devices-per-process 2 is not allowed; allowed: whole numbers >= 1 "
                        "with at most 4096 devices in all");
  expect_one_line_error(
      mesh({"--spec", "{}", "--processes", "100", "--devices-per-process", "100"}),
      "dew mesh: --processes 100 x --devices-per-process 100 is not allowed; allowed: whole numbers >= "
      "1 with at most 4096 devices in all");
  expect_one_line_error(mesh({"--spec", "{}", "--processes", "2", "--devices-per-process", "2", "--devices", "0,x"}),
                        "dew mesh: --devices: 'x' in '0,x' is not allowed; allowed: device ids (whole numbers >= 0) "
                        "separated by commas, such as 0,2,1,3");
  expect_one_line_error(mesh({"--spec", "{}", "--processes", "2", "--devices-per-process", "2", "--devices", "0,7"}),
                        "dew mesh: mesh: device 7 in the device order is not one of the 4 devices (ids 0 to 3)");
  const auto missing = mesh({"--spec", "{}", "--topology", dew::testing::topology_fixture("no-such-file.xml")});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("no-such-file.xml"));
  EXPECT_EQ(std::count(missing.err.begin(), missing.err.end(), '\n'), 1);
  // A CPU-only file: nothing to lay out, and the message says what to give.
  expect_one_line_error(
      mesh({"--spec", "{}", "--topology", dew::testing::topology_fixture("32em64t-2n8c2t-pci-noio.xml")}),
      "dew mesh: " + dew::testing::topology_fixture("32em64t-2n8c2t-pci-noio.xml") +
          " has no GPUs to lay out; give --topology FILE for another machine, or --processes P "
          "--devices-per-process D for a CPU pool");
}

TEST(MeshCommandTest, TopologyAndPoolExcludeEachOther) {
  const auto result = mesh({"--spec", "{}", "--topology", dew::testing::topology_fixture("power8gpudistances.xml"),
                            "--processes", "2", "--devices-per-process", "2"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_THAT(result.err, HasSubstr("excludes"));
  EXPECT_NE(mesh({"--spec", "{}", "--processes", "2"}).exit_code, 0);
}

}  // namespace
