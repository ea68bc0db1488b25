// The dew command's answers to what users get wrong: an unknown command, a
// launch without its command, a secret that is not one, a topology "file"
// that never ends, a call too large to count in 64 bits, a pool command
// that cannot join.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "process.h"
#include "test_paths.h"

namespace dew::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

RunResult dew(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
  args.insert(args.begin(), dew_exe());
  return run(args, env, std::chrono::seconds(60));
}

TEST(Usage, AnUnknownCommandIsNamedWithTheAllowedOnes) {
  auto r = dew({"bogus"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "dew: 'bogus' is not a dew command; allowed: topo, mesh, env, attention-plan, attention-check, "
            "launch, worker, layout-parity (dew --help lists them)\n");
}

TEST(Usage, ALaunchWithNothingAfterTheSeparatorSaysSo) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"launch", "--"}, std::vector<std::string>{"launch", "--hosts", "a", "b", "--"}}) {
    auto r = dew(args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("dew launch: no command: give it after --")) << r.err;
    EXPECT_THAT(r.err, Not(HasSubstr("--hosts at --"))) << "nothing to blame --hosts for";
  }
}

TEST(Usage, EnvSaysASecretThatIsNotOneIsNotUsable) {
  const std::map<std::string, std::string> pool = {
      {"DEW_PROCESS_ID", "1"}, {"DEW_PROCESS_COUNT", "2"}, {"DEW_COORDINATOR_ADDRESS", "127.0.0.1:29500"}};
  auto env = pool;
  env["DEW_POOL_SECRET"] = "abc";
  auto r = dew({"env"}, env);
  EXPECT_THAT(r.out, HasSubstr("pool secret:  not usable: DEW_POOL_SECRET has 3 characters; allowed: 64 hex digits"))
      << r.out;
  env["DEW_POOL_SECRET"] = std::string(64, 'c');
  r = dew({"env"}, env);
  EXPECT_THAT(r.out, HasSubstr("pool secret:  set (DEW_POOL_SECRET, 64 hex digits)")) << r.out;
}

// A pool command that cannot join exits 69, as libdew's join() does, so a
// launcher or a script tells "never joined" from "failed while training".
TEST(Usage, APoolCommandThatCannotJoinExits69) {
  const std::map<std::string, std::string> env = {{"DEW_PROCESS_ID", "1"},
                                                  {"DEW_PROCESS_COUNT", "2"},
                                                  {"DEW_COORDINATOR_ADDRESS", "127.0.0.1:1"},
                                                  {"DEW_POOL_SECRET", "abc"}};
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"worker", "--cache-dir", "off"}, std::vector<std::string>{"layout-parity"},
        std::vector<std::string>{"mesh", "--spec", "fsdp=2", "--pool"}}) {
    auto r = dew(args, env);
    EXPECT_EQ(r.exit_code, 69) << args[0] << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("DEW_POOL_SECRET has 3 characters")) << args[0];
  }
}

// Issue 26: --out run as root replaced the machine's /dev/full. Refused at
// once, before any training, with the device left as it was.
TEST(Usage, WorkerOutNeverReplacesADeviceOrAFifo) {
  const std::string dir = ::testing::TempDir() + "dew-out-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::vector<std::pair<std::string, std::string>> targets = {{fifo, "a FIFO"}};
  const std::string device = dir + "/full";
  if (::mknod(device.c_str(), S_IFCHR | 0666, makedev(1, 7)) == 0) targets.emplace_back(device, "a character device");
  for (const auto& [path, kind] : targets) {
    auto r = dew({"worker", "--cache-dir", "off", "--out", path});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("--out: " + path + " is " + kind + "; allowed: a regular file"));
    EXPECT_THAT(r.err, Not(HasSubstr("step 1/"))) << "refused before training";
    struct stat st {};
    ASSERT_EQ(::lstat(path.c_str(), &st), 0);
    EXPECT_FALSE(S_ISREG(st.st_mode)) << path << " left as it was";
  }
  std::filesystem::remove_all(dir);
}

