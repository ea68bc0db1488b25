// build_mesh: the design page's examples, explicit orders, hybrid sharding's rules
// and refusals, granule placement and the JSON programs read.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "axis_index.h"
#include "dew/mesh.h"

namespace dew::mesh {
namespace {

using Groups = std::vector<std::vector<int>>;

MeshSpec spec_of(std::string_view text) {
  auto spec = parse_mesh_spec(text);
  EXPECT_TRUE(spec.ok()) << text;
  return spec.ok() ? spec.value() : MeshSpec{};
}

Mesh mesh_of(std::string_view spec, const DeviceGraph& graph,
             const std::optional<std::vector<int>>& order = std::nullopt) {
  auto mesh = build_mesh(spec_of(spec), graph, order);
  EXPECT_TRUE(mesh.ok()) << spec << ": " << (mesh.ok() ? "" : mesh.error().message);
  return mesh.ok() ? mesh.value() : Mesh{};
}

std::string error_of(std::string_view spec, const DeviceGraph& graph,
                     const std::optional<std::vector<int>>& order = std::nullopt) {
  auto mesh = build_mesh(spec_of(spec), graph, order);
  return mesh.ok() ? "(built)" : mesh.error().message;
}

// `hosts` granules of `per_host` GPUs, one process each; links: `inside`
// between GPUs of a host (the same on every host), `network` between hosts.
DeviceGraph hosts(int count, int per_host, const std::function<double(int, int)>& inside, double network) {
  DeviceGraph graph;
  const int n = count * per_host;
  for (int d = 0; d < n; ++d) graph.devices.push_back({d, d / per_host, "host:" + std::string(1, 'a' + d / per_host)});
  graph.bandwidth.assign(static_cast<std::size_t>(n) * n, network);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i / per_host == j / per_host) graph.bandwidth[i * n + j] = inside(i % per_host, j % per_host);
    }
  }
  return graph;
}

double nvlink_pairs_0_2(int i, int j) { return i % 2 == j % 2 ? 100.0 : 6.0; }

// The granule (host) each group's devices sit on.
std::set<std::string> granules_of(const DeviceGraph& graph, const std::vector<int>& ids) {
  std::set<std::string> out;
  for (const int id : ids) out.insert(graph.devices[id].granule);
  return out;
}

