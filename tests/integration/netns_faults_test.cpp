// Network faults on the namespaced cluster (netns_cluster.h), made from
// outside the pool: n2's link taken down mid-step, during the join and
// while process 0 waits at a checkpoint's agreement, and n2's link dropped
// to a crawl (1 kbit/s). Every process ends within the documented bound
// (docs/guide/failures.md, "Network faults"): the heartbeat timeout (3-4 s here) and a
// second or two to leave, or the join timeout; process 0 names the lost
// peer; srun ends and exits 75. srun runs with -W 2: a node cut off cannot
// send srun its tasks' exits, and plain srun waits until Slurm sets the node
// DOWN (SlurmdTimeout: 10 s on this cluster, 27 s from the cut to srun's
// end; 300 s by default), which these tests leave to that page. A link
// that comes back after the tasks ended no longer leaves plain srun waiting
// for ever: its plugin ends it (srun_watch.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "netns_cluster.h"
#include "test_paths.h"

namespace dew::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class NetnsFaults : public NetnsTestbed {
 protected:
  // Whatever a test did, n2's link is up and unshaped after it, and n2 back
  // in service (a node Slurm set DOWN returns by ReturnToService=2).
  void TearDown() override {
    if (dir_.empty() || geteuid() != 0) return;
    network({"cut", dir_, "n2", "up"});
    network({"shape", dir_, "off", "n2"});
    EXPECT_TRUE(until([] { return node_state("n2").find("idle") == 0; }, 60s)) << node_state("n2");
  }

  static std::string node_state(const std::string& node) {
    return run({"sinfo", "-h", "-N", "-n", node, "-o", "%T"}, env(), 10s).out;
  }

  // Polls `done` every 50 ms until it holds or `limit` passes.
  static bool until(const std::function<bool()>& done, std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    while (!done()) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(50ms);
    }
    return true;
  }

  // This cluster's processes of `program` (every node's): those whose
  // environment has this cluster's DEW_TEST_CLUSTER (env()).
  static int processes_of(const std::string& program) {
    return int(processes_with(program, {"DEW_TEST_CLUSTER=" + dir_}).size());
  }

  // A pool step of `dew worker` that trains until something ends it. With
  // `srun_wait`, srun ends the rest that many seconds after a first exit.
  static std::vector<std::string> endless_worker_step(std::optional<int> srun_wait) {
    std::vector<std::string> argv{"srun"};
    if (srun_wait) argv.insert(argv.end(), {"-W", std::to_string(*srun_wait)});
    argv.insert(argv.end(), {"--dew-pool", "-N2", "--ntasks-per-node=1", dew_exe(), "worker", "--steps", "100000",
                             "--cache-dir", "off"});
    return argv;
  }

  // Seconds from `since` until no process of `program` is left (-1: some
  // still ran after `limit`).
  static double seconds_until_gone(const std::string& program, Clock::time_point since,
                                   std::chrono::milliseconds limit) {
    if (!until([&] { return processes_of(program) == 0; }, limit)) return -1;
    return std::chrono::duration<double>(Clock::now() - since).count();
  }
};

// n2's link goes down mid-step. Process 0 finds process 1 silent at the
// heartbeat timeout and ends, naming it; process 1, cut off, finds the
// service silent and ends too (its line cannot reach srun).
TEST_F(NetnsFaults, ALinkDownMidStepEndsEveryProcessAtTheHeartbeatTimeoutNamingTheLostPeer) {
  Spawned step(endless_worker_step(2), env({{"DEW_HEARTBEAT_TIMEOUT_SECONDS", "3"}}));
  ASSERT_TRUE(step.wait_for_output("step 5/", 60s)) << step.err();
  ASSERT_EQ(processes_of(dew_exe()), 2);
  const auto cut = Clock::now();
  const auto down = network({"cut", dir_, "n2", "down"});
  ASSERT_EQ(down.exit_code, 0) << describe(down);

  const double gone = seconds_until_gone(dew_exe(), cut, 30s);
  // Silence counts from the last heartbeat heard, up to 0.75 s before the cut.
  EXPECT_GT(gone, 2.0) << "ended before the heartbeat timeout (3 s)";
  EXPECT_LT(gone, 8.0) << "the bound: 3 s x 1.25 + 1 s to leave, and slack";
  ASSERT_EQ(step.wait(30s), 75) << step.err();
  EXPECT_THAT(step.err(), HasSubstr("[0] ending: process 1 failed: process 1 stopped answering: no heartbeat for 3 s"));
  // One verdict for the step, the pool's: no node's plugin blames a rank
  // (each saw only its own rank's 75).
  EXPECT_THAT(step.err(), Not(HasSubstr("dew: rank "))) << step.err();
  std::printf("link down mid-step: every process gone %.1f s after the cut, srun %.1f s after its start\n", gone,
              step.seconds());
}

