// `dew launch --slurm` on the two-node test cluster, with and without the
// SPANK plugin.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>

#include "launch_helpers.h"
#include "slurm_cluster.h"
#include "srun_output.h"
#include "test_paths.h"

namespace dew::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

// --------------------------------------------------------------------- slurm

TEST(LaunchSlurm, WithThePluginRanksComeFromThePool) {
  // salloc gives the two-node allocation; dew launch --slurm runs srun in it.
  auto r = cluster().command({"salloc", "-N2", "--ntasks-per-node=2", "--quiet", dew_exe(), "launch", "--slurm",
                              "--processes-per-host", "2", "--env", "GREETING=it's $(not run)", "--", "/bin/sh", "-c",
                              kPrintIdentity + "; echo greeting=\"$GREETING\" node=$SLURM_NODEID"},
                             {}, 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  auto ids = identities(r.out);
  ASSERT_EQ(ids.size(), 4u) << describe(r);
  const std::string n1 = cluster().node_address("n1");
  for (const auto& [rank, i] : ids) {
    EXPECT_EQ(i.id, rank);
    EXPECT_EQ(i.count, 4);
    EXPECT_EQ(i.local_count, 2);
    // n1's NodeAddr: its name resolves nowhere.
    EXPECT_THAT(i.coord, MatchesRegex(n1 + ":[0-9]+"));
    EXPECT_THAT(i.secret, MatchesRegex("[0-9a-f]{64}"));
    EXPECT_THAT(r.out, HasSubstr("[" + std::to_string(rank) +
                                 "] greeting=it's $(not run) node=" + std::to_string(rank / 2) + "\n"));
  }
}

// Inside an allocation's one-task step (as after `srun --pty bash`), dew
// launch's processes form the pool it launched: they used to inherit the
// step's SLURM_PROCID=0 SLURM_NTASKS=1, which the join read before Dew's own
// variables, and each was "alone, rank 0 of 1" (three unconnected
// programs, exit 0, no error). A process given Dew's variables for a pool of
// 4 by something else in that step is refused, naming both.
TEST(LaunchSlurm, InsideAOneTaskStepDewLaunchsProcessesFormTheirOwnPool) {
  auto r = cluster().srun({"-n1", dew_exe(), "launch", "--processes-per-host", "3", "--", pool_worker(), "exchange"},
                          {}, 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_THAT(r.out,
                HasSubstr("[" + std::to_string(rank) + "] RESULT rank=" + std::to_string(rank) + " size=3 source=dew"))
        << describe(r);
  }
  auto mixed = cluster().srun({"-n1", "env", "DEW_PROCESS_ID=2", "DEW_PROCESS_COUNT=4",
                               "DEW_COORDINATOR_ADDRESS=127.0.0.1:5555", dew_exe(), "env", "--json"},
                              {}, 60s);
  EXPECT_NE(mixed.exit_code, 0) << describe(mixed);
  EXPECT_THAT(mixed.err, HasSubstr("DEW_PROCESS_ID=2 DEW_PROCESS_COUNT=4 (a Dew launcher's) and SLURM_PROCID=0 "
                                   "SLURM_NTASKS=1 (a Slurm step's)"))
      << describe(mixed);
}

TEST(LaunchSlurm, DryRunShowsSrunWithDewOptions) {
  auto r = cluster().command({dew_exe(), "launch", "--slurm", "--dry-run", "--processes-per-host", "8",
                              "--devices-per-process", "1", "--env", "A=1", "--", "/opt/venv/bin/python", "train.py"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  // With the plugin, its kill-on-bad-exit ends a failed step (srun's own is left off).
  EXPECT_EQ(r.out,
            "slurm: env DEW_LINES_PREFIXED=1 'DEW_NOTICE_TAG=<16 hex digits, drawn at launch>' A=1 srun "
            "--ntasks-per-node=8 --export=ALL --label --dew-pool "
            "--dew-devices-per-process=1 /opt/venv/bin/python train.py\n");
}

TEST(LaunchSlurm, AFailedTaskEndsTheStep) {
  auto r = cluster().command(
      {"salloc", "-N2", "--ntasks-per-node=2", "--quiet", dew_exe(), "launch", "--slurm", "--processes-per-host", "2",
       "--", "/bin/sh", "-c", "if [ $SLURM_PROCID = 1 ]; then sleep 0.5; exit 3; fi; exec sleep 60"},
      {}, 60s);
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_LT(r.seconds, 20) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("rank 1")) << describe(r);
}

TEST(LaunchSlurm, ARuntimePoolsFailureGivesTheFailingRanksCodeAndOnePrefix) {
  // libdew's peers end with 75 and srun with the largest code, 75: the
  // launcher exits with rank 1's own code, and names its node, from the
  // failure records (rank 1's own, and the plugin's verdict).
  auto r = cluster().command(
      {"salloc", "-N2", "--ntasks-per-node=2", "--quiet", dew_exe(), "launch", "--slurm", "--processes-per-host", "2",
       "--coordinator", cluster().node_address("n1"), "--", pool_worker(), "fail", "1", "3"},
      {}, 60s);
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("[1] error: data loader raised on rank 1")) << describe(r);
  EXPECT_THAT(r.err, Not(HasSubstr("[1] [1]"))) << "libdew's prefix and srun's label: once";
  EXPECT_THAT(r.err, HasSubstr("the failing rank: rank 1 on n1 (")) << describe(r);
}

TEST(LaunchSlurm, WithoutThePluginSrunRunsPlainAndDevicesPerProcessIsRefused) {
  const std::map<std::string, std::string> env = {{"SLURM_CONF", cluster().conf_without_plugin()}};
  auto r = cluster().command({dew_exe(), "launch", "--slurm", "--processes-per-host", "2", "--", "/bin/sh", "-c",
                              "echo rank=$SLURM_PROCID secret=${#DEW_POOL_SECRET} xla=$XLA_FLAGS"},
                             env, 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  // The launcher's secret (64 hex digits) and watchdog, as the plugin would give.
  EXPECT_THAT(r.out, HasSubstr("[0] rank=0 secret=64 xla=--xla_gpu_execution_terminate_timeout=30m\n"));
  EXPECT_THAT(r.out, HasSubstr("[1] rank=1 secret=64 xla=--xla_gpu_execution_terminate_timeout=30m\n"));
  auto refused =
      cluster().command({dew_exe(), "launch", "--slurm", "--devices-per-process", "1", "--", "/bin/true"}, env, 60s);
  EXPECT_EQ(refused.exit_code, 2) << describe(refused);
  EXPECT_THAT(refused.err,
              HasSubstr("dew launch: --devices-per-process with --slurm needs Dew's SPANK plugin (srun --dew-pool), "
                        "which this srun does not load; without it JAX gives each task the one GPU at "
                        "SLURM_LOCALID"));
  auto dry = cluster().command({dew_exe(), "launch", "--slurm", "--dry-run", "--", "/bin/true"}, env, 60s);
  EXPECT_EQ(dry.out,
            "slurm: env DEW_LINES_PREFIXED=1 'DEW_NOTICE_TAG=<16 hex digits, drawn at launch>' "
            "'DEW_POOL_SECRET=<64 hex digits, drawn at launch>' "
            "XLA_FLAGS=--xla_gpu_execution_terminate_timeout=30m DEW_WATCHDOG=30m srun --ntasks-per-node=1 "
            "--kill-on-bad-exit=1 --export=ALL --label /bin/true\n");
}

TEST(LaunchSlurm, WithoutThePluginTheLauncherGivesThePoolItsSecretAndCoordinator) {
  // Without the plugin every libdew process needs DEW_POOL_SECRET: the
  // launcher draws it (in srun's environment, on no command line) and the
  // coordinator from --coordinator (the node names of this one-host cluster
  // do not resolve).
  const std::map<std::string, std::string> env = {{"SLURM_CONF", cluster().conf_without_plugin()}};
  auto r = cluster().command(
      {"salloc", "-N2", "--ntasks-per-node=2", "--quiet", dew_exe(), "launch", "--slurm", "--processes-per-host", "2",
       "--coordinator", cluster().node_address("n1"), "--", pool_worker(), "exchange"},
      env, 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(occurrences(r.out, "gather=rank 0|rank 1|rank 2|rank 3 squares=0,1,4,9"), 4) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("[3] Joined the pool: process 3 of 4 (slurm, tcp)")) << describe(r);
  auto dry = cluster().command(
      {dew_exe(), "launch", "--slurm", "--dry-run", "--coordinator", "10.0.0.1", "--port", "23456", "--", "/bin/true"},
      env, 60s);
  EXPECT_THAT(dry.out, HasSubstr("DEW_POOL_SECRET=<64 hex digits, drawn at launch>")) << describe(dry);
  EXPECT_THAT(dry.out, HasSubstr("DEW_COORDINATOR_ADDRESS=10.0.0.1:23456")) << describe(dry);
}

}  // namespace
}  // namespace dew::testing
