// The pool's topology on the two-node test cluster: each node reads its own
// topology file (two different 4-GPU boxes, DEW_TOPOLOGY_FILE, a host id per
// node since both nodes share this machine's kernel), the pool gathers them,
// and `dew mesh --pool` lays a hybrid mesh over every process's devices,
// the same as `dew mesh --topology A --topology B` plans offline; a mix of
// a 4-GPU and an 8-GPU host is refused with the numbers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "srun_output.h"
#include "test_paths.h"

namespace dew::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// A shell line: node n1 reads `first`, the other node `second`.
std::string per_node(const std::string& first, const std::string& second, const std::string& spec) {
  return "case $SLURMD_NODENAME in n1) f=" + topology_fixture(first) + ";; *) f=" + topology_fixture(second) +
         ";; esac; DEW_TOPOLOGY_FILE=$f DEW_HOST_ID=$SLURMD_NODENAME exec " + dew_exe() + " mesh --spec '" + spec +
         "' --pool --json";
}

// The whole mesh (process 0's line) and each rank's part.
struct PoolMesh {
  nlohmann::json mesh;
  std::map<int, nlohmann::json> parts;
};

PoolMesh read_pool_mesh(const std::string& out) {
  PoolMesh r;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("{\"axes\"", 0) == 0) r.mesh = nlohmann::json::parse(line);
    if (line.rfind("{\"process\"", 0) == 0) {
      auto part = nlohmann::json::parse(line);
      r.parts[part.at("process").get<int>()] = part;
    }
  }
  return r;
}

TEST(PoolMesh, TwoHostsTopologiesGiveOneHybridMeshUnderEveryLauncher) {
  const std::string spec = R"({"fsdp": 4, "replicas": 2})";
  const std::string script = per_node("rtx3090-4gpu.nvidia-smi-topo.txt", "power8gpudistances.xml", spec);
  auto offline = run({dew_exe(), "mesh", "--spec", spec, "--json", "--topology",
                      topology_fixture("rtx3090-4gpu.nvidia-smi-topo.txt"), "--topology",
                      topology_fixture("power8gpudistances.xml")});
  ASSERT_EQ(offline.exit_code, 0) << offline.err;
  const auto planned = nlohmann::json::parse(offline.out);
  const std::vector<std::vector<std::string>> modes = {
      {"--dew-pool", "--gpus-per-node=4", "--dew-devices-per-process=2"}, {"--mpi=pmix"}};
  for (auto args : modes) {
    SCOPED_TRACE(args.front());
    args.insert(args.end(), {"-N2", "--ntasks-per-node=2", "sh", "-c", script});
    auto r = cluster().srun(args, {}, 60s);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const auto got = read_pool_mesh(r.out);
    ASSERT_FALSE(got.mesh.is_null()) << describe(r);
    EXPECT_EQ(got.mesh.at("fsdp_groups"), nlohmann::json::parse("[[0, 1], [2, 3]]"));
    EXPECT_EQ(got.mesh.at("granules"), nlohmann::json::parse(R"(["host:n1", "host:n2"])"));
    EXPECT_EQ(got.mesh.at("replicas"), 2);
    EXPECT_EQ(got.mesh.at("devices"), planned.at("devices"));
    EXPECT_EQ(got.mesh.at("fsdp_group_devices"), planned.at("fsdp_group_devices"));
    ASSERT_EQ(got.parts.size(), 4u) << describe(r);
    EXPECT_EQ(got.parts.at(2).at("devices"), nlohmann::json::parse("[4, 5]"));
    EXPECT_EQ(occurrences(r.out, "{\"axes\""), 1) << "process 0 alone prints the mesh";
    EXPECT_EQ(occurrences(r.out, "{\"process\": "), 4) << "and every process's part";
  }
}

TEST(PoolMesh, AFourAndAnEightGpuHostAreRefusedWithTheNumbers) {
  std::vector<std::string> args = {
      "--dew-pool", "-N2", "--ntasks-per-node=1",
      "sh",         "-c",  per_node("rtx3090-4gpu.nvidia-smi-topo.txt", "dgx1v.nccl-topo.xml", "fsdp=4")};
  auto r = cluster().srun(args, {}, 60s);
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("has 8 GPUs and")) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("has 4; allowed: hosts with the same GPU count")) << describe(r);
}

}  // namespace
}  // namespace dew::testing