// n2's link goes down while both processes are in the middle of 4 MiB
// gathers (a part half sent, a reply half read): each still ends within
// the heartbeat bound (as it did before the bounded writes: a cut link
// closes neither side; the frozen service is the case that hung, in
// tests/unit/pool/local_test.cpp).
TEST_F(NetnsFaults, ALinkDownDuringLargeGathersEndsEveryProcessWithinTheHeartbeatBound) {
  Spawned step({"srun", "-W", "2", "--dew-pool", "-N2", "--ntasks-per-node=1", pool_worker(), "gather",
                std::to_string(4 << 20), "100000"},
               env({{"DEW_HEARTBEAT_TIMEOUT_SECONDS", "3"}}));
  ASSERT_TRUE(step.wait_for_output("[1] Joined the pool", 60s)) << step.err();
  std::this_thread::sleep_for(1s);
  ASSERT_EQ(processes_of(pool_worker()), 2);
  const auto cut = Clock::now();
  ASSERT_EQ(network({"cut", dir_, "n2", "down"}).exit_code, 0);
  const double gone = seconds_until_gone(pool_worker(), cut, 30s);
  EXPECT_GT(gone, 0) << "a process still ran 30 s after the cut";
  EXPECT_LT(gone, 8.0) << "the bound: 3 s x 1.25 + 1 s to leave, and slack";
  step.wait(30s);
  EXPECT_THAT(step.err(), HasSubstr("[0] ending: process 1 failed: ")) << step.err();
  EXPECT_THAT(step.err(), Not(HasSubstr("dew: rank "))) << step.err();
  std::printf("link down during 4 MiB gathers: every process gone %.1f s after the cut\n", gone);
}

// n2's link goes down mid-step and comes back after every process has
// ended. n2's slurmstepd sent its task's exit while cut off and never sends
// it again; Slurm ends the step once the link is back, and plain srun (no
// -W) would wait for that exit for ever. srun's plugin sees the step gone
// from slurmctld, says so and ends srun, which exits 75 (the largest code it
// heard).
TEST_F(NetnsFaults, ALinkBackAfterTheTasksEndedNoLongerLeavesPlainSrunWaiting) {
  Spawned step(endless_worker_step(std::nullopt), env({{"DEW_HEARTBEAT_TIMEOUT_SECONDS", "3"}}));
  ASSERT_TRUE(step.wait_for_output("step 5/", 60s)) << step.err();
  const auto cut = Clock::now();
  ASSERT_EQ(network({"cut", dir_, "n2", "down"}).exit_code, 0);
  ASSERT_GT(seconds_until_gone(dew_exe(), cut, 30s), 0) << "a process still runs 30 s after the cut";
  // Long enough for n2's slurmstepd to give up sending the exit (back within
  // about 3 s, its connection's retries still deliver it), well before Slurm
  // would set n2 DOWN (27 s after the cut here).
  std::this_thread::sleep_for(8s);
  const auto back = Clock::now();
  ASSERT_EQ(network({"cut", dir_, "n2", "up"}).exit_code, 0);

  // Slurm ends the step a few seconds after the link is back; then two looks
  // 5 s apart, and srun's own end (KillWait 2 s + 2 s here).
  ASSERT_EQ(step.wait(45s), 75) << "srun still waits 45 s after the link came back\n" << step.err();
  const double ended = std::chrono::duration<double>(Clock::now() - back).count();
  EXPECT_THAT(step.err(), HasSubstr("[0] ending: process 1 failed: process 1 stopped answering: no heartbeat for 3 s"));
  EXPECT_THAT(step.err(), HasSubstr("has ended in Slurm (slurmctld has no record of it for 5 s), but srun still "
                                    "waits: the exits of some tasks never reached it"));
  std::printf("link back after the tasks ended: srun ended %.1f s after the link came back\n", ended);
}

