// libdew pools under real srun on the two-node test cluster: the PMIx
// backend (srun --mpi=pmix) and the TCP service with the SPANK plugin's
// coordinator and secret (srun --dew-pool).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "process.h"
#include "slurm_cluster.h"
#include "test_paths.h"

namespace dew::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

std::string worker() { return dew::testing::pool_worker(); }

void expect_exchange(const RunResult& run, const std::string& source, const std::string& backend) {
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_THAT(run.out, HasSubstr("RESULT rank=" + std::to_string(r) + " size=4 source=" + source +
                                   " backend=" + backend + " local=" + std::to_string(r % 2) + "/2"));
    EXPECT_THAT(run.err, HasSubstr("[" + std::to_string(r) + "] Joined the pool: process " + std::to_string(r) +
                                   " of 4 (" + source + ", " + backend + ")"));
  }
  EXPECT_EQ(occurrences(run.out, "gets=hello from 0|hello from 1|hello from 2|hello from 3"), 4) << run.out;
  EXPECT_EQ(occurrences(run.out, "gather=rank 0|rank 1|rank 2|rank 3 squares=0,1,4,9"), 4) << run.out;
}

TEST(SlurmPool, PmixBackendUnderSrunMpiPmix) {
  expect_exchange(cluster().srun({"--mpi=pmix", "-N2", "--ntasks-per-node=2", worker(), "exchange"}, {}, 60s), "pmix",
                  "pmix+tcp");
}

TEST(SlurmPool, TcpServiceUnderSrunDewPool) {
  // The node names (n1, n2) do not resolve: the plugin finds process 0's
  // node by its NodeAddr, from Slurm, with no --dew-coordinator.
  expect_exchange(cluster().srun({"--dew-pool", "-N2", "--ntasks-per-node=2", worker(), "exchange"}, {}, 60s), "slurm",
                  "tcp");
}

TEST(SlurmPool, ARankThatThrowsEndsTheStepWithItsErrorPrintedOnce) {
  for (const std::string mode : {"--mpi=pmix", "--dew-pool"}) {
    SCOPED_TRACE(mode);
    std::vector<std::string> args = {mode, "-N2", "--ntasks-per-node=2", worker(), "throw", "2"};
    const auto run = cluster().srun(args, {}, 60s);
    EXPECT_NE(run.exit_code, 0);
    EXPECT_LT(run.seconds, 10.0) << run.err;
    EXPECT_EQ(occurrences(run.out + run.err, "[2] error: uncaught exception: boom from rank 2"), 1) << run.err;
    EXPECT_THAT(run.err, HasSubstr("ending: process 2 failed: uncaught exception: boom from rank 2")) << run.err;
  }
}

// The plugin's lines in srun's stderr ("dew: rank N ended with ..."): said
// by srun for the step, or by a node that srun did not answer.
std::vector<std::string> plugin_lines(const std::string& err) {
  std::vector<std::string> lines;
  for (const char* from : {"srun: error: ", "slurmstepd-"}) {
    for (const auto& line : lines_starting_with(err, from)) {
      if (line.find("dew: rank ") != std::string::npos) lines.push_back(line.substr(line.find("dew: rank ")));
    }
  }
  return lines;
}

