// `dew worker` as the design page rehearses it, as real pools under
// `dew launch` on localhost: the fsdp groups of hybrid sharding, every layout
// against one process of 8 devices, checkpoints and resuming (into another
// layout too, and after a kill mid-save), a changed state or a non-finite
// loss or state refused, and the failure drills.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "srun_output.h"
#include "worker_helpers.h"

namespace dew::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using namespace std::chrono_literals;

// One process of 8 devices, plain fsdp: the reference every layout matches
// (its first `steps` steps).
const WorkerReport& reference(const TempDir& dir, int steps = 20) {
  static std::map<int, WorkerReport> reports;
  WorkerReport& report = reports[steps];
  if (report.losses.empty()) {
    const std::string out = dir / ("reference-" + std::to_string(steps) + ".json");
    auto r = alone_worker(8, {"--mesh", R"({"fsdp": 8})", "--steps", std::to_string(steps), "--out", out});
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    report = read_report(out);
  }
  return report;
}

TEST(Worker, HybridShardingRecordsTheDesignPagesFsdpGroups) {
  TempDir dir;
  auto hybrid = launch_worker(
      4, {"--devices-per-process", "2", "--out", dir / "pool.json", "--mesh", R"({"fsdp": 2, "replicas": 2})"});
  ASSERT_EQ(hybrid.exit_code, 0) << describe(hybrid);
  const auto pool = read_report(dir / "pool.json");
  EXPECT_EQ(pool.fsdp_groups, (std::vector<std::vector<int>>{{0, 1}, {0, 1}, {2, 3}, {2, 3}}));
  EXPECT_EQ(pool.losses.size(), 20u);
  // Process 0's line per step, and the mesh once.
  EXPECT_EQ(occurrences(hybrid.err, "[0] step "), 20) << hybrid.err;
  EXPECT_THAT(hybrid.err, HasSubstr("[0] step 20/20: loss "));
  EXPECT_THAT(hybrid.err, HasSubstr("fsdp groups [[0, 1], [0, 1], [2, 3], [2, 3]]"));
  EXPECT_LT(loss_gap(pool.losses, reference(dir).losses), 1e-6);
  EXPECT_LT(pool.losses.back(), pool.losses.front() - 0.5) << "it learns";

  auto plain =
      launch_worker(4, {"--devices-per-process", "2", "--out", dir / "plain.json", "--mesh", R"({"fsdp": 2})"});
  ASSERT_EQ(plain.exit_code, 0) << describe(plain);
  EXPECT_EQ(read_report(dir / "plain.json").fsdp_groups, (std::vector<std::vector<int>>{{0}, {1}, {2}, {3}}));
}

struct WorkerLayout {
  int processes, devices;
  std::string mesh;
  std::string exchange = "auto";
};

TEST(Worker, EveryLayoutTrainsAsOneProcessOfEightDevices) {
  TempDir dir;
  const std::vector<WorkerLayout> layouts = {
      {2, 4, R"({"fsdp": 2, "sequence": 2, "replicas": 2})"},
      {2, 4, R"({"fsdp": 2, "sequence": 2, "replicas": 2})", "all-to-all"},
      {4, 2, "tensor=2,fsdp=4"},
      {2, 4, "tensor=2,sequence=2,fsdp=2"},
      {4, 2, "data=2,fsdp=4"},
      {4, 2, "data=2,fsdp=2,tensor=2"},
      {8, 1, "data=8"},
  };
  for (const auto& l : layouts) {
    SCOPED_TRACE(l.mesh + " exchange " + l.exchange + " over " + std::to_string(l.processes) + " processes");
    const std::string out = dir / "layout.json";
    std::filesystem::remove(out);
    auto r = launch_worker(l.processes, {"--devices-per-process", std::to_string(l.devices), "--mesh", l.mesh,
                                         "--exchange", l.exchange, "--steps", "8", "--out", out});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const auto report = read_report(out);
    EXPECT_LT(loss_gap(report.losses, reference(dir, 8).losses), 1e-6);
    if (l.exchange != "auto") {
      EXPECT_EQ(report.exchange, l.exchange);
    }
  }
}

