// srun --dew-pool against a real two-node Slurm cluster (munged, slurmctld,
// two slurmd on this host) with the freshly built spank_dew.so.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netdb.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "pool_plan.h"
#include "slurm_cluster.h"
#include "srun_output.h"
#include "test_paths.h"

namespace dew::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

// How the other nodes reach process 0's node: by its name where that
// resolves, else by its NodeAddr from Slurm. The test cluster's node names
// (n1, n2) resolve nowhere; their NodeAddr is 127.0.0.1 (each node's own
// on a --netns cluster).
std::string reached_as(const std::string& node) {
  addrinfo* found = nullptr;
  const bool resolves = getaddrinfo(node.c_str(), nullptr, nullptr, &found) == 0;
  if (found != nullptr) freeaddrinfo(found);
  return resolves ? node : cluster().node_address(node);
}

const std::vector<std::string> kDewVariables = {"DEW_PROCESS_ID",
                                                "DEW_PROCESS_COUNT",
                                                "DEW_LOCAL_PROCESS_ID",
                                                "DEW_LOCAL_PROCESS_COUNT",
                                                "DEW_NODE_ID",
                                                "DEW_COORDINATOR_ADDRESS",
                                                "JAX_COORDINATOR_ADDRESS",
                                                "DEW_POOL_SECRET",
                                                "JAX_LOCAL_DEVICE_IDS",
                                                "DEW_WATCHDOG"};

TEST(SrunDewPool, EveryTaskOfTwoNodesGetsItsIdentityAndOneCoordinator) {
  auto tasks = srun_task_environments({"--dew-pool", "-N2", "-n4"});
  ASSERT_EQ(tasks.size(), 4u);

  const auto job = static_cast<std::uint32_t>(std::stoul(tasks[0]["SLURM_JOB_ID"]));
  const auto step = static_cast<std::uint32_t>(std::stoul(tasks[0]["SLURM_STEP_ID"]));
  const std::string host = reached_as("n1");
  const auto expected_address = host + ":" + std::to_string(dew::derive_port(job, step, dew::PortRange{}));
  // The framework's rendezvous: the same node, a port of its own.
  const auto framework_port = std::to_string(dew::derive_port(job, step, dew::kFrameworkPortRange));
  std::map<std::string, int> tasks_per_node;
  for (auto& [rank, env] : tasks) ++tasks_per_node[env["SLURM_NODEID"]];
  EXPECT_EQ(tasks_per_node.size(), 2u) << "both nodes run tasks";
  std::set<std::string> secrets;
  for (auto& [rank, env] : tasks) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(env["DEW_PROCESS_ID"], std::to_string(rank));
    EXPECT_EQ(env["DEW_PROCESS_ID"], env["SLURM_PROCID"]);
    EXPECT_EQ(env["DEW_PROCESS_COUNT"], "4");
    EXPECT_EQ(env["DEW_LOCAL_PROCESS_ID"], env["SLURM_LOCALID"]);
    EXPECT_EQ(env["DEW_LOCAL_PROCESS_COUNT"], std::to_string(tasks_per_node[env["SLURM_NODEID"]]));
    EXPECT_EQ(env["DEW_NODE_ID"], env["SLURM_NODEID"]);
    EXPECT_EQ(env["DEW_COORDINATOR_ADDRESS"], expected_address);
    EXPECT_EQ(env["JAX_COORDINATOR_ADDRESS"], host + ":" + framework_port);
    // torchrun's contract, for an unmodified init_process_group("gloo").
    EXPECT_EQ(env["MASTER_ADDR"], host);
    EXPECT_EQ(env["MASTER_PORT"], framework_port);
    EXPECT_EQ(env["RANK"], env["SLURM_PROCID"]);
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOCAL_RANK"], env["SLURM_LOCALID"]);
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], env["DEW_LOCAL_PROCESS_COUNT"]);
    EXPECT_EQ(env["GROUP_RANK"], env["SLURM_NODEID"]);
    EXPECT_TRUE(std::regex_match(env["DEW_POOL_SECRET"], std::regex("[0-9a-f]{64}"))) << env["DEW_POOL_SECRET"];
    secrets.insert(env["DEW_POOL_SECRET"]);
    EXPECT_EQ(env.count("SLURM_DEW_POOL_SECRET"), 0u) << "the carrier variable is removed";
    EXPECT_EQ(env["XLA_FLAGS"], "--xla_gpu_execution_terminate_timeout=30m");
  }
  EXPECT_EQ(secrets.size(), 1u) << "one secret per step, equal on every node";
}

