// The test cluster with nodes of their own addresses: a second two-node
// cluster (scripts/slurm-testbed --netns), each slurmd in a network
// namespace with its own address on a bridge, so a pool's processes on n1
// and n2 really talk across a link, which can be shaped (tc htb). Needs root
// (ip netns); skipped otherwise, saying so.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <regex>
#include <set>

#include "process.h"
#include "slurm_cluster.h"
#include "srun_output.h"
#include "test_paths.h"

namespace dew::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

class NetnsCluster : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() != 0) return;
    char pattern[] = "/tmp/dew-netns-XXXXXX";
    if (mkdtemp(pattern) == nullptr) return;
    dir_ = pattern;
    std::vector<std::string> argv{SlurmCluster::source_root() + "/scripts/slurm-testbed",
                                  "start",
                                  dir_,
                                  "--netns",
                                  "--plugin",
                                  cluster().plugin()};
    if (!cluster().slurm_root().empty()) argv.insert(argv.end(), {"--slurm-root", cluster().slurm_root()});
    const auto started = run(argv, env(), 90s);
    if (started.exit_code != 0) {
      start_error_ = describe(started);
      dir_.clear();
    }
  }
  static void TearDownTestSuite() {
    if (dir_.empty()) return;
    const auto stopped = run({SlurmCluster::source_root() + "/scripts/slurm-testbed", "stop", dir_}, env(), 60s);
    // Its namespaces and bridge are gone with it, whatever the tests did.
    EXPECT_EQ(stopped.exit_code, 0) << describe(stopped);
    EXPECT_EQ(run({"ip", "netns", "list"}).out.find("dew-"), std::string::npos) << run({"ip", "netns", "list"}).out;
    std::error_code ignored;
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir_, ignored);
  }
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
    ASSERT_FALSE(dir_.empty()) << "scripts/slurm-testbed start --netns failed: " << start_error_;
  }
  static std::map<std::string, std::string> env() {
    return cluster().client_env({{"SLURM_CONF", dir_.empty() ? "" : dir_ + "/slurm.conf"}});
  }
  static RunResult srun(std::vector<std::string> args, std::chrono::seconds limit = 60s) {
    args.insert(args.begin(), "srun");
    return run(args, env(), limit);
  }
  static RunResult network(const std::vector<std::string>& args) {
    std::vector<std::string> argv{SlurmCluster::source_root() + "/scripts/testbed-network"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv, env(), 30s);
  }

  static inline std::string dir_;
  static inline std::string start_error_;
};

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