// Issue 26: layout-parity --devices 2147483647 died of SIGFPE.
TEST(Usage, LayoutParityRefusesMoreDevicesThanAMeshHolds) {
  for (const char* devices : {"2147483647", "4097"}) {
    auto r = dew({"layout-parity", "--devices", devices});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr(std::string("--devices ") + devices + " is not allowed; allowed: 1 to 4096"));
  }
}

// Issue 26: two pools checkpointing into one directory both exited 0, one
// deleting the other's checkpoints. The second is refused at once, naming
// the first; once the first is gone (even by SIGKILL) the directory is free.
// Issue 42: each of these was accepted (or refused only after a 6.7 s run,
// or, for --cache-dir '', wrote under ~/.cache). Each is one line naming
// the value and what is allowed, exit 2, before any work.
TEST(Usage, NotANumberInfinityAnEmptyCacheDirAndAHostWithAPortAreRefusedAtOnce) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"attention-check", "--tolerance", "nan"},
       "--tolerance: 'nan' is not allowed; allowed: a finite number above 0"},
      {{"attention-check", "--tolerance", "-1"}, "--tolerance: '-1' is not allowed; allowed: a finite number above 0"},
      {{"layout-parity", "--factor", "inf"}, "--factor: 'inf' is not allowed; allowed: a finite number from 1"},
      {{"worker", "--cache-dir", ""}, "--cache-dir '' is not allowed; allowed: a directory, or off for no cache"},
      {{"launch", "--coordinator", "127.0.0.1:80", "--", "true"}, "--coordinator: '127.0.0.1:80' is not allowed"},
      {{"launch", "--coordinator", "[::1", "--", "true"}, "--coordinator: '[::1' is not allowed"},
      {{"attention-check", "--length", "1048576", "--heads", "4096", "--kv-heads", "8"},
       "--length 1048576 and --head-dim 64 need about "},
      {{"worker", "--cache-dir", "off", "--layers", "2147483647"}, "the model needs about "},
  };
  for (const auto& [args, line] : cases) {
    auto r = dew(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr(line));
    EXPECT_LT(r.seconds, 5.0) << r.err;
  }
}

// Issue 42: a --cache-dir that cannot be written said the dataset was
// "stored in" it.
TEST(Usage, AnUnusableCacheDirIsNotSaidToHoldTheDataset) {
  auto r = dew({"worker", "--cache-dir", "/proc/dew-no-such-dir", "--steps", "2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("1 process could not store it in /proc/dew-no-such-dir (each said why)"));
  EXPECT_THAT(r.err, HasSubstr("cache: cannot create /proc/dew-no-such-dir/"));
  EXPECT_THAT(r.err, Not(HasSubstr("stored it in")));
}

// Issue 42: a second pool of several processes was refused on process 0
// only; the others waited for it. Every process ends at once, the peers
// naming process 0's refusal.
TEST(Usage, ASecondPoolOfSeveralProcessesIsRefusedOnEveryProcessAtOnce) {
  const std::string dir = ::testing::TempDir() + "dew-ckpt-pool-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  Spawned first({dew_exe(), "worker", "--cache-dir", "off", "--checkpoint-dir", dir, "--checkpoint-every", "100000",
                 "--steps", "1000"});
  ASSERT_TRUE(first.wait_for_output("step 1/", std::chrono::seconds(30))) << first.err();
  ::kill(first.pid(), SIGSTOP);
  auto second = dew({"launch", "--processes-per-host", "4", "--", dew_exe(), "worker", "--cache-dir", "off",
                     "--checkpoint-dir", dir, "--steps", "2"});
  ::kill(first.pid(), SIGKILL);
  first.wait(std::chrono::seconds(10));
  EXPECT_EQ(second.exit_code, 1) << second.err;
  EXPECT_LT(second.seconds, 10.0) << second.err;
  EXPECT_THAT(second.err, HasSubstr("[0] error: --checkpoint-dir: " + dir + " is in use by a pool of 1 process"));
  for (const char* peer : {"[1] ", "[2] ", "[3] "}) {
    EXPECT_THAT(second.err, HasSubstr(std::string(peer) + "ending: process 0 failed: --checkpoint-dir: " + dir +
                                      " is in use by a pool of 1 process"));
  }
  EXPECT_THAT(second.err, Not(HasSubstr("step 1/")));
  std::filesystem::remove_all(dir);
}

