// `dew launch` on localhost with real processes: identities, output lines,
// failures and signals, ports, devices, private folders, runtime pools.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <regex>
#include <set>
#include <sstream>

#include "launch_helpers.h"
#include "srun_output.h"

namespace dew::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

// ---------------------------------------------------------------- localhost

TEST(LaunchLocal, FourProcessesGetTheirIdentities) {
  auto r = dew_launch({"--processes-per-host", "4", "--", "/bin/sh", "-c", kPrintIdentity});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  auto ids = identities(r.out);
  ASSERT_EQ(ids.size(), 4u) << r.out;
  std::set<std::string> secrets, coordinators;
  for (const auto& [rank, i] : ids) {
    EXPECT_EQ(i.id, rank);
    EXPECT_EQ(i.count, 4);
    EXPECT_EQ(i.local, rank);
    EXPECT_EQ(i.local_count, 4);
    EXPECT_THAT(i.coord, MatchesRegex("127\\.0\\.0\\.1:[0-9]+"));
    // The framework's rendezvous: the same host, a port of its own.
    EXPECT_THAT(i.jax, MatchesRegex("127\\.0\\.0\\.1:1[0-9]{4}"));
    EXPECT_NE(i.jax, i.coord);
    EXPECT_THAT(i.secret, MatchesRegex("[0-9a-f]{64}"));
    secrets.insert(i.secret);
    coordinators.insert(i.coord);
  }
  EXPECT_EQ(secrets.size(), 1u);
  EXPECT_EQ(coordinators.size(), 1u);
  auto again = dew_launch({"--", "/bin/sh", "-c", kPrintIdentity});
  ASSERT_EQ(identities(again.out).size(), 1u) << describe(again);
  EXPECT_NE(identities(again.out)[0].secret, *secrets.begin()) << "a fresh secret per launch";
  EXPECT_EQ(identities(again.out)[0].count, 1);
}

