// `dew worker` on the real two-node test cluster: the design page's hybrid
// pool under srun --dew-pool, srun --mpi=pmix and dew launch --slurm inside
// an allocation, each against one process of 8 devices; and the failure
// drills under srun --dew-pool, where the plugin ends the step.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "srun_output.h"
#include "worker_helpers.h"

namespace dew::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// No --dew-coordinator: the node names do not resolve, and the plugin finds
// process 0's node by its NodeAddr, from Slurm.
const std::vector<std::string> kDewPool = {"--dew-pool"};

// The hybrid pool of the design page, without the dataset cache unless
// `extra` names one; `extra` may also replace the mesh.
std::vector<std::string> worker_args(const std::string& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {dew_exe(), "worker", "--devices-per-process", "2", "--out", out};
  const auto has = [&](const char* flag) { return std::find(extra.begin(), extra.end(), flag) != extra.end(); };
  if (!has("--mesh")) args.insert(args.end(), {"--mesh", R"({"fsdp": 2, "replicas": 2})"});
  if (!has("--cache-dir")) args.insert(args.end(), {"--cache-dir", "off"});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::vector<std::string> srun_args(std::vector<std::string> mode, const std::vector<std::string>& worker) {
  mode.insert(mode.end(), {"-N2", "--ntasks-per-node=2"});
  mode.insert(mode.end(), worker.begin(), worker.end());
  return mode;
}

TEST(WorkerSlurm, TheHybridPoolMatchesOneProcessUnderEveryLauncher) {
  TempDir dir;
  ASSERT_EQ(alone_worker(8, {"--mesh", R"({"fsdp": 8})", "--out", dir / "one.json"}).exit_code, 0);
  const auto one = read_report(dir / "one.json").losses;
  const std::vector<std::pair<std::string, std::vector<std::string>>> launchers = {{"srun --dew-pool", kDewPool},
                                                                                   {"srun --mpi=pmix", {"--mpi=pmix"}}};
  for (const auto& [name, mode] : launchers) {
    SCOPED_TRACE(name);
    const std::string out = dir / "pool.json";
    std::filesystem::remove(out);
    auto r = cluster().srun(srun_args(mode, worker_args(out)), {}, 120s);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const auto pool = read_report(out);
    EXPECT_EQ(pool.fsdp_groups, (std::vector<std::vector<int>>{{0, 1}, {0, 1}, {2, 3}, {2, 3}}));
    EXPECT_LT(loss_gap(pool.losses, one), 1e-6);
    EXPECT_THAT(r.err, HasSubstr("[0] step 20/20: loss"));
  }
  // dew launch --slurm inside an allocation (the plugin gives the pool).
  const std::string out = dir / "launch.json";
  std::vector<std::string> args = {"salloc",
                                   "-N2",
                                   "--ntasks-per-node=2",
                                   "--quiet",
                                   dew_exe(),
                                   "launch",
                                   "--slurm",
                                   "--processes-per-host",
                                   "2",
                                   "--coordinator",
                                   cluster().node_address("n1"),
                                   "--"};
  const auto worker = worker_args(out);
  args.insert(args.end(), worker.begin(), worker.end());
  auto r = cluster().command(args, {}, 120s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_LT(loss_gap(read_report(out).losses, one), 1e-6);
  EXPECT_EQ(read_report(out).fsdp_groups, (std::vector<std::vector<int>>{{0, 1}, {0, 1}, {2, 3}, {2, 3}}));
}

TEST(WorkerSlurm, SequenceAndTensorLayoutsAcrossTheNodesMatchOneProcess) {
  TempDir dir;
  ASSERT_EQ(alone_worker(8, {"--mesh", R"({"fsdp": 8})", "--out", dir / "one.json"}).exit_code, 0);
  const auto one = read_report(dir / "one.json").losses;
  for (const std::string mesh : {R"({"fsdp": 2, "sequence": 2, "replicas": 2})", "tensor=2,sequence=2,fsdp=2"}) {
    SCOPED_TRACE(mesh);
    std::vector<std::string> args = kDewPool;
    args.insert(args.end(), {"-N2", "--ntasks-per-node=1", dew_exe(), "worker", "--cache-dir", "off",
                             "--devices-per-process", "4", "--mesh", mesh, "--out", dir / "pool.json"});
    auto r = cluster().srun(args, {}, 120s);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_LT(loss_gap(read_report(dir / "pool.json").losses, one), 1e-6);
    EXPECT_NE(read_report(dir / "pool.json").exchange, "local");
  }
}

TEST(WorkerSlurm, TwoPoolsAtOnceAndTheCacheOfASecondRun) {
  TempDir dir;
  RunResult first, second;
  std::thread a([&] { first = cluster().srun(srun_args(kDewPool, worker_args(dir / "a.json")), {}, 120s); });
  std::thread b([&] {
    second = cluster().srun(srun_args(kDewPool, worker_args(dir / "b.json", {"--mesh", "fsdp=8"})), {}, 120s);
  });
  a.join();
  b.join();
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  ASSERT_EQ(second.exit_code, 0) << describe(second);
  EXPECT_LT(loss_gap(read_report(dir / "a.json").losses, read_report(dir / "b.json").losses), 1e-6);
  // The dataset under the compile-cache key: the second run finds it on every process.
  const std::vector<std::string> cached = {"--steps", "3", "--cache-dir", dir / "cache"};
  auto cold = cluster().srun(srun_args(kDewPool, worker_args(dir / "c.json", cached)), {}, 60s);
  ASSERT_EQ(cold.exit_code, 0) << describe(cold);
  EXPECT_THAT(cold.err, HasSubstr("[0] cache: 0 of 4 processes found the tokenized dataset"));
  auto warm = cluster().srun(srun_args(kDewPool, worker_args(dir / "c.json", cached)), {}, 60s);
  ASSERT_EQ(warm.exit_code, 0) << describe(warm);
  EXPECT_THAT(warm.err, HasSubstr("[0] cache: every process (4) found the tokenized dataset"));
}

TEST(WorkerSlurm, ALoaderThatThrowsEndsTheStepNamingItsRank) {
  TempDir dir;
  auto r = cluster().srun(srun_args(kDewPool, worker_args(dir / "x.json", {"--drill", "loader-throws@3:4"})), {}, 60s);
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_LT(r.seconds, 15.0);
  EXPECT_EQ(occurrences(r.err, "[3] error: uncaught exception: data loader: cannot read the batch of step 4"), 1)
      << describe(r);
  EXPECT_EQ(occurrences(r.err, "dew: rank 3 ended with exit code 1"), 1) << describe(r);
  EXPECT_EQ(occurrences(r.err, "ended with exit code 75"), 0) << describe(r);
  EXPECT_EQ(occurrences(r.err, "dew: rank "), 1) << "only rank 3 is named: " << describe(r);
  EXPECT_EQ(occurrences(r.err, "] error: "), 1) << "no peer blames its broken collective: " << describe(r);
}

// Issue 26's culprit under srun --dew-pool: a disk full on process 0 (a
// small tmpfs for the checkpoints, under the cluster's directory, which its
// nodes share), then on rank 2 alone (its own mount namespace over the step
// directory, as under dew launch). The plugin names the rank whose write failed, with its
// line, every run; no peer blames its broken collective.
TEST(WorkerSlurm, ADiskFullIsPinnedOnTheRankWhoseWriteFailed) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (mount, unshare -m)";
  SmallDisk disk("404k", cluster().dir());
  ASSERT_TRUE(disk.mounted());
  TempDir dir;
  for (int run_number = 0; run_number < 3; ++run_number) {
    SCOPED_TRACE("run " + std::to_string(run_number));
    const std::string zero_ck = disk.dir() + "/ck" + std::to_string(run_number);
    auto zero = cluster().srun(
        srun_args(kDewPool, worker_args(dir / "z.json", {"--mesh", "fsdp=4", "--steps", "10", "--checkpoint-dir",
                                                         zero_ck, "--checkpoint-every", "5"})),
        {}, 60s);
    std::filesystem::remove_all(zero_ck);
    EXPECT_NE(zero.exit_code, 0) << describe(zero);
    EXPECT_EQ(occurrences(zero.err, "dew: rank 0 ended with exit code 1"), 1) << describe(zero);
    EXPECT_EQ(occurrences(zero.err, "dew: rank "), 1) << "only rank 0 is named: " << describe(zero);
    EXPECT_THAT(zero.err, HasSubstr("[0] error: device 0: checkpoint: cannot write " + zero_ck + "/manifest.json.tmp."))
        << describe(zero);
    EXPECT_THAT(zero.err, HasSubstr("No space left on device"));
    EXPECT_EQ(occurrences(zero.err, "] error: "), 1) << describe(zero);

    const std::string ck = dir / ("ck" + std::to_string(run_number));
    std::filesystem::create_directories(ck + "/step-000005");
    std::vector<std::string> wrapped = {"sh", "-c", kRank2DiskFull, "sh", ck + "/step-000005"};
    const auto worker = worker_args(
        dir / "two.json", {"--mesh", "fsdp=8", "--steps", "10", "--checkpoint-dir", ck, "--checkpoint-every", "5"});
    wrapped.insert(wrapped.end(), worker.begin(), worker.end());
    auto two = cluster().srun(srun_args(kDewPool, wrapped), {}, 60s);
    EXPECT_NE(two.exit_code, 0) << describe(two);
    EXPECT_EQ(occurrences(two.err, "dew: rank 2 ended with exit code 1"), 1) << describe(two);
    EXPECT_EQ(occurrences(two.err, "dew: rank "), 1) << "only rank 2 is named: " << describe(two);
    EXPECT_THAT(two.err, ::testing::ContainsRegex("\\[2\\] error: device [45]: checkpoint: cannot write " + ck +
                                                  "/step-000005/state.bin"))
        << describe(two);
    EXPECT_THAT(two.err, HasSubstr("No space left on device"));
    EXPECT_EQ(occurrences(two.err, "] error: "), 1) << describe(two);
  }
}

TEST(WorkerSlurm, AStalledRankIsNamedByTheWatchdogAndByThePatience) {
  TempDir dir;
  auto in_step = cluster().srun(
      srun_args(kDewPool, worker_args(dir / "x.json", {"--drill", "stall-in-step@2:3", "--watchdog", "2s"})), {}, 60s);
  // srun exits with the largest code of the step's tasks: 124, or 143 from
  // peers the step's end reached first; the plugin's line names the rank.
  EXPECT_NE(in_step.exit_code, 0) << describe(in_step);
  EXPECT_THAT(in_step.err, HasSubstr("[2] error: step 3: device 4 stalled outside any collective"));
  EXPECT_EQ(occurrences(in_step.err, "dew: rank 2 ended with exit code 124"), 1) << describe(in_step);
  EXPECT_EQ(occurrences(in_step.err, "] error: "), 1) << "only the stalled rank fails: " << describe(in_step);
  // The plugin's --dew-watchdog reaches the worker's StepWatchdog (DEW_WATCHDOG),
  // not only XLA_FLAGS.
  std::vector<std::string> from_plugin =
      srun_args(kDewPool, worker_args(dir / "w.json", {"--drill", "stall-in-step@1:3"}));
  from_plugin.insert(from_plugin.begin(), "--dew-watchdog=2s");
  auto plugin_bound = cluster().srun(from_plugin, {}, 60s);
  EXPECT_NE(plugin_bound.exit_code, 0) << describe(plugin_bound);
  EXPECT_LT(plugin_bound.seconds, 30.0) << "the 2 s bound, not the default 30 minutes";
  EXPECT_THAT(plugin_bound.err, HasSubstr("[1] error: step 3: device "));
  EXPECT_THAT(plugin_bound.err, HasSubstr("past the step bound of 2.0 s"));
  EXPECT_EQ(occurrences(plugin_bound.err, "dew: rank 1 ended with exit code 124"), 1) << describe(plugin_bound);
  auto before_agreement = cluster().srun(
      srun_args(kDewPool, worker_args(dir / "y.json", {"--drill", "stall-before-checkpoint@1:2", "--checkpoint-dir",
                                                       dir / "ck", "--checkpoint-every", "2"})),
      {{"DEW_AGREEMENT_PATIENCE_SECONDS", "2"}}, 60s);
  EXPECT_NE(before_agreement.exit_code, 0) << describe(before_agreement);
  EXPECT_LT(before_agreement.seconds, 20.0);
  EXPECT_THAT(before_agreement.err,
              HasSubstr("agreement 'checkpoint at step 2' ran out of patience after 2 s: process 1 never arrived"));
}

}  // namespace
}  // namespace dew::testing
