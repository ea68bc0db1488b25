// `dew launch` with real processes: on localhost, through a real sshd on a
// loopback port (started by the test with its own host key and an
// authorized key of its own), and with --slurm on the two-node test cluster.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "dew/launch_plan.h"
#include "dew/process.h"
#include "slurm_cluster.h"
#include "srun_output.h"
#include "test_paths.h"

extern char** environ;

namespace dew::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kHostile =
    "a b 'single' \"double\" $(touch /tmp/dew-launch-pwned) `id` ; rm -rf /nonexistent & | \\ $HOME\nsecond "
    "line\t*?[]{}!#~ -- --env X=1";

// A shell command printing the pool variables as `key=value` lines.
const std::string kPrintIdentity =
    "echo id=$DEW_PROCESS_ID count=$DEW_PROCESS_COUNT local=$DEW_LOCAL_PROCESS_ID "
    "local_count=$DEW_LOCAL_PROCESS_COUNT coord=$DEW_COORDINATOR_ADDRESS jax=$JAX_COORDINATOR_ADDRESS "
    "secret=$DEW_POOL_SECRET";

RunResult dew_launch(std::vector<std::string> args, std::map<std::string, std::string> env = {},
                     std::chrono::milliseconds timeout = 60s) {
  args.insert(args.begin(), {dew_exe(), "launch"});
  return run(args, env, timeout);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Identity {
  int id = -1, count = -1, local = -1, local_count = -1;
  std::string coord, jax, secret;
};

// "[k] id=… count=…" lines of stdout, by rank.
std::map<int, Identity> identities(const std::string& out) {
  std::map<int, Identity> result;
  const std::regex line(
      R"(^\[(\d+)\] id=(\d+) count=(\d+) local=(\d+) local_count=(\d+) coord=(\S*) jax=(\S*) secret=(\S*)$)");
  std::istringstream stream(out);
  for (std::string text; std::getline(stream, text);) {
    std::smatch m;
    if (!std::regex_match(text, m, line)) continue;
    Identity& i = result[std::stoi(m[1])];
    i.id = std::stoi(m[2]);
    i.count = std::stoi(m[3]);
    i.local = std::stoi(m[4]);
    i.local_count = std::stoi(m[5]);
    i.coord = m[6];
    i.jax = m[7];
    i.secret = m[8];
  }
  return result;
}

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/dew-launch-test-XXXXXX";
    if (mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

bool alive(pid_t pid) { return kill(pid, 0) == 0; }

// Waits until every pid named in the files is gone; false after `limit`.
bool all_gone(const std::vector<pid_t>& pids, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    bool any = false;
    for (const pid_t pid : pids) any = any || alive(pid);
    if (!any) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

std::vector<pid_t> pids_in(const TempDir& dir, const std::string& prefix, int count) {
  std::vector<pid_t> pids;
  for (int k = 0; k < count; ++k) {
    const std::string text = read_text(dir / (prefix + std::to_string(k)));
    if (!text.empty()) pids.push_back(static_cast<pid_t>(std::stol(text)));
  }
  return pids;
}

bool wait_for_files(const TempDir& dir, const std::string& prefix, int count, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    int present = 0;
    for (int k = 0; k < count; ++k) present += !read_text(dir / (prefix + std::to_string(k))).empty();
    if (present == count) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// A launcher running in the background, its output into files.
class Background {
 public:
  Background(std::vector<std::string> args, const TempDir& dir, const std::string& name,
             std::map<std::string, std::string> env = {})
      : out_(dir / (name + ".out")), err_(dir / (name + ".err")) {
    args.insert(args.begin(), {dew_exe(), "launch"});
    dew::SpawnOptions options;
    options.argv = args;
    for (const auto& [name, value] : env) options.env.emplace_back(name, value);
    options.stdout_mode = options.stderr_mode = dew::Stdio::kFile;
    options.stdout_file = out_;
    options.stderr_file = err_;
    start_ = Clock::now();
    auto child = dew::spawn(options);
    pid_ = child.ok() ? child.value().pid : -1;
  }
  ~Background() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      wait();
    }
  }
  pid_t pid() const { return pid_; }
  // The exit code (128 + signal), or -1 after `limit`.
  int wait(std::chrono::milliseconds limit = 30s) {
    const auto deadline = Clock::now() + limit;
    int status = 0;
    while (true) {
      const pid_t done = waitpid(pid_, &status, WNOHANG);
      if (done == pid_) break;
      if (Clock::now() > deadline) return -1;
      std::this_thread::sleep_for(10ms);
    }
    reaped_ = true;
    seconds_ = std::chrono::duration<double>(Clock::now() - start_).count();
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  double seconds() const { return seconds_; }
  std::string out() const { return read_text(out_); }
  std::string err() const { return read_text(err_); }

 private:
  std::string out_, err_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  Clock::time_point start_;
  double seconds_ = 0;
};

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
    EXPECT_EQ(i.jax, i.coord);
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
    EXPECT_EQ(read_text(dir / ("env." + std::to_string(k))), kHostile + "||--xla_force_host_platform_device_count=2");
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
  EXPECT_THAT(r.err, HasSubstr("dew launch: rank 1 on localhost ended with exit code 3; stopping the other processes\n"));
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
  std::filesystem::remove_all(root);
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

// The runtime pool's worker (tests/unit/runtime/pool/pool_worker), when this build has
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
  auto r = dew_launch({"--processes-per-host", "4", "--", dew_exe(), "attention-check", "--devices-per-process", "2",
                       "--heads", "8", "--kv-heads", "8", "--length", "256", "--head-dim", "16", "--mesh",
                       "sequence=4,fsdp=2", "--runs", "1"},
                      {{"OPENBLAS_NUM_THREADS", "1"}}, 120s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0] attention check: 8 devices (4 processes x 2), mesh fsdp=2,sequence=4;"));
  EXPECT_EQ(dew::testing::occurrences(r.out, "  ok\n"), 2) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0] result: every exchange matches whole-sequence attention")) << describe(r);
  EXPECT_THAT(r.out, Not(HasSubstr("[1] attention check"))) << describe(r);
}

TEST(LaunchPool, TheRankThatFailsIsNamedNotItsPeers) {
  if (pool_worker().empty()) GTEST_SKIP() << "no DEW_POOL_WORKER in this build";
  auto r = dew_launch({"--processes-per-host", "4", "--", pool_worker(), "throw", "2"}, {}, 60s);
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("dew launch: rank 2 on localhost ended with exit code 1; stopping the other processes"));
  EXPECT_EQ(dew::testing::occurrences(r.err, "[2] error: uncaught exception: boom from rank 2"), 1) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("[0] ending: process 2 failed: uncaught exception: boom from rank 2"));
}