// Issue 42: a lock file replaced by rename let a second pool train in the
// same directory. The holder stops at its next checkpoint, naming it.
TEST(Usage, ALockFileReplacedWhileHeldStopsThePoolAtItsNextCheckpoint) {
  const std::string dir = ::testing::TempDir() + "dew-ckpt-replaced-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  Spawned worker({dew_exe(), "worker", "--cache-dir", "off", "--checkpoint-dir", dir, "--checkpoint-every", "1",
                  "--steps", "100000"});
  ASSERT_TRUE(worker.wait_for_output("step 2/", std::chrono::seconds(30))) << worker.err();
  std::ofstream(dir + "/planted") << "another pool\n";
  std::filesystem::rename(dir + "/planted", dir + "/.dew-lock");
  const int code = worker.wait(std::chrono::seconds(20));
  EXPECT_EQ(code, 1) << worker.err();
  EXPECT_THAT(worker.err(), HasSubstr(dir + "/.dew-lock was removed or replaced while this pool held it: another "
                                            "pool may use the directory"));
  std::filesystem::remove_all(dir);
}

// Issue 42: a step directory planted as a symlink took the state outside
// the checkpoint directory. It is refused, and nothing is written there.
TEST(Usage, AStepDirectoryPlantedAsASymlinkIsRefusedAndNothingWrittenThrough) {
  const std::string root = ::testing::TempDir() + "dew-ckpt-planted-" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root + "/ckpt");
  std::filesystem::create_directories(root + "/elsewhere");
  std::filesystem::create_directory_symlink("../elsewhere", root + "/ckpt/step-000002");
  auto r = dew(
      {"worker", "--cache-dir", "off", "--checkpoint-dir", root + "/ckpt", "--checkpoint-every", "2", "--steps", "2"});
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("checkpoint state: " + root +
                               "/ckpt/step-000002 is a symlink or not a directory; "
                               "allowed: a directory Dew made, or none"));
  EXPECT_TRUE(std::filesystem::is_empty(root + "/elsewhere"));
  EXPECT_FALSE(std::filesystem::exists(root + "/ckpt/manifest.json"));
  std::filesystem::remove_all(root);
}

TEST(Usage, ASecondPoolOnACheckpointDirectoryIsRefusedNamingTheFirst) {
  const std::string dir = ::testing::TempDir() + "dew-ckpt-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  Spawned first({dew_exe(), "worker", "--cache-dir", "off", "--checkpoint-dir", dir, "--checkpoint-every", "100000",
                 "--steps", "1000"});
  ASSERT_TRUE(first.wait_for_output("step 1/", std::chrono::seconds(30))) << first.err();
  // Stopped, it still holds the directory, and neither finishes nor takes
  // the CPU from the other runs.
  ::kill(first.pid(), SIGSTOP);
  auto second = dew({"worker", "--cache-dir", "off", "--checkpoint-dir", dir, "--steps", "2"});
  EXPECT_NE(second.exit_code, 0) << second.err;
  EXPECT_THAT(second.err, HasSubstr("--checkpoint-dir: " + dir + " is in use by a pool of 1 process (process 0 on "));
  EXPECT_THAT(second.err, HasSubstr("pid " + std::to_string(first.pid()) + ", since "));
  EXPECT_THAT(second.err, Not(HasSubstr("step 1/"))) << "refused before training";
  ::kill(first.pid(), SIGKILL);
  first.wait(std::chrono::seconds(10));
  auto third = dew({"worker", "--cache-dir", "off", "--checkpoint-dir", dir, "--steps", "2"});
  EXPECT_EQ(third.exit_code, 0) << third.err;
  std::filesystem::remove_all(dir);
}