TEST(SrunDewPool, EachStepDrawsItsOwnSecret) {
  auto first = task_environments(cluster().srun({"--dew-pool", "-N2", "-n2", "-l", "env"}, {}, 30s).out);
  auto second = task_environments(cluster().srun({"--dew-pool", "-N2", "-n2", "-l", "env"}, {}, 30s).out);
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_NE(first[0]["DEW_POOL_SECRET"], second[0]["DEW_POOL_SECRET"]);
}

TEST(SrunDewPool, SrunHelpListsEveryOption) {
  auto r = cluster().srun({"--help"}, {}, 30s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (const char* option : {"--dew-pool", "--dew-devices-per-process=N", "--dew-port=PORT", "--dew-coordinator=HOST",
                             "--dew-multi-host", "--dew-watchdog=DURATION|off", "--dew-kill-on-bad-exit=yes|no"}) {
    EXPECT_THAT(r.out, HasSubstr(option));
  }
}

TEST(SrunDewPool, StepWithoutDewPoolIsUntouched) {
  auto tasks = srun_task_environments({"-N2", "-n2"}, {{"XLA_FLAGS", "--xla_dump_to=/tmp/x"}});
  ASSERT_EQ(tasks.size(), 2u);
  for (auto& [rank, env] : tasks) {
    for (const auto& name : kDewVariables) EXPECT_EQ(env.count(name), 0u) << name << " in rank " << rank;
    EXPECT_EQ(env["XLA_FLAGS"], "--xla_dump_to=/tmp/x");
  }
}

TEST(SrunDewPool, SecretSurvivesExportNone) {
  auto r = cluster().srun({"--dew-pool", "--export=NONE", "-N2", "-n2", "-l", "/usr/bin/env"}, {}, 30s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  auto tasks = task_environments(r.out);
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_TRUE(std::regex_match(tasks[0]["DEW_POOL_SECRET"], std::regex("[0-9a-f]{64}")));
  EXPECT_EQ(tasks[0]["DEW_POOL_SECRET"], tasks[1]["DEW_POOL_SECRET"]);
  EXPECT_EQ(tasks[1]["DEW_PROCESS_ID"], "1");
  EXPECT_THAT(tasks[1]["DEW_COORDINATOR_ADDRESS"], HasSubstr(reached_as("n1") + ":"));
}

TEST(SrunDewPool, TwoStepsAtOnceInOneAllocationGetDifferentPorts) {
  // Both steps print their address, then stay up long enough to overlap.
  const std::string step =
      "srun --dew-pool -N2 -n2 --overlap bash -c 'echo \"$SLURM_STEP_ID $DEW_COORDINATOR_ADDRESS\"; sleep 2'";
  auto r = cluster().command({"salloc", "-N2", "-n4", "bash", "-c", step + " & " + step + " & wait"}, {}, 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  std::map<std::string, std::set<std::string>> addresses_by_step;
  std::istringstream lines(r.out);
  for (std::string step_id, address; lines >> step_id >> address;) addresses_by_step[step_id].insert(address);
  ASSERT_EQ(addresses_by_step.size(), 2u) << r.out;
  std::set<std::string> all;
  for (auto& [id, addresses] : addresses_by_step) {
    EXPECT_EQ(addresses.size(), 1u) << "step " << id << " tasks disagree";
    all.insert(addresses.begin(), addresses.end());
  }
  EXPECT_EQ(all.size(), 2u) << r.out;
}

TEST(SrunDewPool, BadOptionValueFailsBeforeAnyTaskRuns) {
  const auto marker = marker_path("bad-port");
  auto r = cluster().srun({"--dew-pool", "--dew-port=80", "-N1", "-n1", "touch", marker}, {}, 30s);
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("dew: --dew-port: '80' is not allowed; allowed: an integer from 1024 to 65535"));
  EXPECT_FALSE(std::filesystem::exists(marker));

  r = cluster().srun({"--dew-pool", "--dew-watchdog=soon", "-N1", "-n1", "touch", marker}, {}, 30s);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--dew-watchdog: 'soon'"));
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST(SrunDewPool, AnOptionGivenTwiceWithDifferentValuesIsRefused) {
  const auto marker = marker_path("twice");
  auto r =
      cluster().srun({"--dew-pool", "--dew-port=30001", "--dew-port=30002", "-N1", "-n1", "touch", marker}, {}, 30s);
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("--dew-port was given twice, as '30001' and '30002'"));
  EXPECT_FALSE(std::filesystem::exists(marker));
  r = cluster().srun({"--dew-pool", "--dew-port=30001", "--dew-port=30001", "-N1", "-n1", "touch", marker}, {}, 30s);
  EXPECT_EQ(r.exit_code, 0) << "the same value again is the same request: " << describe(r);
  EXPECT_TRUE(std::filesystem::exists(marker));
}

TEST(SrunDewPool, OptionsWithoutDewPoolAreRefused) {
  const auto marker = marker_path("orphan-option");
  auto r = cluster().srun({"--dew-port=20000", "-N1", "-n1", "touch", marker}, {}, 30s);
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("--dew-port given without --dew-pool"));
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST(SrunDewPool, BadPlugstackArgumentFailsInSrun) {
  const auto marker = marker_path("bad-plugstack-srun");
  const auto conf = cluster().conf_with_plugstack_args("bad-srun", "port_range=9-1");
  auto r = cluster().srun({"--dew-pool", "-N1", "-n1", "touch", marker}, {{"SLURM_CONF", conf}}, 30s);
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("dew: plugstack.conf port_range: '9-1' is not allowed"));
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST(SrunDewPool, BadPlugstackArgumentOnTheNodesFailsTheTasks) {
  const auto marker = marker_path("bad-plugstack-node");
  // srun reads a good copy; the nodes' slurmstepd reads the bad one.
  const auto good = cluster().conf_with_plugstack_args("good-srun", "");
  cluster().set_plugstack_args("kill_on_bad_exit=maybe");
  auto r = cluster().srun({"--dew-pool", "-N2", "-n2", "touch", marker}, {{"SLURM_CONF", good}}, 30s);
  cluster().set_plugstack_args("");
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("kill_on_bad_exit: 'maybe' is not allowed; allowed: yes or no"));
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST(SrunDewPool, PlugstackPortRangeAndWatchdogApply) {
  cluster().set_plugstack_args("port_range=35000-35000 watchdog=2h");
  auto r = cluster().srun({"--dew-pool", "-N2", "-n2", "-l", "env"}, {}, 30s);
  cluster().set_plugstack_args("");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  auto tasks = task_environments(r.out);
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_EQ(tasks[1]["DEW_COORDINATOR_ADDRESS"], reached_as("n1") + ":35000");
  EXPECT_EQ(tasks[1]["XLA_FLAGS"], "--xla_gpu_execution_terminate_timeout=2h");
}

TEST(SrunDewPool, PortAndCoordinatorOptionsOverride) {
  auto tasks = srun_task_environments({"--dew-pool", "--dew-port=31555", "--dew-coordinator=127.0.0.1", "-N2", "-n2"});
  ASSERT_EQ(tasks.size(), 2u);
  for (auto& [rank, env] : tasks) EXPECT_EQ(env["DEW_COORDINATOR_ADDRESS"], "127.0.0.1:31555");
}

TEST(SrunDewPool, FailingRankEndsTheWholeStepWithinSeconds) {
  auto r = cluster().srun({"--dew-pool", "-N2", "-n4", "bash", "-c",
                           "if [ \"$DEW_PROCESS_ID\" = 1 ]; then sleep 0.5; exit 3; fi; sleep 600"},
                          {}, 60s);
  EXPECT_FALSE(r.timed_out) << describe(r);
  EXPECT_LT(r.seconds, 5.0) << describe(r);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("dew: rank 1 ended with exit code 3; ending step")) << describe(r);
  // One line about the failure, not one per killed peer.
  EXPECT_EQ(std::regex_search(r.err, std::regex("rank [023] ended with")), false) << r.err;
}

TEST(SrunDewPool, RankKilledBySignalIsNamed) {
  auto r = cluster().srun(
      {"--dew-pool", "-N2", "-n2", "bash", "-c", "if [ \"$DEW_PROCESS_ID\" = 1 ]; then kill -SEGV $$; fi; sleep 600"},
      {}, 60s);
  EXPECT_LT(r.seconds, 5.0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("dew: rank 1 ended with signal 11 (SIGSEGV)")) << describe(r);
}

// The node that ends the step sends SIGKILL to what caught its SIGTERM
// kStepKillGrace later, but only while its own slurmstepd lives: here its
// one task has ended, so it exits first. srun, which waits for every task,
// ends the step again. (The same way out for a task that started after the
// step's end reached its node, a Slurm launch race for a rank that fails in
// the step's first ~200 ms, seen once in CI on 22.05.)
TEST(SrunDewPool, ATaskOnAnotherNodeThatCatchesSigtermIsKilledWhenTheStepEnds) {
  auto r = cluster().srun({"--dew-pool", "-N2", "-n2", "bash", "-c",
                           "if [ \"$DEW_PROCESS_ID\" = 1 ]; then sleep 0.5; exit 3; fi; trap '' TERM; "
                           "while :; do sleep 0.1; done"},
                          {}, 60s);
  EXPECT_FALSE(r.timed_out) << describe(r);
  EXPECT_LT(r.seconds, 8.0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("dew: rank 1 ended with exit code 3; ending step")) << describe(r);
  EXPECT_EQ(std::regex_search(r.err, std::regex("rank 0 ended with")), false) << r.err;
}

// A site whose firewall lets the nodes reach srun on Slurm's SrunPortRange
// alone (the test cluster sets 32000-32767): srun's listener for the
// nodes' failure notices takes a port of it, as srun's own sockets do.
TEST(SrunDewPool, TheNodesNoticesComeToAPortOfSrunPortRange) {
  std::ifstream conf(cluster().conf());
  const std::string text((std::istreambuf_iterator<char>(conf)), std::istreambuf_iterator<char>());
  std::smatch range;
  ASSERT_TRUE(std::regex_search(text, range, std::regex(R"(\nSrunPortRange=(\d+)-(\d+))"))) << cluster().conf();
  auto r = cluster().srun(
      {"-v", "--dew-pool", "-N2", "-n2", "bash", "-c", "if [ \"$DEW_PROCESS_ID\" = 1 ]; then exit 3; fi; sleep 600"},
      {}, 60s);
  std::smatch port;
  ASSERT_TRUE(
      std::regex_search(r.err, port, std::regex(R"(failure notices come to srun's port (\d+) \(of SrunPortRange\))")))
      << describe(r);
  EXPECT_GE(std::stoi(port[1]), std::stoi(range[1])) << describe(r);
  EXPECT_LE(std::stoi(port[1]), std::stoi(range[2])) << describe(r);
  // Named once, by srun from the node's notice.
  EXPECT_THAT(r.err, HasSubstr("dew: rank 1 ended with exit code 3; ending step")) << describe(r);
  EXPECT_LT(r.seconds, 8.0) << describe(r);
}

TEST(SrunDewPool, KillOnBadExitOffLetsTheOthersFinish) {
  auto r = cluster().srun({"--dew-pool", "--dew-kill-on-bad-exit=no", "-N2", "-n4", "-l", "bash", "-c",
                           "if [ \"$DEW_PROCESS_ID\" = 1 ]; then exit 3; fi; sleep 2; echo finished"},
                          {}, 60s);
  EXPECT_FALSE(r.timed_out) << describe(r);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, Not(HasSubstr("ending step")));
  for (const char* rank : {"0", "2", "3"})
    EXPECT_THAT(r.out, HasSubstr(std::string(rank) + ": finished")) << describe(r);
  EXPECT_THAT(r.out, Not(HasSubstr("1: finished")));
}