TEST(Worker, BadInputIsOneLineWithTheNumbersBeforeAnyStep) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--devices-per-process", "2", "--mesh", "fsdp=3"}, "--mesh over 4 devices (2 processes x 2): "},
      {{"--devices-per-process", "0"}, "--devices-per-process 0 is not allowed; allowed: a whole number from 1"},
      {{"--devices-per-process", "2", "--mesh", "sequence=4", "--length", "18"},
       "the length 18 does not split over sequence 4; allowed: a multiple of 4"},
      {{"--mesh", "expert=2"}, "expert=2: the worker's model has no experts"},
      {{"--devices-per-process", "2", "--mesh", "sequence=4", "--exchange", "all-to-all", "--kv-heads", "1", "--heads",
        "2", "--width", "16"},
       "--exchange all-to-all cannot run over sequence 4"},
      {{"--drill", "explode@1:2"}, "--drill: 'explode@1:2' is not allowed; allowed: KIND@RANK:STEP"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.says);
    auto r = launch_worker(2, c.args);
    EXPECT_EQ(r.exit_code, 2) << describe(r);
    EXPECT_THAT(r.err, HasSubstr(c.says)) << describe(r);
    EXPECT_EQ(occurrences(r.err, "step 1/"), 0) << "nothing trained";
  }
}

// ------------------------------------------------------------ layout-parity

TEST(LayoutParity, EveryLayoutOfEightDevicesPassesInOneProcessAndAsAPool) {
  auto alone = run({dew_exe(), "layout-parity", "--devices", "8", "--steps", "2"}, {}, 120s);
  EXPECT_EQ(alone.exit_code, 0) << describe(alone);
  EXPECT_THAT(alone.out, MatchesRegex("(.|\n)*floor \\(one device, batch reversed\\) +- +[0-9.e+-]+ (.|\n)*"));
  EXPECT_THAT(alone.out, MatchesRegex("(.|\n)*\ndata=2,fsdp=2,tensor=2 +- +([0-9.e+-]+ +){6}pass\n(.|\n)*"));
  EXPECT_THAT(alone.out, MatchesRegex("(.|\n)*\ndata=1,fsdp=2,sequence=4 +gather +([0-9.e+-]+ +){6}pass\n(.|\n)*"));
  EXPECT_THAT(alone.out, HasSubstr("refused: tensor 8 must divide the kv heads (2)"));
  EXPECT_THAT(alone.err, HasSubstr("layout-parity: 23 passed, 0 failed, 27 refused by the rules"));
  EXPECT_EQ(occurrences(alone.out, " pass\n"), 23);
  // As a pool of 4 processes x 2 devices, hybrid layouts run too.
  auto pool = dew_launch({"--processes-per-host", "4", "--", dew_exe(), "layout-parity", "--steps", "2"}, {}, 120s);
  EXPECT_EQ(pool.exit_code, 0) << describe(pool);
  EXPECT_THAT(
      pool.out,
      MatchesRegex("(.|\n)*\n\\[0\\] data=2,fsdp=2,sequence=2,replicas=2 +all-to-all +([0-9.e+-]+ +){6}pass\n(.|\n)*"));
  EXPECT_THAT(pool.err, HasSubstr("layout-parity: 33 passed, 0 failed, 17 refused by the rules"));
}

// ------------------------------------------------------------- checkpoints

TEST(WorkerCheckpoints, ResumingGivesTheLossesOfAnUninterruptedRunInAnyLayout) {
  TempDir dir;
  const std::vector<std::string> hybrid = {"--devices-per-process", "2", "--mesh", "fsdp=2,replicas=2"};
  const auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = hybrid;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  ASSERT_EQ(launch_worker(4, with({"--out", dir / "straight.json"})).exit_code, 0);
  const auto straight = read_report(dir / "straight.json").losses;
  auto first = launch_worker(4, with({"--steps", "10", "--checkpoint-dir", dir / "ck", "--checkpoint-every", "5"}));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  EXPECT_TRUE(std::filesystem::exists(dir / "ck/manifest.json"));
  auto resumed = launch_worker(4, with({"--checkpoint-dir", dir / "ck", "--resume", "--out", dir / "resumed.json"}));
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  const auto again = read_report(dir / "resumed.json");
  EXPECT_EQ(again.json.value("resumed_from", 0), 10);
  EXPECT_EQ(occurrences(resumed.err, "[0] step "), 10) << "steps 11 to 20 only";
  EXPECT_LT(loss_gap(again.losses, straight), 1e-6);
  // Into another layout of the same 8 devices: 2 processes x 4, tensor and sequence.
  auto other = launch_worker(2, {"--devices-per-process", "4", "--mesh", "tensor=2,sequence=2,fsdp=2",
                                 "--checkpoint-dir", dir / "ck", "--resume", "--out", dir / "other.json"});
  ASSERT_EQ(other.exit_code, 0) << describe(other);
  EXPECT_LT(loss_gap(read_report(dir / "other.json").losses, straight), 1e-6);
  // A different model is refused, naming it.
  auto wider = launch_worker(4, with({"--checkpoint-dir", dir / "ck", "--resume", "--width", "64"}));
  EXPECT_NE(wider.exit_code, 0);
  EXPECT_THAT(wider.err, HasSubstr("--resume: the checkpoint at step 10 was trained with model"));
}