// With libdew, the failing rank publishes its error and the peers end with
// 75 at once, often before the failing rank's own exit reaches its
// slurmstepd: the plugin still names the failing rank, once for the step.
// The step ends within seconds; on a loaded machine (CI, Slurm 24.11 beside
// the sanitizer stages), one run in 8 now and then has srun wait a further
// 10 s (Slurm's MessageTimeout) after every task's exit was printed: one
// such run is allowed, two are a regression.
TEST(SlurmPool, ThePluginNamesTheFailingRankNeverAPeerThatEndedWith75) {
  int slow_runs = 0;
  for (int run = 0; run < 8; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    const auto r = cluster().srun({"--dew-pool", "-N2", "--ntasks-per-node=2", worker(), "fail", "1", "3"}, {}, 60s);
    EXPECT_LT(r.seconds, 15.0) << r.err;
    if (r.seconds >= 5.0) ++slow_runs;
    EXPECT_LE(slow_runs, 1) << "a second run of 8 over 5 s: " << r.err;
    const auto lines = plugin_lines(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_THAT(lines[0], ::testing::StartsWith("dew: rank 1 ended with exit code 3; ending step")) << r.err;
  }
}

// A rank killed from outside the step (SIGKILL, as the OOM killer sends)
// is named too; its peers, which end with 75, are not.
TEST(SlurmPool, ARankKilledFromOutsideIsNamed) {
  const auto dir = std::filesystem::temp_directory_path() / ("dew-oom-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  Spawned srun({"srun", "--dew-pool", "-N2", "--ntasks-per-node=2", "bash", "-c",
                "echo $$ > " + dir.string() + "/pid.$SLURM_PROCID; exec " + worker() + " steps"},
               cluster().client_env());
  const auto pid_file = dir / "pid.2";
  for (int i = 0; i < 200 && !std::filesystem::exists(pid_file); ++i) std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(srun.wait_for_output("READY", 30s)) << srun.err();
  std::ifstream in(pid_file);
  pid_t pid = 0;
  in >> pid;
  ASSERT_GT(pid, 0);
  ::kill(pid, SIGKILL);
  EXPECT_NE(srun.wait(20s), -1) << srun.err();
  EXPECT_LT(srun.seconds(), 30.0);
  const auto lines = plugin_lines(srun.err());
  ASSERT_EQ(lines.size(), 1u) << srun.err();
  EXPECT_THAT(lines[0], ::testing::StartsWith("dew: rank 2 ended with signal 9 (SIGKILL)")) << srun.err();
  std::filesystem::remove_all(dir);
}

// Sequence-parallel attention (tests/unit/attention/pool_worker) over pools
// that srun starts on the two nodes: every device a Gloo rank over TCP whose
// rendezvous goes through the pool, both exchanges checked forward and
// backward against whole-sequence attention on each rank.
void expect_attention(const RunResult& run, int processes, int devices_per_process) {
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_THAT(run.out, Not(HasSubstr("MISMATCH"))) << run.out;
  // 9 cases x 2 exchanges x 2 precisions on every process, then one tensor
  // shard of the tensor 2 x sequence N/2 mesh for both exchanges.
  EXPECT_EQ(occurrences(run.out, ": ok"), 38 * processes) << run.out;
  const int devices = processes * devices_per_process;
  EXPECT_EQ(occurrences(run.out, "ALL OK: " + std::to_string(devices) + " devices (" + std::to_string(processes) +
                                     " processes x " + std::to_string(devices_per_process) + ")"),
            processes)
      << run.out;
}

TEST(SlurmPool, SequenceParallelAttentionUnderSrunDewPool) {
  const char* attention_worker = std::getenv("DEW_ATTENTION_POOL_WORKER");
  ASSERT_NE(attention_worker, nullptr) << "the build names tests/unit/attention/pool_worker here";
  // 2 nodes x 1 task x 2 devices: each node's devices are threads of its task.
  expect_attention(cluster().srun({"--dew-pool", "-N2", "--ntasks-per-node=1", attention_worker, "2"},
                                  {{"OPENBLAS_NUM_THREADS", "1"}}, 120s),
                   2, 2);
}

TEST(SlurmPool, SequenceParallelAttentionUnderSrunMpiPmix) {
  const char* attention_worker = std::getenv("DEW_ATTENTION_POOL_WORKER");
  ASSERT_NE(attention_worker, nullptr) << "the build names tests/unit/attention/pool_worker here";
  // 2 nodes x 2 tasks x 1 device, the pool formed over PMIx.
  expect_attention(cluster().srun({"--mpi=pmix", "-N2", "--ntasks-per-node=2", attention_worker, "1"},
                                  {{"OPENBLAS_NUM_THREADS", "1"}}, 120s),
                   4, 1);
}