TEST(LaunchLocal, CwdAndDefaultDirectory) {
  TempDir dir;
  auto r = dew_launch({"--cwd", dir.path(), "--processes-per-host", "2", "--", "/bin/pwd"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0] " + dir.path() + "\n"));
  EXPECT_THAT(r.out, HasSubstr("[1] " + dir.path() + "\n"));
  auto here = dew_launch({"--", "/bin/pwd"});
  EXPECT_EQ(here.out, "[0] " + std::filesystem::current_path().string() + "\n");
  auto missing = dew_launch({"--cwd", dir / "nope", "--", "/bin/pwd"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("--cwd: '" + dir / "nope" + "' is not a directory here"));
}

TEST(LaunchLocal, EnvValuesArriveByteForByte) {
  TempDir dir;
  auto r = dew_launch(
      {"--processes-per-host", "2", "--env", "HOSTILE=" + kHostile, "--env", "EMPTY=", "--env",
       "XLA_FLAGS=--xla_force_host_platform_device_count=2", "--", "/bin/sh", "-c",
       "printf '%s|%s|%s' \"$HOSTILE\" \"${EMPTY-unset}\" \"$XLA_FLAGS\" > " + dir.path() + "/env.$DEW_PROCESS_ID"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (int k = 0; k < 2; ++k) {
    // The user's XLA_FLAGS, with the watchdog srun --dew-pool would add.
    EXPECT_EQ(read_text(dir / ("env." + std::to_string(k))),
              kHostile + "||--xla_force_host_platform_device_count=2 --xla_gpu_execution_terminate_timeout=30m");
  }
  EXPECT_FALSE(std::filesystem::exists("/tmp/dew-launch-pwned"));
}

TEST(LaunchLocal, EveryLineCarriesItsRankOnItsOwnStream) {
  auto r = dew_launch({"--processes-per-host", "3", "--", "/bin/sh", "-c",
                       "echo out$DEW_PROCESS_ID; echo err$DEW_PROCESS_ID >&2; printf 'no newline $DEW_PROCESS_ID'"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (int k = 0; k < 3; ++k) {
    const std::string n = std::to_string(k);
    EXPECT_THAT(r.out, HasSubstr("[" + n + "] out" + n + "\n"));
    EXPECT_THAT(r.out, Not(HasSubstr("err" + n)));
    EXPECT_THAT(r.err, HasSubstr("[" + n + "] err" + n + "\n"));
    EXPECT_THAT(r.err, Not(HasSubstr("out" + n)));
    EXPECT_THAT(r.out, HasSubstr("[" + n + "] no newline $DEW_PROCESS_ID\n")) << "the last piece becomes a line";
  }
}

TEST(LaunchLocal, LinesAreNeverCutIntoEachOtherUnderHeavyOutput) {
  // Four ranks, 20000 lines of 300 bytes each on both streams; awk writes in
  // 4 KiB blocks, so lines arrive cut across reads.
  const std::string program =
      "awk 'BEGIN { r = ENVIRON[\"DEW_PROCESS_ID\"]; x = sprintf(\"%300s\", \"\"); gsub(/ /, \"x\", x); "
      "for (i = 0; i < 20000; i++) { printf \"rank %s line %d %s\\n\", r, i, x; "
      "if (i % 10 == 0) printf \"rank %s err %d %s\\n\", r, i, x > \"/dev/stderr\" } }'";
  auto r = dew_launch({"--processes-per-host", "4", "--", "/bin/sh", "-c", program}, {}, 120s);
  ASSERT_EQ(r.exit_code, 0) << r.err.substr(0, 2000);
  for (const auto* stream : {&r.out, &r.err}) {
    const bool err = stream == &r.err;
    std::map<int, int> next;
    std::istringstream lines(*stream);
    const std::string x(300, 'x');
    int bad = 0;
    for (std::string line; std::getline(lines, line);) {
      std::smatch m;
      static const std::regex shape(R"(^\[(\d)\] rank (\d) (line|err) (\d+) (x+)$)");
      if (!std::regex_match(line, m, shape) || m[1] != m[2] || m[5] != x || (m[3] == "err") != err) {
        if (++bad < 3) ADD_FAILURE() << "cut or mixed line: " << line.substr(0, 200);
        continue;
      }
      const int rank = std::stoi(m[1]);
      EXPECT_EQ(std::stoi(m[4]), next[rank]) << "in order, none lost";
      next[rank] = std::stoi(m[4]) + (err ? 10 : 1);
    }
    EXPECT_EQ(bad, 0);
    for (int k = 0; k < 4; ++k) EXPECT_EQ(next[k], 20000) << (err ? "stderr" : "stdout") << " of rank " << k;
  }
}

TEST(LaunchLocal, FirstFailureStopsTheOthersAndReturnsItsCode) {
  TempDir dir;
  // Rank 1 fails after 0.5 s; rank 2 ignores SIGTERM, so only SIGKILL after
  // the grace ends it; ranks 0 and 3 sleep.
  const std::string program = "echo $$ > " + dir.path() +
                              "/pid.$DEW_PROCESS_ID; "
                              "case $DEW_PROCESS_ID in 1) sleep 0.5; exit 3;; 2) trap '' TERM; while :; do sleep 0.1; "
                              "done;; *) exec sleep 60;; esac";
  auto r = dew_launch({"--processes-per-host", "4", "--", "/bin/sh", "-c", program}, {}, 30s);
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_THAT(r.err,
              HasSubstr("dew launch: rank 1 on localhost ended with exit code 3; stopping the other processes\n"));
  EXPECT_LT(r.seconds, 0.5 + 2.0) << "the others are gone within 2 s of the failure";
  auto pids = pids_in(dir, "pid.", 4);
  ASSERT_EQ(pids.size(), 4u);
  EXPECT_TRUE(all_gone(pids, 100ms));
}

TEST(LaunchLocal, APeerFailedExitDoesNotHideTheRankThatFailed) {
  // As in a runtime pool: rank 2 fails (3) and the others end with 75 ("a
  // peer failed") at about the same moment; the launcher names rank 2.
  auto r = dew_launch(
      {"--processes-per-host", "4", "--", "/bin/sh", "-c", "if [ $DEW_PROCESS_ID = 2 ]; then exit 3; fi; exit 75"}, {},
      30s);
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("dew launch: rank 2 on localhost ended with exit code 3; stopping the other processes"));
}

TEST(LaunchLocal, SignalKilledRankIsNamedAndGives128PlusSignal) {
  auto r = dew_launch({"--processes-per-host", "2", "--", "/bin/sh", "-c",
                       "if [ $DEW_PROCESS_ID = 0 ]; then kill -KILL $$; fi; exec sleep 60"},
                      {}, 30s);
  EXPECT_EQ(r.exit_code, 137) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("dew launch: rank 0 on localhost ended with signal 9 (SIGKILL)"));
  EXPECT_LT(r.seconds, 3);
}

TEST(LaunchLocal, SigtermAndCtrlCToTheLauncherStopEveryProcess) {
  for (const int signo : {SIGTERM, SIGINT}) {
    TempDir dir;
    Background launcher({"--processes-per-host", "3", "--", "/bin/sh", "-c",
                         "echo $$ > " + dir.path() + "/pid.$DEW_PROCESS_ID; exec sleep 60"},
                        dir, "launch");
    ASSERT_TRUE(wait_for_files(dir, "pid.", 3, 10s)) << launcher.err();
    const auto sent = Clock::now();
    kill(launcher.pid(), signo);
    EXPECT_EQ(launcher.wait(10s), 128 + signo) << launcher.err();
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - sent).count(), 2.0);
    EXPECT_THAT(launcher.err(), HasSubstr("received: stopping every process"));
    EXPECT_TRUE(all_gone(pids_in(dir, "pid.", 3), 500ms));
  }
}

TEST(LaunchLocal, LaunchesStartedTogetherGetDifferentPorts) {
  TempDir dir;
  std::vector<std::unique_ptr<Background>> launches;
  for (int i = 0; i < 6; ++i) {
    launches.push_back(std::make_unique<Background>(
        std::vector<std::string>{"--processes-per-host", "2", "--", "/bin/sh", "-c", kPrintIdentity}, dir,
        "launch" + std::to_string(i)));
  }
  std::set<std::string> coordinators;
  for (auto& launch : launches) {
    ASSERT_EQ(launch->wait(), 0) << launch->err();
    auto ids = identities(launch->out());
    ASSERT_EQ(ids.size(), 2u);
    coordinators.insert(ids[0].coord);
  }
  EXPECT_EQ(coordinators.size(), 6u);
}

// No GPU here: the launcher's own CUDA_VISIBLE_DEVICES stands in for six
// (a fake: the binding rule reads only that list), and is sliced as the
// plugin slices a step's.
TEST(LaunchLocal, PortAndDevicesPerProcess) {
  auto r = dew_launch({"--processes-per-host", "3", "--devices-per-process", "2", "--port", "29555", "--", "/bin/sh",
                       "-c", "echo $DEW_COORDINATOR_ADDRESS $CUDA_VISIBLE_DEVICES $JAX_LOCAL_DEVICE_IDS"},
                      {{"CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b,GPU-c,GPU-d,GPU-e,GPU-f"}});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0] 127.0.0.1:29555 GPU-a,GPU-b 0,1\n"));
  EXPECT_THAT(r.out, HasSubstr("[1] 127.0.0.1:29555 GPU-c,GPU-d 0,1\n"));
  EXPECT_THAT(r.out, HasSubstr("[2] 127.0.0.1:29555 GPU-e,GPU-f 0,1\n"));
}

TEST(LaunchLocal, TooFewDevicesStopTheLaunchBeforeAnyProcessStarts) {
  const TempDir dir;
  auto r = dew_launch({"--processes-per-host", "3", "--devices-per-process", "2", "--", "/bin/sh", "-c",
                       "touch " + dir / "started-$DEW_PROCESS_ID"},
                      {{"CUDA_VISIBLE_DEVICES", "0,1,2,3"}});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("dew launch: --devices-per-process: local process 2 of 3 needs GPUs [4, 6) with 2 "
                               "devices per process, but this machine has 4 GPUs (CUDA_VISIBLE_DEVICES=0,1,2,3); 3 "
                               "processes need 6\n"));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "nothing started";
}