// n2's link goes down after its task started and before it joined:
// process 0 names process 1 at the join timeout; process 1, unable to reach
// the service, gives up at the same timeout.
TEST_F(NetnsFaults, ALinkDownDuringTheJoinEndsEveryProcessAtTheJoinTimeoutNamingTheMissingPeer) {
  Spawned step({"srun", "-W", "2", "--dew-pool", "-N2", "--ntasks-per-node=1", "bash", "-c",
                "echo READY $SLURM_PROCID; sleep 2; exec " + pool_worker() + " exchange"},
               env({{"DEW_JOIN_TIMEOUT_SECONDS", "5"}}));
  ASSERT_TRUE(step.wait_for_output("READY 0", 60s) && step.wait_for_output("READY 1", 10s)) << step.out();
  const auto cut = Clock::now();
  ASSERT_EQ(network({"cut", dir_, "n2", "down"}).exit_code, 0);
  ASSERT_TRUE(until([&] { return processes_of(pool_worker()) == 2; }, 10s)) << "the workers never started";

  const double gone = seconds_until_gone(pool_worker(), cut, 30s);
  EXPECT_GT(gone, 5.0) << "ended before the join timeout";
  EXPECT_LT(gone, 11.0) << "the bound: 2 s until the join, the 5 s join timeout, 2 s to leave, and slack";
  std::printf("link down during the join: every process gone %.1f s after the cut\n", gone);
  ASSERT_EQ(step.wait(30s), 75) << step.err();
  EXPECT_THAT(step.err(), HasSubstr("[0] ending: process 1 failed: process 1 never joined the pool within 5 s"));
}

// Process 0 waits at the agreement of step 4's checkpoint for process 1
// (stalled there on purpose) when n2's link goes down: the slow agreement
// is said naming process 1, then process 0 ends at the heartbeat timeout
// naming it; the checkpoint of step 4 is never sealed, the one of step 2
// stays the last complete one.
TEST_F(NetnsFaults, ALinkDownDuringACheckpointAgreementLeavesTheLastCompleteCheckpoint) {
  const std::string checkpoints = dir_ + "/faults-checkpoints";
  std::filesystem::create_directories(checkpoints);
  Spawned step({"srun", "-W", "2", "--dew-pool", "-N2", "--ntasks-per-node=1", dew_exe(), "worker", "--steps", "40",
                "--checkpoint-dir", checkpoints, "--checkpoint-every", "2", "--drill", "stall-before-checkpoint@1:4",
                "--cache-dir", "off"},
               env({{"DEW_HEARTBEAT_TIMEOUT_SECONDS", "3"}, {"DEW_SLOW_SECONDS", "1"}}));
  ASSERT_TRUE(step.wait_for_output("agreement 'checkpoint at step 4' (round 0) has waited", 60s)) << step.err();
  const auto cut = Clock::now();
  ASSERT_EQ(network({"cut", dir_, "n2", "down"}).exit_code, 0);

  const double gone = seconds_until_gone(dew_exe(), cut, 30s);
  EXPECT_GT(gone, 2.0);
  EXPECT_LT(gone, 8.0);
  std::printf("link down at a checkpoint's agreement: every process gone %.1f s after the cut\n", gone);
  ASSERT_EQ(step.wait(30s), 75) << step.err();
  EXPECT_THAT(step.err(), HasSubstr("for process 1 (1 of 2 processes arrived)"));
  EXPECT_THAT(step.err(), HasSubstr("[0] ending: process 1 failed: process 1 stopped answering: no heartbeat for 3 s"));
  std::ifstream manifest(checkpoints + "/manifest.json");
  ASSERT_TRUE(manifest) << "no complete checkpoint left in " << checkpoints;
  EXPECT_EQ(nlohmann::json::parse(manifest).at("step"), 2);
}

// n2's link drops to 1 kbit/s mid-step (its way out; n1's lines still reach
// srun): the step's traffic and heartbeats queue behind each other, and
// process 0 ends at the heartbeat timeout naming process 1. Once the link
// is back, n2's exits reach srun, which exits 75.
TEST_F(NetnsFaults, ALinkDroppingToACrawlEndsEveryProcessAtTheHeartbeatTimeoutNamingTheSlowPeer) {
  Spawned step(endless_worker_step(std::nullopt), env({{"DEW_HEARTBEAT_TIMEOUT_SECONDS", "4"}}));
  ASSERT_TRUE(step.wait_for_output("step 5/", 60s)) << step.err();
  const auto slowed = Clock::now();
  const auto crawl = network({"shape", dir_, "1kbit", "n2"});
  ASSERT_EQ(crawl.exit_code, 0) << describe(crawl);

  const double gone = seconds_until_gone(dew_exe(), slowed, 30s);
  EXPECT_GT(gone, 3.0);
  EXPECT_LT(gone, 10.0) << "the bound: 4 s x 1.25 + 1 s to leave, and slack";
  std::printf("link at 1 kbit/s: every process gone %.1f s after the slowing\n", gone);
  ASSERT_EQ(network({"shape", dir_, "off", "n2"}).exit_code, 0);
  ASSERT_EQ(step.wait(30s), 75) << step.err();
  EXPECT_THAT(step.err(), HasSubstr("[0] ending: process 1 failed: process 1 stopped answering: no heartbeat for 4 s"));
}

}  // namespace
}  // namespace dew::testing