TEST(SrunDewPool, KillOnBadExitOffFromPlugstack) {
  cluster().set_plugstack_args("kill_on_bad_exit=no");
  auto r = cluster().srun({"--dew-pool", "-N2", "-n2", "-l", "bash", "-c",
                           "if [ \"$DEW_PROCESS_ID\" = 1 ]; then exit 3; fi; sleep 2; echo finished"},
                          {}, 60s);
  cluster().set_plugstack_args("");
  EXPECT_THAT(r.out, HasSubstr("0: finished")) << describe(r);
}

TEST(SrunDewPool, SingleTaskFormsNoPoolUnlessMultiHost) {
  auto r = cluster().srun({"--dew-pool", "-N1", "-n1", "-l", "env"},
                          {{"DEW_COORDINATOR_ADDRESS", "stale:1"}, {"JAX_COORDINATOR_ADDRESS", "stale:1"}}, 30s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  auto env = task_environments(r.out)[0];
  EXPECT_EQ(env["DEW_PROCESS_ID"], "0");
  EXPECT_EQ(env["DEW_PROCESS_COUNT"], "1");
  EXPECT_EQ(env.count("DEW_COORDINATOR_ADDRESS"), 0u) << "an inherited coordinator is removed";
  // One task's framework rendezvous is on its own machine.
  EXPECT_THAT(env["JAX_COORDINATOR_ADDRESS"], ::testing::StartsWith("127.0.0.1:"));
  EXPECT_EQ(env["RANK"], "0");
  EXPECT_EQ(env["WORLD_SIZE"], "1");
  EXPECT_EQ(env.count("DEW_POOL_SECRET"), 0u);

  r = cluster().srun({"--dew-pool", "--dew-multi-host", "-N1", "-n1", "-l", "env"}, {}, 30s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  env = task_environments(r.out)[0];
  EXPECT_EQ(env["DEW_PROCESS_COUNT"], "1");
  // On the step's one node, whichever Slurm chose (n1 while n2 is free, or
  // n2 while n1 is still completing the previous test's job).
  ASSERT_FALSE(env["SLURMD_NODENAME"].empty()) << describe(r);
  EXPECT_THAT(env["DEW_COORDINATOR_ADDRESS"], HasSubstr(reached_as(env["SLURMD_NODENAME"]) + ":"));
  EXPECT_EQ(env["DEW_POOL_SECRET"].size(), 64u);
  // libdew and dew env see a pool of one, not a process alone.
  r = cluster().srun({"--dew-pool", "--dew-multi-host", "-N1", "-n1", dew_exe(), "env"}, {}, 30s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("source:       slurm")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("process:      0 of 1")) << r.out;
}

TEST(SrunDewPool, XlaFlagsAlreadyHoldingTheWatchdogAreKept) {
  const std::string flags = "--xla_gpu_execution_terminate_timeout=5m --xla_dump_to=/tmp/d";
  auto r = cluster().srun({"--dew-pool", "-N2", "-n2", "-l", "env"}, {{"XLA_FLAGS", flags}}, 30s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  auto tasks = task_environments(r.out);
  ASSERT_EQ(tasks.size(), 2u) << describe(r);  // a loop over nothing would pass
  for (auto& [rank, env] : tasks) EXPECT_EQ(env["XLA_FLAGS"], flags);

  r = cluster().srun({"--dew-pool", "--dew-watchdog=45m", "-N1", "-n2", "-l", "env"},
                     {{"XLA_FLAGS", "--xla_dump_to=/tmp/d"}}, 30s);
  tasks = task_environments(r.out);
  ASSERT_EQ(tasks.size(), 2u) << describe(r);
  EXPECT_EQ(tasks[1]["XLA_FLAGS"], "--xla_dump_to=/tmp/d --xla_gpu_execution_terminate_timeout=45m");
  EXPECT_EQ(tasks[1]["DEW_WATCHDOG"], "45m") << "the bound reaches libdew and Python too";

  r = cluster().srun({"--dew-pool", "--dew-watchdog=off", "-N1", "-n2", "-l", "env"}, {}, 30s);
  tasks = task_environments(r.out);
  ASSERT_EQ(tasks.size(), 2u) << describe(r);
  EXPECT_EQ(tasks[0].count("XLA_FLAGS"), 0u);
  EXPECT_EQ(tasks[0].count("DEW_PROCESS_ID"), 1u) << "the task did get the pool's variables";
}

TEST(SrunDewPool, DevicesPerProcessWithoutGpusFailsBeforeExec) {
  const auto marker = marker_path("no-gpus");
  auto r = cluster().srun({"--dew-pool", "--dew-devices-per-process=1", "-N1", "-n2", "touch", marker}, {}, 30s);
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("needs GPUs [0, 1) with 1 device per process, but this node has 0 GPUs"));
  EXPECT_FALSE(std::filesystem::exists(marker));
}

}  // namespace
}  // namespace dew::testing
