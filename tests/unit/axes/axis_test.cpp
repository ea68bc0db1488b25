// Communicators for mesh axis groups (dew/comm.h): which group and
// rank a device has on an axis, the address a process listens on, and real
// Gloo groups made from a one-process pool and a mesh, twice in a row.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "dew/axes.h"
#include "expect_error.h"

namespace {

using dew::error_code_name;
using dew::ErrorCode;
using dew::axes::axis_member;
using dew::axes::make_axis_communicator;
using dew::axes::reachable_address;
using dew::mesh::Axis;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

dew::mesh::Mesh mesh_of(int processes, int devices_per_process, const std::string& spec) {
  auto parsed = dew::mesh::parse_mesh_spec(spec);
  EXPECT_TRUE(parsed.ok()) << parsed.error().message;
  auto built = dew::mesh::build_mesh(parsed.value(), dew::mesh::cpu_pool(processes, devices_per_process));
  EXPECT_TRUE(built.ok()) << built.error().message;
  return built.value();
}

TEST(AxisMember, TensorTimesSequenceGroups) {
  // 2 processes x 2 devices, tensor 2 x sequence 2: the sequence (innermost)
  // axis gets each process's two devices, the tensor axis pairs across them.
  const auto mesh = mesh_of(2, 2, "tensor=2,sequence=2");
  for (int device = 0; device < 4; ++device) {
    SCOPED_TRACE("device " + std::to_string(device));
    auto sequence = axis_member(mesh, Axis::kSequence, device);
    ASSERT_TRUE(sequence.ok()) << sequence.error().message;
    EXPECT_EQ(sequence.value().group, device / 2);
    EXPECT_EQ(sequence.value().rank, device % 2);
    EXPECT_EQ(sequence.value().size, 2);
    EXPECT_THAT(sequence.value().prefix,
                ::testing::StartsWith("dew/comm/sequence/" + std::to_string(device / 2) + "-"));
    auto tensor = axis_member(mesh, Axis::kTensor, device);
    ASSERT_TRUE(tensor.ok()) << tensor.error().message;
    EXPECT_EQ(tensor.value().group, device % 2);
    EXPECT_EQ(tensor.value().rank, device / 2);
    EXPECT_THAT(tensor.value().prefix, ::testing::StartsWith("dew/comm/tensor/" + std::to_string(device % 2) + "-"));
  }
  EXPECT_THAT(axis_member(mesh, Axis::kTensor, 1).value().devices, ElementsAre(1, 3));
  // An axis of size 1: every device alone in its group.
  auto data = axis_member(mesh, Axis::kData, 3);
  ASSERT_TRUE(data.ok());
  EXPECT_EQ(data.value().size, 1);
  EXPECT_EQ(data.value().rank, 0);
}

TEST(AxisMember, GroupsOfOtherDevicesHaveOtherPrefixes) {
  // Group 1 of the sequence axis holds devices 2, 3 in one mesh and 4, 5 in
  // the other: their rendezvous keys must differ.
  const auto two = mesh_of(2, 2, "sequence=2");
  const auto three = mesh_of(3, 2, "sequence=2");
  const auto a = axis_member(two, Axis::kSequence, 2).value();
  const auto b = axis_member(three, Axis::kSequence, 4).value();
  ASSERT_EQ(a.group, 1);
  ASSERT_EQ(b.group, 2);
  EXPECT_EQ(axis_member(three, Axis::kSequence, 2).value().prefix, a.prefix);  // the same devices 2, 3
  const auto shifted = mesh_of(2, 2, "sequence=4");
  EXPECT_NE(axis_member(shifted, Axis::kSequence, 0).value().prefix,
            axis_member(two, Axis::kSequence, 0).value().prefix);  // group 0: 0-3 against 0-1
}

TEST(AxisMember, ADeviceOutsideTheMeshIsNamed) {
  const auto mesh = mesh_of(2, 2, "sequence=4");
  EXPECT_EQ(dew::testing::message_of(axis_member(mesh, Axis::kSequence, 7), ErrorCode::kNotFound),
            "device 7 is not in the mesh; allowed: its devices 0, 1, 2, 3");
}

TEST(ReachableAddress, TheRouteToTheCoordinator) {
  dew::runtime::Identity alone;
  EXPECT_EQ(reachable_address(alone).value(), "127.0.0.1");

  dew::runtime::Identity local;
  local.coordinator = dew::runtime::Address{"127.0.0.1", 29500};
  EXPECT_EQ(reachable_address(local).value(), "127.0.0.1");

  dew::runtime::Identity unresolvable;
  unresolvable.coordinator = dew::runtime::Address{"no-such-host.invalid", 29500};
  unresolvable.coordinator_from = "DEW_COORDINATOR_ADDRESS";
  EXPECT_THAT(dew::testing::message_of(reachable_address(unresolvable), ErrorCode::kUnavailable),
              HasSubstr("the coordinator's host 'no-such-host.invalid' (DEW_COORDINATOR_ADDRESS) does not resolve"));
}

// This process's pool of one (a process joins one pool, once).
dew::runtime::Pool& alone_pool() {
  static dew::runtime::Pool pool = [] {
    dew::runtime::JoinOptions options;
    options.failure_handlers = false;  // gtest keeps its own
    return dew::runtime::join(options);
  }();
  return pool;
}

TEST(MakeAxisCommunicator, ADeviceOfAnotherProcessIsRefused) {
  auto& pool = alone_pool();
  ASSERT_EQ(pool.size(), 1);
  const auto mesh = mesh_of(2, 1, "sequence=2");
  EXPECT_EQ(dew::testing::invalid_argument_of(make_axis_communicator(pool, mesh, Axis::kSequence, 1)),
            "device 1 sits on process 1 in this mesh, not on this process 0; allowed: the devices of this process");
}

TEST(AxisRendezvous, EachCallIsTheDevicesNextRoundOfItsGroup) {
  auto& pool = alone_pool();
  const auto mesh = mesh_of(1, 3, "sequence=3");  // a group no other test forms
  const auto first = dew::axes::axis_rendezvous(pool, mesh, Axis::kSequence, 0, std::chrono::seconds(1));
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(first.value().member.size, 3);
  EXPECT_EQ(first.value().prefix, first.value().member.prefix + "/0");
  const auto again = dew::axes::axis_rendezvous(pool, mesh, Axis::kSequence, 0, std::chrono::seconds(1));
  EXPECT_EQ(again.value().prefix, first.value().member.prefix + "/1");
  // Device 2's first round is round 0, whatever device 0 did.
  const auto other = dew::axes::axis_rendezvous(pool, mesh, Axis::kSequence, 2, std::chrono::seconds(1));
  EXPECT_EQ(other.value().member.rank, 2);
  EXPECT_EQ(other.value().prefix, first.value().member.prefix + "/0");
  // The store is the pool's.
  ASSERT_TRUE(first.value().store.put("rendezvous-test", {'o', 'k'}).ok());
  EXPECT_EQ(pool.get("rendezvous-test", std::chrono::seconds(1)), "ok");
  auto got = other.value().store.get("rendezvous-test");
  ASSERT_TRUE(got.ok()) << got.error().message;
  EXPECT_THAT(got.value(), ElementsAre('o', 'k'));
}

// Two devices of this process, one thread each, form their sequence group
// over Gloo (the rendezvous through the pool's store), exchange, and do it
// again: the second group must not meet the first one's keys.
TEST(MakeAxisCommunicator, TwoDevicesFormTheirGroupTwiceInARow) {
  auto& pool = alone_pool();
  const auto mesh = mesh_of(1, 2, "sequence=2");
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<std::vector<int>> gathered(2);
    std::vector<std::string> errors(2);
    std::vector<std::thread> threads;
    for (int device = 0; device < 2; ++device) {
      threads.emplace_back([&, device] {
        dew::axes::AxisOptions options;
        options.timeout = std::chrono::seconds(10);
        auto comm = make_axis_communicator(pool, mesh, Axis::kSequence, device, options);
        if (!comm.ok()) {
          errors[std::size_t(device)] = comm.error().message;
          return;
        }
        const int mine = 10 * round + device;
        std::vector<int> all(2, -1);
        auto done = comm.value()->all_gather<int>(std::span<const int>(&mine, 1), all);
        if (!done.ok()) errors[std::size_t(device)] = done.error().message;
        gathered[std::size_t(device)] = all;
      });
    }
    for (auto& t : threads) t.join();
    for (int device = 0; device < 2; ++device) {
      EXPECT_EQ(errors[std::size_t(device)], "");
      EXPECT_THAT(gathered[std::size_t(device)], ElementsAre(10 * round, 10 * round + 1));
    }
  }
}

}  // namespace