TEST(SlurmPool, DewAttentionCheckUnderSrun) {
  // What a user runs to see sequence-parallel attention work on their
  // allocation: 2 nodes x 1 task x 2 devices, heads over tensor 2 x sequence 2
  // (each node's two devices a sequence group, one tensor shard per node).
  const auto run = cluster().srun(
      {"--dew-pool", "-N2", "--ntasks-per-node=1", dew_exe(), "attention-check", "--devices-per-process", "2", "--mesh",
       "tensor=2,sequence=2", "--heads", "8", "--kv-heads", "4", "--length", "256", "--head-dim", "32", "--runs", "1"},
      {{"OPENBLAS_NUM_THREADS", "1"}}, 120s);
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  // Process 0 alone prints the table, for every device of the pool.
  EXPECT_EQ(occurrences(run.out, "attention check: 4 devices (2 processes x 2), mesh tensor=2,sequence=2"), 1)
      << run.out;
  EXPECT_EQ(occurrences(run.out, "  ok\n"), 2) << run.out;
  EXPECT_THAT(run.out, HasSubstr("result: every exchange matches whole-sequence attention")) << run.out;
  EXPECT_THAT(run.err, HasSubstr("[1] Joined the pool: process 1 of 2 (slurm, tcp)")) << run.err;

  // Every device on the sequence axis: the groups span the two nodes.
  const auto across = cluster().srun(
      {"--dew-pool", "-N2", "--ntasks-per-node=1", dew_exe(), "attention-check", "--devices-per-process", "2",
       "--heads", "8", "--kv-heads", "4", "--length", "256", "--head-dim", "32", "--mask", "window=40", "--runs", "1"},
      {{"OPENBLAS_NUM_THREADS", "1"}}, 120s);
  ASSERT_EQ(across.exit_code, 0) << across.out << across.err;
  EXPECT_THAT(across.out, HasSubstr("4 devices (2 processes x 2), mesh sequence=4;")) << across.out;
  EXPECT_EQ(occurrences(across.out, "  ok\n"), 2) << across.out;

  // The same over a PMIx pool: 2 nodes x 2 tasks, one device each.
  const auto pmix = cluster().srun({"--mpi=pmix", "-N2", "--ntasks-per-node=2", dew_exe(), "attention-check", "--heads",
                                    "8", "--kv-heads", "4", "--length", "256", "--head-dim", "32", "--runs", "1"},
                                   {{"OPENBLAS_NUM_THREADS", "1"}}, 120s);
  ASSERT_EQ(pmix.exit_code, 0) << pmix.out << pmix.err;
  EXPECT_THAT(pmix.out, HasSubstr("4 devices (4 processes x 1), mesh sequence=4;")) << pmix.out;
  EXPECT_EQ(occurrences(pmix.out, "  ok\n"), 2) << pmix.out;
  EXPECT_THAT(pmix.err, HasSubstr("Joined the pool: process 3 of 4 (pmix, pmix+tcp)")) << pmix.err;
}

TEST(SlurmPool, DewEnvShowsTheResolvedIdentity) {
  const auto pooled = cluster().srun({"--dew-pool", "-N2", "-n2", "-l", dew_exe(), "env"}, {}, 30s);
  ASSERT_EQ(pooled.exit_code, 0) << pooled.err;
  EXPECT_THAT(pooled.out, HasSubstr("1: source:       slurm"));
  EXPECT_THAT(pooled.out, HasSubstr("1: process:      1 of 2"));
  EXPECT_THAT(pooled.out, HasSubstr("(from DEW_COORDINATOR_ADDRESS)"));
  EXPECT_THAT(pooled.out, HasSubstr("1: pool secret:  set (DEW_POOL_SECRET, 64 hex digits)"));
  EXPECT_THAT(pooled.out, HasSubstr("process_id=1)"));

  const auto pmix = cluster().srun({"--mpi=pmix", "-N2", "-n2", "-l", dew_exe(), "env"}, {}, 30s);
  ASSERT_EQ(pmix.exit_code, 0) << pmix.err;
  EXPECT_THAT(pmix.out, HasSubstr("1: source:       pmix"));
  EXPECT_THAT(pmix.out, HasSubstr("1: process:      1 of 2"));
  EXPECT_THAT(pmix.out, HasSubstr("1: local:        0 of 1 on node 1 ("));
}

}  // namespace
}  // namespace dew::testing