TEST(WorkerCheckpoints, AKillWhileSavingLeavesThePreviousCheckpointToResumeFrom) {
  TempDir dir;
  const std::vector<std::string> layout = {"--devices-per-process", "2",       "--mesh", "fsdp=4",
                                           "--checkpoint-dir",      dir / "ck"};
  auto straight = launch_worker(4, {"--devices-per-process", "2", "--mesh", "fsdp=4", "--out", dir / "straight.json"});
  ASSERT_EQ(straight.exit_code, 0) << describe(straight);
  std::vector<std::string> crash = layout;
  crash.insert(crash.end(), {"--checkpoint-every", "5", "--drill", "crash-while-saving@1:10"});
  auto killed = launch_worker(4, crash);
  EXPECT_EQ(killed.exit_code, 137) << describe(killed);
  EXPECT_THAT(killed.err, HasSubstr("rank 1 on localhost ended with signal 9 (SIGKILL)"));
  EXPECT_THAT(read_text(dir / "ck/manifest.json"), HasSubstr("\"step\": 5,"));
  EXPECT_TRUE(std::filesystem::exists(dir / "ck/step-000010")) << "the half-written one is there, not named";
  std::vector<std::string> resume = layout;
  resume.insert(resume.end(), {"--resume", "--out", dir / "resumed.json"});
  auto resumed = launch_worker(4, resume);
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_EQ(read_report(dir / "resumed.json").json.value("resumed_from", 0), 5);
  EXPECT_LT(loss_gap(read_report(dir / "resumed.json").losses, read_report(dir / "straight.json").losses), 1e-6);
}

// Issue 26: on a data=4 mesh only process 0's device writes the state, and
// the drill on rank 1 did nothing. Rank 1 is killed at its save all the same.
TEST(WorkerCheckpoints, TheCrashWhileSavingDrillFiresOnARankThatWritesNoShard) {
  TempDir dir;
  auto killed = launch_worker(4, {"--mesh", "data=4", "--checkpoint-dir", dir / "ck", "--checkpoint-every", "5",
                                  "--drill", "crash-while-saving@1:10"});
  EXPECT_EQ(killed.exit_code, 137) << describe(killed);
  EXPECT_THAT(killed.err, HasSubstr("rank 1 on localhost ended with signal 9 (SIGKILL)"));
  EXPECT_THAT(read_text(dir / "ck/manifest.json"), HasSubstr("\"step\": 5,"));
}

// Issue 26: 64 flipped bytes in the state resumed with exit 0 and losses off
// by up to 1.2e3. The digest refuses it, once, naming the file and both
// digests; an untouched copy of the same checkpoint resumes bit for bit.
TEST(WorkerCheckpoints, AChangedStateIsRefusedInOneLineAndAnUntouchedOneResumesBitForBit) {
  TempDir dir;
  const auto hybrid = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--devices-per-process", "2", "--mesh", "fsdp=2,replicas=2"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  ASSERT_EQ(launch_worker(4, hybrid({"--out", dir / "straight.json"})).exit_code, 0);
  auto first = launch_worker(4, hybrid({"--steps", "10", "--checkpoint-dir", dir / "ck", "--checkpoint-every", "5"}));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  std::filesystem::copy(dir / "ck", dir / "untouched", std::filesystem::copy_options::recursive);
  const std::string state = dir / "ck/step-000010/state.bin";
  const std::string written = nlohmann::json::parse(read_text(dir / "ck/manifest.json")).at("state_blake2b");
  EXPECT_EQ(b2sum(state), written) << "the manifest's digest is b2sum -l 256's";
  flip_bytes(state, 4096, 64);
  auto refused = launch_worker(4, hybrid({"--checkpoint-dir", dir / "ck", "--resume"}));
  EXPECT_EQ(refused.exit_code, 1) << describe(refused);
  EXPECT_THAT(refused.err,
              HasSubstr("[0] error: --resume: checkpoint " + state + ": digest " + written + " expected, found " +
                        b2sum(state) + " (BLAKE2b-256: the file was changed or replaced after it was written)\n"));
  EXPECT_EQ(occurrences(refused.err, "] error: "), 1) << refused.err;
  EXPECT_EQ(occurrences(refused.err, "step 11/"), 0) << "nothing trained";

  auto resumed =
      launch_worker(4, hybrid({"--checkpoint-dir", dir / "untouched", "--resume", "--out", dir / "resumed.json"}));
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  const auto again = read_report(dir / "resumed.json");
  EXPECT_EQ(again.json.value("resumed_from", 0), 10);
  EXPECT_EQ(again.losses, read_report(dir / "straight.json").losses) << "bit for bit";
}