// Issue 26: --steps 100000000 ended in a bare std::bad_alloc (the dataset is
// made whole before step 1): refused at once with the estimate.
TEST(Usage, AWorkerTooLargeForThisMachineIsRefusedWithTheEstimate) {
  auto r = dew({"worker", "--cache-dir", "off", "--steps", "100000000"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("the model needs about "));
  EXPECT_THAT(r.err, HasSubstr("and the dataset of --steps x --batch sequences), more than this machine's "));
  EXPECT_THAT(r.err, Not(HasSubstr("bad_alloc")));
}

// dew env tells the truth about the bounds a process here would use: the
// watchdog from DEW_WATCHDOG (or the default) and the failure grace as dew
// worker and Python apply it.
TEST(Usage, EnvSaysTheWatchdogAndTheGraceAsTheyApply) {
  auto r = dew({"env"}, {});
  EXPECT_THAT(r.out, HasSubstr("watchdog:     30m (the default; DEW_WATCHDOG is unset)"));
  EXPECT_THAT(r.out, HasSubstr("failure grace 60 s for a libdew program; dew worker and import dew end at once"));
  r = dew({"env"}, {{"DEW_WATCHDOG", "2s"}, {"DEW_FAILURE_GRACE_SECONDS", "5"}});
  EXPECT_THAT(r.out, HasSubstr("watchdog:     2s (DEW_WATCHDOG)"));
  EXPECT_THAT(r.out, HasSubstr("failure grace 5 s (DEW_FAILURE_GRACE_SECONDS)"));
  r = dew({"env"}, {{"DEW_WATCHDOG", "soon"}});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("DEW_WATCHDOG: 'soon' is not allowed"));
}

// dew env --contract: every DEW_* variable of the task contract, with its
// value here or what holds without it; the secret only as set.
TEST(Usage, EnvContractListsEveryVariableWithItsValueOrItsDefault) {
  auto r = dew({"env", "--contract", "--json"}, {{"DEW_WATCHDOG", "2h"}, {"DEW_POOL_SECRET", std::string(64, 'c')}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out);
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& row : rows) by_name[row["name"].get<std::string>()] = row;
  EXPECT_EQ(by_name.size(), rows.size()) << "each name once";
  for (const char* name : {"DEW_PROCESS_ID", "DEW_COORDINATOR_ADDRESS", "DEW_WATCHDOG", "DEW_NOTICE_TAG",
                           "DEW_STOP_MARK", "DEW_MUNGE_SOCKET", "DEW_LOG_LEVEL"}) {
    ASSERT_EQ(by_name.count(name), 1u) << name;
    EXPECT_FALSE(by_name[name]["meaning"].get<std::string>().empty()) << name;
    EXPECT_FALSE(by_name[name]["written_by"].get<std::string>().empty()) << name;
  }
  EXPECT_EQ(by_name["DEW_WATCHDOG"]["value"], "2h");
  EXPECT_EQ(by_name["DEW_POOL_SECRET"]["value"], "(set, 64 characters)");
  EXPECT_TRUE(by_name["DEW_PROCESS_ID"]["value"].is_null());
  r = dew({"env", "--contract"}, {});
  EXPECT_THAT(r.out, HasSubstr("DEW_WATCHDOG = (unset: 30m)\n"));
}

TEST(Usage, TopoOfAnEndlessDeviceStopsAtTheLimit) {
  auto r = dew({"topo", "--topology", "/dev/zero"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_FALSE(r.timed_out);
  EXPECT_THAT(r.err, HasSubstr("/dev/zero: more than 64 MiB read, which is too large for a topology file"));
}

TEST(Usage, AttentionPlanCountsBytesPast64Bits) {
  // The largest allowed sizes: the all-to-all's bytes need about 2^68.
  auto r = dew({"attention-plan", "--heads", "1048576", "--kv-heads", "1", "--length", "1073741824", "--sequence", "2",
                "--head-dim", "65536", "--bytes-per-value", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("all-to-all  1.04858e+06 units, 295148468129306247168 bytes")) << r.out;
  EXPECT_THAT(r.out, Not(::testing::ContainsRegex(" -[0-9]"))) << "no negative counts";
  // The overflow once made the all-to-all look cheaper: the gather is.
  EXPECT_THAT(r.out, ::testing::StartsWith("exchange  gather\n"));
}

}  // namespace
}  // namespace dew::testing
