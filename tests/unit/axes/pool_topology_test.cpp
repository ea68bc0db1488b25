// The pool's topology, pure parts: which GPUs a process owns, its part on
// the wire, and the graph of several hosts (mesh::hosts_graph) with a
// granule per host, replicas across hosts, and the mixes refused.
#include "dew/pool_topology.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "topology_fixtures.h"

namespace dew::axes {
namespace {

using ::testing::HasSubstr;

topology::Topology host(const std::string& fixture) {
  auto t = topology::load_topology_file(topology::testing::fixture(fixture));
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
  return t.ok() ? t.value() : topology::Topology{};
}

LocalFacts facts(int process, int local_rank, int local_size, const std::string& host_id) {
  LocalFacts f;
  f.process = process;
  f.local_rank = local_rank;
  f.local_size = local_size;
  f.host_id = host_id;
  f.host_name = "node-" + host_id;
  f.topology_from_file = true;
  return f;
}

TEST(PoolTopology, AProcessOwnsItsVisibleDevicesOrItsShare) {
  const auto box = host("rtx3090-4gpu.nvidia-smi-topo.txt");
  auto f = facts(3, 1, 2, "b");
  auto share = local_part(box, f);
  ASSERT_TRUE(share.ok());
  EXPECT_EQ(share.value().gpus, (std::vector<int>{2, 3}));
  EXPECT_EQ(share.value().granule, "host:b");
  f.visible_devices = "3,0";
  EXPECT_EQ(local_part(box, f).value().gpus, (std::vector<int>{3, 0}));
  auto uneven = local_part(box, facts(0, 0, 3, "a"));
  ASSERT_FALSE(uneven.ok());
  EXPECT_THAT(uneven.error().message, HasSubstr("4 GPUs do not split over 3 processes"));
}

// UUIDs in CUDA_VISIBLE_DEVICES are resolved on the host (live NVML gives
// each GPU's), as CUDA does a unique prefix; one the host does not have, an
// index past its GPUs, or an empty list is refused, never replaced by a
// share by local rank (bind_gpus's rule, as the plugin and dew launch).
TEST(PoolTopology, UuidsAreResolvedOnTheHostAndUnknownOnesRefused) {
  auto box = host("rtx3090-4gpu.nvidia-smi-topo.txt");
  auto f = facts(3, 1, 2, "b");
  f.visible_devices = "GPU-5f1c2a3b-1111-2222-3333-444455556666";
  auto unknown = local_part(box, f);
  ASSERT_FALSE(unknown.ok()) << "a file lists no UUIDs";
  EXPECT_THAT(unknown.error().message,
              HasSubstr("'GPU-5f1c2a3b-1111-2222-3333-444455556666' is not the UUID of a GPU"));
  for (std::size_t g = 0; g < box.gpus.size(); ++g) box.gpus[g].uuid = "GPU-000" + std::to_string(g) + "-x";
  f.visible_devices = "GPU-0003-x,GPU-0001";
  auto resolved = local_part(box, f);
  ASSERT_TRUE(resolved.ok()) << resolved.error().message;
  EXPECT_EQ(resolved.value().gpus, (std::vector<int>{3, 1}));
  f.visible_devices = "GPU-000";
  EXPECT_THAT(local_part(box, f).error().message, HasSubstr("names more than one GPU"));
  f.visible_devices = "7";
  EXPECT_THAT(local_part(box, f).error().message, HasSubstr("names GPU 7, but the host has 4 GPUs"));
  f.visible_devices = "";
  EXPECT_THAT(local_part(box, f).error().message, HasSubstr("sees no GPU"));
}

// A live topology that names an NVLink domain (fabric cluster UUID and
// clique) puts hosts of one domain in one granule; a file never does.
TEST(PoolTopology, AnNvlinkDomainIsOneGranuleAcrossHosts) {
  auto box = host("dgx-h100.nccl-topo.xml");
  box.granule = "6e8f1d2c-0000-4000-8000-1234567890ab/1";
  auto f = facts(0, 0, 1, "a");
  f.topology_from_file = false;
  auto a = local_part(box, f).value();
  f = facts(1, 0, 1, "b");
  f.topology_from_file = false;
  auto b = local_part(box, f).value();
  EXPECT_EQ(a.granule, box.granule);
  auto graph = mesh::hosts_graph({a, b});
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  EXPECT_EQ(graph.value().devices[0].granule, graph.value().devices[8].granule);
  EXPECT_GT(graph.value().bandwidth[0 * 16 + 8], mesh::kBetweenHostsGbps) << "NVLink between the hosts";
  f.topology_from_file = true;
  EXPECT_EQ(local_part(box, f).value().granule, "host:b");
}

TEST(PoolTopology, APartRoundTripsAndABrokenOneIsRefused) {
  auto part = local_part(host("dgx1v.nccl-topo.xml"), facts(1, 0, 1, "x"));
  ASSERT_TRUE(part.ok());
  auto back = decode_part(encode_part(part.value()));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back.value().bandwidth, part.value().bandwidth);
  EXPECT_EQ(back.value().gpus, part.value().gpus);
  EXPECT_EQ(back.value().host, "x");
  for (const char* bad : {"", "{}", "[1]",
                          "{\"process\": 0, \"host\": \"h\", \"host_name\": \"h\", \"granule\": \"g\", "
                          "\"host_gpus\": 2, \"bandwidth\": [1], \"gpus\": [0]}"}) {
    EXPECT_FALSE(decode_part(bad).ok()) << bad;
  }
}

// Two 4-GPU boxes of different kinds, two processes each: a granule per
// host, replicas across hosts, fsdp inside one.
TEST(PoolTopology, TwoHostsTwoProcessesEachGiveAHybridMesh) {
  std::vector<mesh::HostPart> parts;
  const auto a = host("rtx3090-4gpu.nvidia-smi-topo.txt"), b = host("power8gpudistances.xml");
  parts.push_back(local_part(a, facts(0, 0, 2, "n1")).value());
  parts.push_back(local_part(a, facts(1, 1, 2, "n1")).value());
  parts.push_back(local_part(b, facts(2, 0, 2, "n2")).value());
  parts.push_back(local_part(b, facts(3, 1, 2, "n2")).value());
  auto graph = mesh::hosts_graph(parts);
  ASSERT_TRUE(graph.ok()) << graph.error().message;
  ASSERT_EQ(graph.value().devices.size(), 8u);
  EXPECT_EQ(graph.value().devices[5].process, 2);
  EXPECT_EQ(graph.value().devices[5].granule, "host:n2");
  EXPECT_EQ(graph.value().bandwidth[0 * 8 + 4], mesh::kBetweenHostsGbps);
  EXPECT_EQ(graph.value().bandwidth[0 * 8 + 1], a.bandwidth_gbps[0 * 4 + 1]);
  auto spec = mesh::parse_mesh_spec(R"({"fsdp": 4, "replicas": 2})");
  auto built = mesh::build_mesh(spec.value(), graph.value());
  ASSERT_TRUE(built.ok()) << built.error().message;
  const auto& fsdp = built.value().groups[static_cast<int>(mesh::Axis::kFsdp)].processes;
  EXPECT_EQ(fsdp, (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(built.value().granules.size(), 2u);
}

TEST(PoolTopology, MixesThatCannotFormGranulesAreRefusedWithTheNumbers) {
  const auto four = host("rtx3090-4gpu.nvidia-smi-topo.txt"), eight = host("dgx1v.nccl-topo.xml");
  auto mixed = mesh::hosts_graph(
      {local_part(four, facts(0, 0, 1, "n1")).value(), local_part(eight, facts(1, 0, 1, "n2")).value()});
  ASSERT_FALSE(mixed.ok());
  EXPECT_THAT(mixed.error().message,
              HasSubstr("host node-n2 has 8 GPUs and node-n1 has 4; allowed: hosts with the same GPU count"));
  // One host id, two topologies: the same host cannot have both.
  auto twice = mesh::hosts_graph({local_part(four, facts(0, 0, 2, "n1")).value(),
                                  local_part(host("power8gpudistances.xml"), facts(1, 1, 2, "n1")).value()});
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(twice.error().message, HasSubstr("share host node-n1 (id n1) but read different topologies"));
  // Two processes claiming one GPU.
  auto f = facts(1, 1, 2, "n1");
  f.visible_devices = "0";
  auto clash = mesh::hosts_graph({local_part(four, facts(0, 0, 2, "n1")).value(), local_part(four, f).value()});
  ASSERT_FALSE(clash.ok());
  EXPECT_THAT(clash.error().message, HasSubstr("claims GPU 0, which another process there owns"));
}

}  // namespace
}  // namespace dew::axes
