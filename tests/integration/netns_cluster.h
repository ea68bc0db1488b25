// The test cluster with nodes of their own addresses: a two-node cluster
// (scripts/slurm-testbed --netns), each slurmd in a network namespace with
// its own address on a bridge, so a pool's processes on n1 and n2 really
// talk across a link, which can be shaped (tc htb) or cut. Each suite on it
// starts its own and stops it, namespaces and all. Needs root (ip netns);
// skipped otherwise, saying so.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "process.h"
#include "slurm_cluster.h"
#include "srun_output.h"

namespace dew::testing {

class NetnsTestbed : public ::testing::Test {
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
    const auto started = run(argv, env(), std::chrono::seconds(90));
    if (started.exit_code != 0) {
      start_error_ = describe(started);
      dir_.clear();
    }
  }
  static void TearDownTestSuite() {
    if (dir_.empty()) return;
    const auto ours = own_namespaces();
    EXPECT_EQ(ours.size(), 2u) << "one per node";
    const auto stopped =
        run({SlurmCluster::source_root() + "/scripts/slurm-testbed", "stop", dir_}, env(), std::chrono::seconds(60));
    // Its namespaces and bridge are gone with it, whatever the tests did.
    EXPECT_EQ(stopped.exit_code, 0) << describe(stopped);
    // (Other clusters' stay: the main one's, another shard's.)
    for (const auto& name : namespace_names()) EXPECT_EQ(ours.count(name), 0u) << name << " is left";
    std::error_code ignored;
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir_, ignored);
    dir_.clear();
  }
  // This cluster's network namespaces, as scripts/testbed-network recorded
  // them in DIR/network ("netns NAME" lines).
  static std::set<std::string> own_namespaces() {
    std::set<std::string> names;
    std::ifstream state(dir_ + "/network");
    for (std::string kind, name; state >> kind >> name;) {
      if (kind == "netns") names.insert(name);
    }
    return names;
  }
  // The network namespaces on this machine, by name.
  static std::set<std::string> namespace_names() {
    std::set<std::string> names;
    std::istringstream lines(run({"ip", "netns", "list"}).out);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty()) names.insert(line.substr(0, line.find(' ')));
    }
    return names;
  }
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
    ASSERT_FALSE(dir_.empty()) << "scripts/slurm-testbed start --netns failed: " << start_error_;
  }
  // The cluster's client environment, plus `extra` (DEW_* settings reach
  // the tasks: srun exports the environment), and DEW_TEST_CLUSTER, which
  // marks this cluster's tasks among other shards' processes.
  static std::map<std::string, std::string> env(std::map<std::string, std::string> extra = {}) {
    auto all =
        cluster().client_env({{"SLURM_CONF", dir_.empty() ? "" : dir_ + "/slurm.conf"}, {"DEW_TEST_CLUSTER", dir_}});
    for (auto& [name, value] : extra) all[name] = value;
    return all;
  }
  static RunResult srun(std::vector<std::string> args, std::chrono::seconds limit = std::chrono::seconds(60)) {
    args.insert(args.begin(), "srun");
    return run(args, env(), limit);
  }
  // scripts/testbed-network ARGS... on this cluster's network.
  static RunResult network(const std::vector<std::string>& args) {
    std::vector<std::string> argv{SlurmCluster::source_root() + "/scripts/testbed-network"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv, env(), std::chrono::seconds(30));
  }

  static inline std::string dir_;
  static inline std::string start_error_;
};

}  // namespace dew::testing