// ---------------------------------------------------------------------- ssh


bool accepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  close(fd);
  return ok;
}

// Debian's sshd on a loopback port: its own host key, one authorized key,
// and an ssh_config naming three hosts that all reach it.
class SshLaunch : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    const TempDir& d = *dir_;
    std::filesystem::create_directories("/run/sshd");  // sshd's privilege separation directory
    for (const char* key : {"host_key", "id", "other_id"}) {
      auto made = run({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", d / key});
      ASSERT_EQ(made.exit_code, 0) << made.err;
    }
    std::filesystem::copy_file(d / "id.pub", d / "authorized_keys");
    port_ = static_cast<int>(dew::testing::free_loopback_port());
    std::ofstream(d / "sshd_config") << "Port " << port_ << "\nListenAddress 127.0.0.1\nHostKey " << d / "host_key"
                                     << "\nAuthorizedKeysFile " << d / "authorized_keys"
                                     << "\nPidFile " << d / "sshd.pid"
                                     << "\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n"
                                        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
                                        "MaxStartups 100\nMaxSessions 100\nLogLevel ERROR\n";
    const std::string user = getpwuid(getuid())->pw_name;
    std::ofstream(d / "ssh_config") << "Host node0 node1 node2\n  HostName 127.0.0.1\n  Port " << port_ << "\n  User "
                                    << user << "\n  IdentityFile " << d / "id"
                                    << "\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
                                       "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
                                    << "Host wrongkey\n  HostName 127.0.0.1\n  Port " << port_ << "\n  User " << user
                                    << "\n  IdentityFile " << d / "other_id"
                                    << "\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
                                       "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n";
    sshd_pid_ = 0;
    dew::SpawnOptions sshd;
    sshd.argv = {"/usr/sbin/sshd", "-D", "-e", "-f", d / "sshd_config"};
    sshd.stdout_mode = sshd.stderr_mode = dew::Stdio::kFile;
    sshd.stdout_file = sshd.stderr_file = d / "sshd.log";
    auto started = dew::spawn(sshd);
    ASSERT_TRUE(started.ok()) << started.error().message;
    sshd_pid_ = started.value().pid;
    const auto deadline = Clock::now() + 10s;
    while (!accepts(port_) && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
    ASSERT_TRUE(accepts(port_)) << read_text(d / "sshd.log");
  }
  static void TearDownTestSuite() {
    if (sshd_pid_ > 0) {
      kill(sshd_pid_, SIGTERM);
      waitpid(sshd_pid_, nullptr, 0);
    }
    delete dir_;
  }
  static std::string config() { return *dir_ / "ssh_config"; }
  static RunResult launch(std::vector<std::string> args, std::chrono::milliseconds timeout = 60s) {
    return dew_launch(std::move(args), {{"DEW_LAUNCH_SSH_CONFIG", config()}}, timeout);
  }

  static TempDir* dir_;
  static pid_t sshd_pid_;
  static int port_;
};
TempDir* SshLaunch::dir_ = nullptr;
pid_t SshLaunch::sshd_pid_ = 0;
int SshLaunch::port_ = 0;

TEST_F(SshLaunch, TwoHostsOverSshGetTheirIdentities) {
  auto r = launch({"--hosts", "node0", "node1", "--processes-per-host", "2", "--", "/bin/sh", "-c", kPrintIdentity});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  auto ids = identities(r.out);
  ASSERT_EQ(ids.size(), 4u) << describe(r);
  std::set<std::string> secrets;
  for (const auto& [rank, i] : ids) {
    EXPECT_EQ(i.id, rank);
    EXPECT_EQ(i.count, 4);
    EXPECT_EQ(i.local, rank % 2);
    EXPECT_EQ(i.local_count, 2);
    EXPECT_THAT(i.coord, MatchesRegex("node0:[0-9]+"));
    EXPECT_EQ(i.jax, i.coord);
    EXPECT_THAT(i.secret, MatchesRegex("[0-9a-f]{64}"));
    secrets.insert(i.secret);
  }
  EXPECT_EQ(secrets.size(), 1u) << "one secret, carried on ssh's stdin";
  const int port = std::stoi(ids[0].coord.substr(6));
  EXPECT_GE(port, 1024) << "asked from node0";
}

TEST_F(SshLaunch, ARuntimePoolJoinsOverSsh) {
  if (pool_worker().empty()) GTEST_SKIP() << "no DEW_POOL_WORKER in this build";
  // node0 is an ssh alias: the processes reach the coordinator at 127.0.0.1.
  auto r = launch({"--hosts", "node0", "node1", "--processes-per-host", "2", "--coordinator", "127.0.0.1", "--",
                   pool_worker(), "exchange"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (int k = 0; k < 4; ++k) {
    const std::string n = std::to_string(k);
    EXPECT_THAT(r.out, HasSubstr("[" + n + "] RESULT rank=" + n +
                                 " size=4 source=dew backend=tcp local=" + std::to_string(k % 2) + "/2 "));
  }
}

TEST_F(SshLaunch, LocalAndRemoteHostsMix) {
  auto r =
      launch({"--hosts", "localhost", "node1", "--coordinator", "127.0.0.1", "--", "/bin/sh", "-c", kPrintIdentity});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  auto ids = identities(r.out);
  ASSERT_EQ(ids.size(), 2u) << describe(r);
  EXPECT_EQ(ids[0].coord, ids[1].coord);
  EXPECT_EQ(ids[0].secret, ids[1].secret);
  EXPECT_THAT(ids[1].coord, MatchesRegex("127\\.0\\.0\\.1:[0-9]+"));
}

TEST_F(SshLaunch, HostileEnvAndArgumentsCrossSshByteForByte) {
  TempDir out;
  auto r = launch({"--hosts", "node0", "node1", "--cwd", out.path(), "--env", "HOSTILE=" + kHostile, "--", "/bin/sh",
                   "-c", "printf '%s|%s|%s' \"$HOSTILE\" \"$1\" \"$(pwd)\" > env.$DEW_PROCESS_ID", "sh", kHostile});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(read_text(out / ("env." + std::to_string(k))), kHostile + "|" + kHostile + "|" + out.path());
  }
  EXPECT_FALSE(std::filesystem::exists("/tmp/dew-launch-pwned"));
}

TEST_F(SshLaunch, RanksKeepTheirStreams) {
  auto r = launch(
      {"--hosts", "node0", "node1", "--", "/bin/sh", "-c", "echo out$DEW_PROCESS_ID; echo err$DEW_PROCESS_ID >&2"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, AllOf(HasSubstr("[0] out0\n"), HasSubstr("[1] out1\n"), Not(HasSubstr("err"))));
  EXPECT_THAT(r.err, AllOf(HasSubstr("[0] err0\n"), HasSubstr("[1] err1\n")));
}

TEST_F(SshLaunch, ARemoteFailureStopsEveryProcess) {
  TempDir dir;
  const std::string program = "echo $$ > " + dir.path() +
                              "/pid.$DEW_PROCESS_ID; if [ $DEW_PROCESS_ID = 3 ]; then "
                              // fail once every rank runs (ssh logins take seconds on a busy host)
                              "while [ $(ls " +
                              dir.path() +
                              " | wc -l) -lt 4 ]; do sleep 0.1; done; exit 5; fi; "
                              "exec sleep 60";
  auto r = launch({"--hosts", "node0", "node1", "--processes-per-host", "2", "--", "/bin/sh", "-c", program}, 30s);
  EXPECT_EQ(r.exit_code, 5) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("dew launch: rank 3 on node1 ended with exit code 5; stopping the other processes\n"));
  auto pids = pids_in(dir, "pid.", 4);
  ASSERT_EQ(pids.size(), 4u);
  EXPECT_TRUE(all_gone(pids, 2s)) << "the remote processes end too";
}

TEST_F(SshLaunch, KillingTheSshConnectionEndsTheRemoteProcess) {
  TempDir dir;
  Background launcher(
      {"--hosts", "node0", "--", "/bin/sh", "-c", "echo $$ > " + dir.path() + "/pid.$DEW_PROCESS_ID; exec sleep 60"},
      dir, "launch", {{"DEW_LAUNCH_SSH_CONFIG", config()}});
  ASSERT_TRUE(wait_for_files(dir, "pid.", 1, 20s)) << launcher.err();
  const pid_t remote = pids_in(dir, "pid.", 1).at(0);
  ASSERT_TRUE(alive(remote));
  // The launcher's only child is the ssh client: kill it as a dropped
  // connection would.
  const std::string children =
      read_text("/proc/" + std::to_string(launcher.pid()) + "/task/" + std::to_string(launcher.pid()) + "/children");
  ASSERT_FALSE(children.empty());
  const pid_t ssh = static_cast<pid_t>(std::stol(children));
  ASSERT_THAT(read_text("/proc/" + std::to_string(ssh) + "/cmdline"), ::testing::StartsWith(std::string("ssh\0", 4)));
  kill(ssh, SIGKILL);
  EXPECT_TRUE(all_gone({remote}, 3s)) << "the remote process ends with its connection";
  EXPECT_EQ(launcher.wait(10s), 137) << launcher.err();
  EXPECT_THAT(launcher.err(), HasSubstr("rank 0 on node0 ended with signal 9 (SIGKILL)"));
}

TEST_F(SshLaunch, SigtermToTheLauncherStopsRemoteProcesses) {
  TempDir dir;
  Background launcher({"--hosts", "localhost", "node1", "node2", "--coordinator", "127.0.0.1", "--", "/bin/sh", "-c",
                       "echo $$ > " + dir.path() + "/pid.$DEW_PROCESS_ID; exec sleep 60"},
                      dir, "launch", {{"DEW_LAUNCH_SSH_CONFIG", config()}});
  ASSERT_TRUE(wait_for_files(dir, "pid.", 3, 20s)) << launcher.err();
  kill(launcher.pid(), SIGTERM);
  EXPECT_EQ(launcher.wait(10s), 143) << launcher.err();
  EXPECT_TRUE(all_gone(pids_in(dir, "pid.", 3), 3s));
}

TEST_F(SshLaunch, AHostWithoutPasswordlessLoginIsNamedInOneLine) {
  auto r = launch({"--hosts", "wrongkey", "node1", "--", "/bin/true"}, 30s);
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("dew launch: cannot ask wrongkey for a free port over ssh (ended with exit code 255: "));
  EXPECT_THAT(r.err, HasSubstr("Permission denied"));
  EXPECT_THAT(r.err, HasSubstr("passwordless ssh must work: check that `ssh -o BatchMode=yes wrongkey true` succeeds"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  // Not the first host: the rank is named when its ssh fails.
  auto second = launch({"--hosts", "node0", "wrongkey", "--", "/bin/true"}, 30s);
  EXPECT_EQ(second.exit_code, 255) << describe(second);
  EXPECT_THAT(second.err, HasSubstr("dew launch: rank 1 on wrongkey ended with exit code 255 (ssh's code for a failed "
                                    "connection or login; passwordless ssh must work"));
}

TEST_F(SshLaunch, DryRunShowsTheSshCommands) {
  auto r = launch({"--dry-run", "--hosts", "node0", "node1", "--env", "V=a'b", "--", "/bin/true"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("dew launch: --dry-run: remote hosts are not asked; the port shows as PORT"));
  auto lines = lines_starting_with(r.out, "");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0], ::testing::StartsWith("0 node0: ssh -o BatchMode=yes -F " + config() + " -- node0 "));
  EXPECT_THAT(lines[1], HasSubstr("export DEW_COORDINATOR_ADDRESS=node0:PORT; "));
  // bash reads the printed line back as the ssh argv; its remote script
  // carries the value quoted for the remote shell.
  auto words = run({"/bin/bash", "-c", "printf '%s\\n' " + lines[1].substr(lines[1].find(": ") + 2)});
  // That last word is `sh -c SCRIPT`, SCRIPT quoted once more.
  EXPECT_THAT(words.out, HasSubstr("\nsh -c 'IFS= read -r DEW_POOL_SECRET"));
  EXPECT_THAT(words.out, HasSubstr(R"(export V='\''a'\''\'\'''\''b'\''; )"));
}

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
  for (const auto& [rank, i] : ids) {
    EXPECT_EQ(i.id, rank);
    EXPECT_EQ(i.count, 4);
    EXPECT_EQ(i.local_count, 2);
    EXPECT_THAT(i.coord, MatchesRegex("n1:[0-9]+"));
    EXPECT_THAT(i.secret, MatchesRegex("[0-9a-f]{64}"));
    EXPECT_THAT(r.out, HasSubstr("[" + std::to_string(rank) +
                                 "] greeting=it's $(not run) node=" + std::to_string(rank / 2) + "\n"));
  }
}

TEST(LaunchSlurm, DryRunShowsSrunWithDewOptions) {
  auto r = cluster().command({dew_exe(), "launch", "--slurm", "--dry-run", "--processes-per-host", "8",
                              "--devices-per-process", "1", "--env", "A=1", "--", "/opt/venv/bin/python", "train.py"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out,
            "slurm: env A=1 srun --ntasks-per-node=8 --kill-on-bad-exit=1 --export=ALL --label --dew-pool "
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

// A slurm.conf whose plugstack.conf loads nothing: srun without the plugin.
std::string conf_without_plugin() {
  const std::string folder = cluster().dir() + "/no-plugin";
  std::filesystem::create_directories(folder);
  std::ofstream(folder + "/plugstack.conf") << "";
  const std::regex plugstack_line("^PlugStackConfig=.*$", std::regex::multiline);
  std::ofstream(folder + "/slurm.conf") << std::regex_replace(read_text(cluster().conf()), plugstack_line,
                                                              "PlugStackConfig=" + folder + "/plugstack.conf");
  return folder + "/slurm.conf";
}

TEST(LaunchSlurm, WithoutThePluginSrunRunsPlainAndDevicesPerProcessIsRefused) {
  const std::map<std::string, std::string> env = {{"SLURM_CONF", conf_without_plugin()}};
  auto r = cluster().command({dew_exe(), "launch", "--slurm", "--processes-per-host", "2", "--", "/bin/sh", "-c",
                              "echo rank=$SLURM_PROCID pool=${DEW_POOL_SECRET-none}"},
                             env, 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0] rank=0 pool=none\n"));
  EXPECT_THAT(r.out, HasSubstr("[1] rank=1 pool=none\n"));
  auto refused =
      cluster().command({dew_exe(), "launch", "--slurm", "--devices-per-process", "1", "--", "/bin/true"}, env, 60s);
  EXPECT_EQ(refused.exit_code, 2) << describe(refused);
  EXPECT_THAT(refused.err,
              HasSubstr("dew launch: --devices-per-process with --slurm needs Dew's SPANK plugin (srun --dew-pool), "
                        "which this srun does not load; without it JAX gives each task the one GPU at "
                        "SLURM_LOCALID"));
  auto dry = cluster().command({dew_exe(), "launch", "--slurm", "--dry-run", "--", "/bin/true"}, env, 60s);
  EXPECT_EQ(dry.out, "slurm: srun --ntasks-per-node=1 --kill-on-bad-exit=1 --export=ALL --label /bin/true\n");
}

}  // namespace
}  // namespace dew::testing