TEST(BuildMeshTest, SeedPoolWithReplicasSpansEachReplicasTwoHosts) {
  // 4 processes x 2 CPU devices, {"fsdp": 2, "replicas": 2}: "fsdp_groups":
  // [[0, 1], [0, 1], [2, 3], [2, 3]], each fsdp group across the two hosts
  // (processes) of its replica.
  const Mesh mesh = mesh_of(R"({"fsdp": 2, "replicas": 2})", cpu_pool(4, 2));
  EXPECT_EQ(mesh.layout, Layout::kHybrid);
  EXPECT_EQ(mesh.shape, (MeshShape{4, 1, 2, 1, 1, 1}));
  EXPECT_EQ(mesh.groups[kFsdp].processes, (Groups{{0, 1}, {0, 1}, {2, 3}, {2, 3}}));
  EXPECT_EQ(mesh.groups[kFsdp].devices, (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh.devices, (std::vector<int>{0, 2, 1, 3, 4, 6, 5, 7}));
  EXPECT_EQ(mesh.processes, (std::vector<int>{0, 1, 0, 1, 2, 3, 2, 3}));
  // Data spans the replica groups: each data group meets both of them.
  EXPECT_EQ(mesh.groups[kData].processes, (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(mesh.granules, (std::vector<std::string>{"process:0", "process:1", "process:2", "process:3"}));
  EXPECT_EQ(mesh.granule_shape, (MeshShape{2, 1, 1, 1, 1, 1}));
}

TEST(BuildMeshTest, SeedPoolWithoutReplicasKeepsFsdpInsideEachProcess) {
  const Mesh mesh = mesh_of(R"({"fsdp": 2})", cpu_pool(4, 2));
  EXPECT_EQ(mesh.layout, Layout::kPlacement);
  EXPECT_EQ(mesh.groups[kFsdp].processes, (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(mesh.devices, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(mesh.exact);
  EXPECT_EQ(compare_scores(mesh.score, mesh.id_order_score), 0);
}

TEST(BuildMeshTest, SeedSequenceAcrossTwoProcessesStaysInsideEach) {
  // Two processes of four: {"fsdp": 2, "sequence": 2, "replicas": 2}.
  const Mesh mesh = mesh_of("fsdp=2,sequence=2,replicas=2", cpu_pool(2, 4));
  EXPECT_EQ(mesh.shape, (MeshShape{2, 1, 2, 1, 1, 2}));
  for (const auto& group : mesh.groups[kSequence].processes) EXPECT_EQ(group.size(), 1u);
  for (const auto& group : mesh.groups[kFsdp].processes) EXPECT_EQ(group.size(), 1u);
  EXPECT_EQ(mesh.groups[kData].processes, (Groups{{0, 1}, {0, 1}, {0, 1}, {0, 1}}));
}

TEST(BuildMeshTest, ExplicitOrderFillsRowMajorAsGiven) {
  // The design page's [0, 2, 1, 3]: a two-way tensor axis across the NVLink pairs
  // 0-1 and 2-3.
  const DeviceGraph box = hosts(
      1, 4, [](int i, int j) { return i / 2 == j / 2 ? 100.0 : 6.0; }, 1);
  const Mesh mesh = mesh_of("tensor=2", box, std::vector<int>{0, 2, 1, 3});
  EXPECT_EQ(mesh.layout, Layout::kExplicit);
  EXPECT_EQ(mesh.devices, (std::vector<int>{0, 2, 1, 3}));
  EXPECT_EQ(mesh.groups[kTensor].devices, (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(mesh.groups[kData].devices, (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(mesh.score.bottleneck[kTensor], 6.0);
  EXPECT_EQ(mesh.id_order_score.bottleneck[kTensor], 100.0);
  // A subset of the devices is a mesh of its own size.
  const Mesh two = mesh_of("{}", box, std::vector<int>{3, 1});
  EXPECT_EQ(two.shape, (MeshShape{2, 1, 1, 1, 1, 1}));
  EXPECT_EQ(two.devices, (std::vector<int>{3, 1}));
}

TEST(BuildMeshTest, PlacementPutsTensorOnTheNVLinkPairsAndBeatsTheIdOrder) {
  // Pairs 0-2 and 1-3, where the id order would put tensor across them.
  const DeviceGraph box = hosts(1, 4, nvlink_pairs_0_2, 1);
  const Mesh mesh = mesh_of("tensor=2", box);
  EXPECT_EQ(mesh.devices, (std::vector<int>{0, 2, 1, 3}));
  EXPECT_EQ(mesh.score.bottleneck[kTensor], 100.0);
  EXPECT_EQ(mesh.id_order_score.bottleneck[kTensor], 6.0);
  EXPECT_GT(compare_scores(mesh.score, mesh.id_order_score), 0);
}

TEST(BuildMeshTest, EveryGranuleTakesTheSameLocalOrder) {
  const DeviceGraph two_hosts = hosts(2, 4, nvlink_pairs_0_2, 3);
  const Mesh mesh = mesh_of("tensor=2", two_hosts);
  EXPECT_EQ(mesh.devices, (std::vector<int>{0, 2, 1, 3, 4, 6, 5, 7}));
  EXPECT_EQ(mesh.granules, (std::vector<std::string>{"host:a", "host:b"}));
  EXPECT_EQ(mesh.granule_shape, (MeshShape{2, 1, 1, 1, 2, 1}));
  EXPECT_EQ(mesh.groups[kTensor].devices, (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
}

TEST(BuildMeshTest, HybridKeepsInnerAxesInsideAGranuleAndFsdpInsideAReplicaGroup) {
  // 4 hosts of 4 GPUs, 2 replica groups of 2 hosts: fsdp=4 spans the two
  // hosts of a group, tensor stays on one host's NVLink pairs.
  const DeviceGraph cluster = hosts(4, 4, nvlink_pairs_0_2, 3);
  const Mesh mesh = mesh_of(R"({"fsdp": 4, "tensor": 2, "replicas": 2})", cluster);
  EXPECT_EQ(mesh.shape, (MeshShape{2, 1, 4, 1, 2, 1}));
  EXPECT_EQ(mesh.granule_shape, (MeshShape{1, 1, 2, 1, 2, 1}));
  for (const auto& group : mesh.groups[kTensor].devices) {
    EXPECT_EQ(granules_of(cluster, group).size(), 1u);
    EXPECT_EQ(cluster.bandwidth[group[0] * 16 + group[1]], 100.0);
  }
  for (const auto& group : mesh.groups[kFsdp].devices) {
    const auto where = granules_of(cluster, group);
    EXPECT_TRUE(where == std::set<std::string>({"host:a", "host:b"}) ||
                where == std::set<std::string>({"host:c", "host:d"}));
  }
  for (const auto& group : mesh.groups[kData].processes) EXPECT_EQ(group.size(), 2u);
  EXPECT_EQ(mesh.score.bottleneck[kTensor], 100.0);
}

TEST(BuildMeshTest, HybridWithOneGranulePerGroupKeepsFsdpOnOneHost) {
  // The design page's two nodes of eight GPUs: MeshSpec(fsdp=8, replicas=2).
  const DeviceGraph cluster = hosts(
      2, 8, [](int, int) { return 150.0; }, 25);
  const Mesh mesh = mesh_of("fsdp=8,replicas=2", cluster);
  EXPECT_EQ(mesh.groups[kFsdp].processes, (Groups{{0}, {1}}));
  EXPECT_EQ(mesh.groups[kData].processes, (Groups{{0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}}));
  EXPECT_EQ(mesh.score.bottleneck[kFsdp], 150.0);
  EXPECT_EQ(mesh.score.bottleneck[kData], 25.0);
}

TEST(BuildMeshTest, HybridRefusalsNameTheNumbers) {
  EXPECT_EQ(error_of(R"({"fsdp": 2, "replicas": 3})", cpu_pool(4, 2)),
            "mesh: replicas=3 does not divide the 4 granules (processes: every device shares one host or NVLink "
            "domain); allowed: a divisor of 4");
  EXPECT_EQ(error_of("fsdp=8,replicas=3", hosts(
                                              2, 8, [](int, int) { return 1.0; }, 1)),
            "mesh: replicas=3 does not divide the 2 granules; allowed: a divisor of 2");
  EXPECT_EQ(error_of("fsdp=4,replicas=2", cpu_pool(4, 3)),
            "mesh: replicas=2 does not divide the data axis (data=3); the data axis spans the replica groups");
  EXPECT_EQ(error_of(R"({"fsdp": 1, "replicas": 2})", cpu_pool(4, 2)),
            "mesh: fsdp=1 does not divide over the 2 granules of one replica group (4 granules / replicas=2); fsdp "
            "must be a multiple of 2");
  EXPECT_EQ(error_of("replicas=2", hosts(
                                       1, 8, [](int, int) { return 1.0; }, 1)),
            "mesh: replicas=2 does not divide the 1 granule (processes: every device shares one host or NVLink "
            "domain); allowed: a divisor of 1");
  DeviceGraph uneven = hosts(
      1, 3, [](int, int) { return 1.0; }, 1);
  uneven.devices[2].granule = "host:b";
  EXPECT_EQ(error_of("replicas=2", uneven),
            "mesh: granules hold different device counts (host:a: 2, host:b: 1); hybrid sharding needs the same "
            "count in every granule");
}

TEST(BuildMeshTest, GranulesThatAreNotBlocksArePlacedAsOne) {
  // 3 hosts of 2 with a 3-way tensor axis: no host holds a whole block.
  const Mesh mesh = mesh_of("tensor=3", hosts(
                                            3, 2, [](int, int) { return 9.0; }, 1));
  EXPECT_EQ(mesh.shape, (MeshShape{2, 1, 1, 1, 3, 1}));
  EXPECT_EQ(mesh.notes, (std::vector<std::string>{
                            "a granule of 2 devices is not a block of the mesh: placed all 6 devices as one granule"}));
  EXPECT_EQ(mesh.granules, (std::vector<std::string>{"all"}));
  DeviceGraph uneven = hosts(
      1, 3, [](int, int) { return 1.0; }, 1);
  uneven.devices[2].granule = "host:b";
  EXPECT_EQ(mesh_of("{}", uneven).notes,
            (std::vector<std::string>{"granules hold different device counts: placed all 3 devices as one granule"}));
}

TEST(BuildMeshTest, LargeGranulesSayTheirPlacementIsAHeuristic) {
  const Mesh mesh = mesh_of("tensor=4", cpu_pool(1, 32));
  EXPECT_FALSE(mesh.exact);
  EXPECT_EQ(mesh.notes, (std::vector<std::string>{
                            "granules of 32 devices exceed 16: heuristic placement, never worse than the id order"}));
  std::vector<int> identity(32);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(mesh.devices, identity);
}

TEST(BuildMeshTest, ExplicitOrderRefusals) {
  const DeviceGraph pool = cpu_pool(2, 2);
  EXPECT_EQ(error_of("replicas=2", pool, std::vector<int>{0, 1, 2, 3}),
            "mesh: replicas=2 with an explicit device order; the order fixes the layout, so give replicas=1 or no "
            "device order");
  EXPECT_EQ(error_of("{}", pool, std::vector<int>{}),
            "mesh: the device order is empty; allowed: device ids of the graph");
  EXPECT_EQ(error_of("{}", pool, std::vector<int>{0, 9}),
            "mesh: device 9 in the device order is not one of the 4 devices (ids 0 to 3)");
  EXPECT_EQ(error_of("{}", pool, std::vector<int>{0, 2, 2, 1}),
            "mesh: device 2 appears twice in the device order; give each once");
  EXPECT_EQ(
      error_of("fsdp=2", pool, std::vector<int>{0, 1, 2}),
      "mesh spec: fsdp=2 asks for 2 devices, which does not divide the 3 devices; data takes the devices left over, "
      "so the other axes must multiply to a divisor of 3");
}

TEST(BuildMeshTest, DeviceGraphRefusals) {
  EXPECT_EQ(error_of("{}", DeviceGraph{}), "mesh: the device graph has no devices; allowed: at least 1");
  DeviceGraph twice = cpu_pool(1, 4);
  twice.devices[3].id = 1;
  EXPECT_EQ(error_of("{}", twice), "mesh: device id 1 appears twice in the device graph; each id must be unique");
  DeviceGraph short_matrix = cpu_pool(1, 4);
  short_matrix.bandwidth.pop_back();
  EXPECT_EQ(error_of("{}", short_matrix), "mesh: the bandwidth matrix has 15 entries; 4 devices need 16 (4 x 4)");
  DeviceGraph negative = cpu_pool(1, 2);
  negative.bandwidth[1] = -1;
  EXPECT_EQ(error_of("{}", negative),
            "mesh: bandwidth from device 0 to device 1 is -1 GB/s; allowed: a finite number >= 0");
  DeviceGraph nan = cpu_pool(1, 2);
  nan.bandwidth[2] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(error_of("{}", nan),
            "mesh: bandwidth from device 1 to device 0 is nan GB/s; allowed: a finite number >= 0");
  // The diagonal is not a link.
  DeviceGraph diagonal = cpu_pool(1, 2);
  diagonal.bandwidth[0] = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(build_mesh(MeshSpec{}, diagonal).ok());
  MeshSpec zero;
  zero.replicas = 0;
  EXPECT_EQ(build_mesh(zero, cpu_pool(1, 2)).error().message,
            "mesh spec: replicas = '0' is not allowed; allowed: a whole number from 1 to 1048576");
}

TEST(BuildMeshTest, IdsNeedNotStartAtZeroOrBeInOrder) {
  DeviceGraph graph = hosts(1, 4, nvlink_pairs_0_2, 1);
  for (auto& device : graph.devices) device.id = 40 - 10 * device.id;  // 40, 30, 20, 10
  const Mesh mesh = mesh_of("tensor=2", graph);
  // By id: 10 (index 3), 20 (2), 30 (1), 40 (0); pairs are indices {0,2}, {1,3}.
  EXPECT_EQ(mesh.groups[kTensor].devices, (Groups{{10, 30}, {20, 40}}));
}

TEST(MeshJsonTest, SeedPoolJsonMatchesPoolJson) {
  const auto json = nlohmann::json::parse(mesh_to_json(mesh_of(R"({"fsdp": 2, "replicas": 2})", cpu_pool(4, 2))));
  EXPECT_EQ(json["fsdp_groups"], nlohmann::json::parse("[[0, 1], [0, 1], [2, 3], [2, 3]]"));
  EXPECT_EQ(json["fsdp_group_devices"], nlohmann::json::parse("[[0, 2], [1, 3], [4, 6], [5, 7]]"));
  EXPECT_EQ(json["axes"], nlohmann::json::parse(R"(["data", "stage", "fsdp", "expert", "tensor", "sequence"])"));
  EXPECT_EQ(json["shape"], nlohmann::json::parse("[4, 1, 2, 1, 1, 1]"));
  EXPECT_EQ(json["devices"], nlohmann::json::parse("[0, 2, 1, 3, 4, 6, 5, 7]"));
  EXPECT_EQ(json["replicas"], 2);
  EXPECT_EQ(json["layout"], "hybrid");
  EXPECT_EQ(json["score"]["fsdp"], 1.0);
  EXPECT_TRUE(json["score"]["tensor"].is_null());
  EXPECT_EQ(json["stage_groups"].size(), 8u);
  EXPECT_EQ(json["notes"], nlohmann::json::array());
}

}  // namespace
}  // namespace dew::mesh

namespace dew::mesh {
namespace {

// groups_along: the one rule for an axis's groups (build_mesh's, and the
// torch groups of the Python module).
TEST(GroupsAlong, EachGroupRunsAlongItsAxisInRowMajorOrderOfTheOthers) {
  const std::vector<int> shape = {2, 3};
  const std::vector<int> values = {0, 1, 2, 3, 4, 5};
  EXPECT_EQ(groups_along(shape, values, 0), (std::vector<std::vector<int>>{{0, 3}, {1, 4}, {2, 5}}));
  EXPECT_EQ(groups_along(shape, values, 1), (std::vector<std::vector<int>>{{0, 1, 2}, {3, 4, 5}}));
  const std::vector<int> hybrid = {2, 1, 2, 1, 1, 1};  // data=2 fsdp=2, as build_mesh shapes a hybrid mesh
  const std::vector<int> ranks = {0, 1, 2, 3};
  EXPECT_EQ(groups_along(hybrid, ranks, 0), (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_EQ(groups_along(hybrid, ranks, 2), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(groups_along(hybrid, ranks, 1).size(), 4u) << "an axis of size 1: one group per entry";
}

TEST(GroupsAlong, AMeshsGroupsAreItsDevicesAlongEachAxis) {
  MeshSpec spec;
  spec.sizes[2] = 2;  // fsdp
  spec.replicas = 2;
  auto built = build_mesh(spec, cpu_pool(4, 2));
  ASSERT_TRUE(built.ok()) << built.error().message;
  const Mesh& m = built.value();
  for (int axis = 0; axis < kAxisCount; ++axis) {
    EXPECT_EQ(m.groups[axis].devices, groups_along(m.shape, m.devices, axis)) << kMeshAxes[axis];
  }
}

}  // namespace
}  // namespace dew::mesh