TEST(LaunchLocal, PrivateDirsGiveEachProcessItsOwnDirectoryHomeAndCache) {
  auto r = dew_launch(
      {"--processes-per-host", "2", "--private-dirs", "--", "/bin/sh", "-c", "echo \"$(pwd) $HOME $DEW_CACHE_DIR\""});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex("private directories: (/tmp/dew-launch-[0-9a-f]{12})/"))) << r.err;
  const std::string root = m[1];
  for (int k = 0; k < 2; ++k) {
    const std::string base = root + "/" + std::to_string(k);
    EXPECT_THAT(r.out,
                HasSubstr("[" + std::to_string(k) + "] " + base + "/work " + base + "/home " + base + "/cache\n"));
    EXPECT_TRUE(std::filesystem::is_directory(base + "/home"));
    EXPECT_TRUE(std::filesystem::is_directory(base + "/cache"));
  }
  EXPECT_EQ(remove_private_dirs(r.err), root);
}

TEST(LaunchLocal, DryRunPrintsTheExactCommandsAndRunsNothing) {
  TempDir dir;
  auto r = dew_launch({"--dry-run", "--processes-per-host", "2", "--port", "29500", "--cwd", dir.path(), "--env",
                       "V=" + kHostile, "--", "/bin/sh", "-c", "touch " + dir.path() + "/ran"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_FALSE(std::filesystem::exists(dir / "ran"));
  auto lines = lines_starting_with(r.out, "");
  ASSERT_EQ(lines.size(), 2u) << r.out;
  for (int k = 0; k < 2; ++k) {
    const auto& line = lines[static_cast<std::size_t>(k)];
    const std::string prefix = std::to_string(k) + " localhost: env -C " + dir.path() +
                               " DEW_PROCESS_ID=" + std::to_string(k) + " DEW_PROCESS_COUNT=2 ";
    ASSERT_EQ(line.rfind(prefix, 0), 0u) << line;
    EXPECT_THAT(line, HasSubstr(" DEW_COORDINATOR_ADDRESS=127.0.0.1:29500 "));
    // The printed command, run by bash, is the launch of that process.
    auto replay = run({"/bin/bash", "-c", line.substr(line.find(": ") + 2) + " && echo $DEW_PROCESS_ID"});
    EXPECT_EQ(replay.exit_code, 0) << replay.err;
  }
  EXPECT_TRUE(std::filesystem::exists(dir / "ran"));
}

TEST(LaunchLocal, UsageErrorsAreOneLineAndExit2) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--env", "FOO-BAR=1", "--", "true"}, "dew launch: --env: the name 'FOO-BAR' in 'FOO-BAR=1' is not allowed"},
      {{"--env", "NOVALUE", "--", "true"}, "dew launch: --env: 'NOVALUE' is not allowed; allowed: NAME=VALUE"},
      {{"--processes-per-host", "0", "--", "true"},
       "dew launch: --processes-per-host: '0' is not allowed; allowed: a whole number from 1 to 1024"},
      {{"--port", "0", "--", "true"}, "dew launch: --port: '0' is not allowed"},
      {{"--hosts", "a", "a", "--", "true"}, "dew launch: --hosts: 'a' is listed twice"},
      {{"--private-dirs", "--cwd", "/tmp", "--", "true"}, "dew launch: --cwd is not allowed with --private-dirs"},
      {{}, "dew launch: no command: give it after --"},
  };
  for (const auto& c : cases) {
    auto r = dew_launch(c.args);
    EXPECT_EQ(r.exit_code, 2) << describe(r);
    EXPECT_EQ(r.out, "");
    EXPECT_THAT(r.err, ::testing::StartsWith(c.message));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

TEST(LaunchLocal, TheCommandAfterHostsAndSeparatorIsKeptWhole) {
  // CLI11 ends --hosts at -- and would read the command's next words as
  // dew launch's options: the launcher checks its own command line.
  auto r = dew_launch({"--hosts", "localhost", "--", "/bin/sh", "-c", "echo \"$0 $1\"", "--port", "-h"});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out, "[0] --port -h\n");
  auto clash = dew_launch({"--hosts", "localhost", "--", "/bin/echo", "--port", "5"});
  EXPECT_EQ(clash.exit_code, 2) << describe(clash);
  EXPECT_THAT(clash.err, HasSubstr("dew launch: cannot tell the command from dew launch's own options"));
  auto fine = dew_launch({"--hosts", "localhost", "--processes-per-host", "1", "--", "/bin/echo", "--port", "5"});
  EXPECT_EQ(fine.out, "[0] --port 5\n") << describe(fine);
}

TEST(LaunchLocal, HelpDescribesEveryOption) {
  auto r = dew_launch({"--help"});
  ASSERT_EQ(r.exit_code, 0);
  for (const char* option :
       {"--hosts", "--processes-per-host", "--devices-per-process", "--port", "--coordinator", "--env", "--cwd",
        "--private-dirs", "--slurm", "--ssh-config", "DEW_LAUNCH_SSH_CONFIG", "--ssh-option", "--dry-run"}) {
    EXPECT_THAT(r.out, HasSubstr(option));
  }
}

TEST(LaunchLocal, AMissingProgramIsReportedWithItsRank) {
  auto r = dew_launch({"--", "/nonexistent/python"});
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_THAT(r.err, HasSubstr("dew launch: cannot start rank 0 on localhost: cannot run /nonexistent/python"));
  EXPECT_THAT(r.err, HasSubstr(": No such file or directory; stopping the other processes\n"));
}

// The runtime pool's worker (tests/unit/pool/pool_worker), when this build has
// it: real pools, joined through the variables dew launch sets.
std::string pool_worker() {
  const char* path = std::getenv("DEW_POOL_WORKER");
  return path != nullptr ? path : "";
}

TEST(LaunchPool, FourLocalProcessesJoinTheRuntimePool) {
  if (pool_worker().empty()) GTEST_SKIP() << "no DEW_POOL_WORKER in this build";
  auto r = dew_launch({"--processes-per-host", "4", "--", pool_worker(), "exchange"}, {}, 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (int k = 0; k < 4; ++k) {
    const std::string n = std::to_string(k);
    EXPECT_THAT(r.out, HasSubstr("[" + n + "] RESULT rank=" + n + " size=4 source=dew backend=tcp local=" + n +
                                 "/4 gets=hello from 0|hello from 1|hello from 2|hello from 3"));
    // One rank prefix per line: the launcher's (libdew leaves its own off).
    EXPECT_THAT(r.err, HasSubstr("[" + n + "] Joined the pool: process " + n + " of 4 (dew, tcp)"));
    EXPECT_THAT(r.err, Not(HasSubstr("[" + n + "] [" + n + "]")));
  }
}

TEST(LaunchPool, AttentionCheckAcrossFourLocalProcesses) {
  // dew attention-check in a pool dew launch starts: 4 processes x 2 devices,
  // every sequence group spanning processes; process 0 prints the table.
  auto r = dew_launch(
      {"--processes-per-host", "4", "--", dew_exe(), "attention-check", "--devices-per-process", "2", "--heads", "8",
       "--kv-heads", "8", "--length", "256", "--head-dim", "16", "--mesh", "sequence=4,fsdp=2", "--runs", "1"},
      {{"OPENBLAS_NUM_THREADS", "1"}}, 120s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0] attention check: 8 devices (4 processes x 2), mesh fsdp=2,sequence=4;"));
  EXPECT_EQ(dew::testing::occurrences(r.out, "  ok\n"), 2) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0] result: every exchange matches whole-sequence attention")) << describe(r);
  EXPECT_THAT(r.out, Not(HasSubstr("[1] attention check"))) << describe(r);
}

TEST(LaunchPool, AFrozenRankIsNamedAndItsCodeReturnedNever75) {
  // Rank 1 stops (SIGSTOP): its peers find it by heartbeats and end with 75
  // ("a peer failed"), naming it; the launcher names rank 1 and exits with
  // its code once it has stopped it.
  if (pool_worker().empty()) GTEST_SKIP() << "no DEW_POOL_WORKER in this build";
  TempDir dir;
  Background launcher({"--processes-per-host", "3", "--", "/bin/sh", "-c",
                       "echo $$ > " + dir.path() + "/pid.$DEW_PROCESS_ID; exec " + pool_worker() + " steps"},
                      dir, "launch", {{"DEW_HEARTBEAT_TIMEOUT_SECONDS", "1"}});
  ASSERT_TRUE(wait_for_files(dir, "pid.", 3, 20s)) << launcher.err();
  const auto pids = pids_in(dir, "pid.", 3);
  for (int i = 0; i < 100 && launcher.out().find("READY") == std::string::npos; ++i) std::this_thread::sleep_for(100ms);
  ASSERT_THAT(launcher.out(), HasSubstr("READY")) << launcher.err();
  kill(pids.at(1), SIGSTOP);
  EXPECT_EQ(launcher.wait(20s), 128 + SIGTERM) << launcher.err();
  EXPECT_LT(launcher.seconds(), 30.0);
  EXPECT_THAT(launcher.err(), HasSubstr("dew launch: rank 1 on localhost failed: its peers ended because process 1 "
                                        "stopped answering: no heartbeat for 1 s; stopping the other processes"))
      << launcher.err();
  EXPECT_TRUE(all_gone(pids, 2s));
}

TEST(LaunchPool, TheRankThatFailsIsNamedNotItsPeers) {
  if (pool_worker().empty()) GTEST_SKIP() << "no DEW_POOL_WORKER in this build";
  auto r = dew_launch({"--processes-per-host", "4", "--", pool_worker(), "throw", "2"}, {}, 60s);
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("dew launch: rank 2 on localhost ended with exit code 1; stopping the other processes"));
  EXPECT_EQ(dew::testing::occurrences(r.err, "[2] error: uncaught exception: boom from rank 2"), 1) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("[0] ending: process 2 failed: uncaught exception: boom from rank 2"));
}

}  // namespace
}  // namespace dew::testing
