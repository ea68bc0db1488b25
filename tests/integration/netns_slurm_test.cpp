// The namespaced test cluster (netns_cluster.h): nodes with addresses of
// their own, reached by NodeAddr, and a shaped link.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>

#include "netns_cluster.h"
#include "test_paths.h"

namespace dew::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// The cluster's addresses and a shaped link (the faults: netns_faults_test.cpp).
class NetnsCluster : public NetnsTestbed {};

// Each node answers from an address of its own, and srun --dew-pool, with
// no --dew-coordinator (the node names resolve nowhere), points every task
// at process 0's node's NodeAddr; a pool of 4 across the two namespaces
// joins through it and exchanges.
TEST_F(NetnsCluster, EachNodeHasItsOwnAddressAndThePoolReachesProcess0ByItsNodeAddr) {
  const auto r = srun({"--dew-pool", "-N2", "-n2", "-l", "bash", "-c",
                       "echo ADDR $(ip -4 -o addr show eth0 | awk '{print $4}') COORD $DEW_COORDINATOR_ADDRESS"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const std::regex line("([01]): ADDR (10\\.[0-9.]+)/24 COORD ([0-9.]+):[0-9]+");
  std::map<std::string, std::string> address, coordinator;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), line); it != std::sregex_iterator(); ++it) {
    address[(*it)[1]] = (*it)[2];
    coordinator[(*it)[1]] = (*it)[3];
  }
  ASSERT_EQ(address.size(), 2u) << r.out;
  EXPECT_NE(address["0"], address["1"]);
  EXPECT_EQ(coordinator["0"], address["0"]);
  EXPECT_EQ(coordinator["1"], address["0"]);
  // srun says which address it gave, once; not for a step of one task (no pool).
  EXPECT_EQ(occurrences(r.err,
                        "srun: dew: process 0's node n1 does not resolve here: the pool's coordinator is its "
                        "NodeAddr " +
                            address["0"] + "\n"),
            1)
      << r.err;
  const auto alone = srun({"--dew-pool", "-n1", "true"});
  EXPECT_EQ(alone.exit_code, 0) << describe(alone);
  EXPECT_THAT(alone.err, ::testing::Not(HasSubstr("NodeAddr")));

  const auto pool = srun({"--dew-pool", "-N2", "--ntasks-per-node=2", pool_worker(), "exchange"});
  ASSERT_EQ(pool.exit_code, 0) << describe(pool);
  EXPECT_EQ(occurrences(pool.out, "gather=rank 0|rank 1|rank 2|rank 3 squares=0,1,4,9"), 4) << pool.out;
}

// A shaped link (tc htb at 20 Mbit/s on each node's way out) still carries a
// step of dew worker across the nodes: a smoke run, nothing about speed
// (bench/network measures); the link is unshaped again after.
TEST_F(NetnsCluster, AShapedLinkCarriesATrainingStepAcrossTheNodes) {
  const auto shaped = network({"shape", dir_, "20mbit"});
  ASSERT_EQ(shaped.exit_code, 0) << describe(shaped);
  const auto r = srun({"--dew-pool", "-N2", "--ntasks-per-node=2", dew_exe(), "worker", "--devices-per-process", "2",
                       "--mesh", "fsdp=4,replicas=2", "--steps", "2", "--cache-dir", "off"},
                      120s);
  const auto unshaped = network({"shape", dir_, "off"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("step 2/2: loss"));
  EXPECT_EQ(unshaped.exit_code, 0) << describe(unshaped);
  const auto bad = network({"shape", dir_, "fast"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("link rate 'fast' is not allowed; allowed: a tc rate such as 1kbit, 10mbit"));
}

}  // namespace
}  // namespace dew::testing