// Issue 26: a loss gone NaN trained on to the end with exit 0. A learning
// rate of 1e300 overflows fp32's parameters at step 1: step 2's loss is NaN.
TEST(WorkerCheckpoints, ANonFiniteLossEndsTheRunInOneLineAndNoCheckpointOfItIsWritten) {
  TempDir dir;
  auto r = launch_worker(4, {"--devices-per-process", "2", "--mesh", "fsdp=4", "--steps", "10", "--learning-rate",
                             "1e300", "--checkpoint-dir", dir / "ck", "--checkpoint-every", "5"});
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("[0] error: device 0: step 2: the loss is nan (process 0: this device's part of the "
                               "global batch is nan, the first part that is not finite); the run ends here, and no "
                               "checkpoint of this state is written\n"));
  EXPECT_EQ(occurrences(r.err, "] error: "), 1) << r.err;
  EXPECT_EQ(occurrences(r.err, "step 2/10"), 0) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "ck/manifest.json"));
  EXPECT_FALSE(std::filesystem::exists(dir / "ck/step-000005"));
}

// The state after step 1's update is infinite (fp32): its save is refused
// naming the element, nothing of it is kept, and an earlier run's checkpoint
// in the directory stays as it was.
TEST(WorkerCheckpoints, ANonFiniteStateIsNotSavedAndTheLastCheckpointStays) {
  TempDir dir;
  const std::vector<std::string> layout = {"--devices-per-process", "2",       "--mesh", "fsdp=4",
                                           "--checkpoint-dir",      dir / "ck"};
  const auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = layout;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  ASSERT_EQ(launch_worker(4, with({"--steps", "5", "--checkpoint-every", "5"})).exit_code, 0);
  const std::string manifest = read_text(dir / "ck/manifest.json");
  auto r = launch_worker(4, with({"--steps", "10", "--learning-rate", "1e300", "--checkpoint-every", "1"}));
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("[0] error: device 0: step 1: checkpoint " + dir / "ck/step-000001/state.bin" +
                               " not saved: its parameters element 0 (embedding, its element 0) is inf; a checkpoint "
                               "holds finite values only, so the step's directory is removed and " +
                               dir / "ck/manifest.json still names the last checkpoint\n"));
  EXPECT_EQ(occurrences(r.err, "] error: "), 1) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "ck/step-000001"));
  EXPECT_EQ(read_text(dir / "ck/manifest.json"), manifest);
  auto resumed = launch_worker(4, with({"--resume"}));
  EXPECT_EQ(resumed.exit_code, 0) << describe(resumed);
}

TEST(WorkerCheckpoints, PrivateDirectoriesKeepTheirOwnHomeAndShareTheCheckpointDirectory) {
  TempDir dir;
  // A relative directory is each process's own under --private-dirs: refused, naming who sees what.
  auto own =
      launch_worker(2, {"--checkpoint-dir", "ck", "--checkpoint-every", "1", "--steps", "2"}, {"--private-dirs"});
  EXPECT_NE(own.exit_code, 0);
  EXPECT_THAT(own.err, HasSubstr("--checkpoint-dir: directory 'ck' is not one directory shared by all 2 processes: "
                                 "process 0 sees the tokens of processes 0; process 1 sees the tokens of processes 1"));
  EXPECT_EQ(occurrences(own.err, "step 1/"), 0);
  remove_private_dirs(own.err);
  auto shared = dew_launch({"--private-dirs", "--processes-per-host", "2", "--", "/bin/sh", "-c",
                            dew_exe() + " worker --steps 2 --checkpoint-dir " + dir / "ck" +
                                " --checkpoint-every 1 --out " + dir / "out.json && echo home=$HOME cwd=$(pwd)"});
  remove_private_dirs(shared.err);
  ASSERT_EQ(shared.exit_code, 0) << describe(shared);
  EXPECT_THAT(read_text(dir / "ck/manifest.json"), HasSubstr("\"step\": 2,"));
  const std::regex home(R"(\[(\d)\] home=(\S+) cwd=(\S+))");
  std::set<std::string> homes;
  for (auto it = std::sregex_iterator(shared.out.begin(), shared.out.end(), home); it != std::sregex_iterator(); ++it) {
    homes.insert((*it)[2]);
    EXPECT_NE((*it)[2], std::getenv("HOME"));
  }
  EXPECT_EQ(homes.size(), 2u) << shared.out;
  // Each process cached the dataset in its own cache directory.
  EXPECT_THAT(shared.err, HasSubstr("0 of 2 processes found the tokenized dataset"));
}

}  // namespace
}  // namespace dew::testing
