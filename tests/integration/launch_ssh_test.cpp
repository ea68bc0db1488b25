// `dew launch` through a real sshd on a loopback port, started by the test
// with its own host key and an authorized key of its own.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>

#include <set>

#include "launch_helpers.h"
#include "srun_output.h"
#include "task_contract.h"

namespace dew::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

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
                                        "MaxStartups 100\nMaxSessions 100\nLogLevel ERROR\n"
                                        // A host's own GPUs, for the task contract's test (its clients send it).
                                        "AcceptEnv CUDA_VISIBLE_DEVICES\n";
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

// ssh carries no environment: the launcher's PYTHONPATH (where `import dew`
// is found) reaches the remote processes, so a rehearsal that passes on
// localhost passes over ssh too.
TEST_F(SshLaunch, RemoteProcessesGetTheLaunchersPythonPath) {
  auto r = dew_launch({"--hosts", "node0", "node1", "--", "/bin/sh", "-c", "echo \"pythonpath=$PYTHONPATH\""},
                      {{"DEW_LAUNCH_SSH_CONFIG", config()}, {"PYTHONPATH", "/opt/dew/python"}}, 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0] pythonpath=/opt/dew/python"));
  EXPECT_THAT(r.out, HasSubstr("[1] pythonpath=/opt/dew/python"));
}

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
    // The framework's rendezvous: the same host, a port of its own.
    EXPECT_THAT(i.jax, MatchesRegex("node0:1[0-9]{4}"));
    EXPECT_NE(i.jax, i.coord);
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

// The task contract (task_contract.h) over ssh: two hosts whose login
// environment has CUDA_VISIBLE_DEVICES=0,1,2,3 (ssh's SetEnv), two processes
// each: the same contract as every other launcher's, GPUs shared as srun
// --dew-pool shares them.
TEST_F(SshLaunch, TheTaskContractIsTheSameAsEveryOtherLaunchers) {
  const char* module_dir = std::getenv("DEW_PYTHON_MODULE_DIR");
  if (module_dir == nullptr || *module_dir == '\0') GTEST_SKIP() << "the dew Python module is not built";
  const std::string with_gpus = *dir_ / "ssh_config_gpus";
  std::ofstream(with_gpus) << std::regex_replace(read_text(config()), std::regex("Host node0 node1 node2\n"),
                                                 "Host node0 node1 node2\n  SetEnv CUDA_VISIBLE_DEVICES=0,1,2,3\n");
  auto r = dew_launch(
      {"--hosts", "node0", "node1", "--processes-per-host", "2", "--coordinator", "127.0.0.1", "--", "/usr/bin/python3",
       std::string(std::getenv("DEW_SOURCE_ROOT")) + "/tests/python/pool_script.py", "contract"},
      {{"DEW_LAUNCH_SSH_CONFIG", with_gpus}, {"PYTHONPATH", module_dir}}, 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  expect_task_contract(r, 2, 2, GpuContract{std::vector<std::string>{"0,1", "2,3"}, std::nullopt});
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
  EXPECT_THAT(r.err,
              HasSubstr("passwordless ssh must work: check that `ssh -o BatchMode=yes -- wrongkey true` succeeds"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  // Not the first host: asked for its GPUs (for its processes' share)
  // before any process starts, it is named the same way.
  auto second = launch({"--hosts", "node0", "wrongkey", "--", "/bin/true"}, 30s);
  EXPECT_EQ(second.exit_code, 1) << describe(second);
  EXPECT_THAT(second.err,
              HasSubstr("dew launch: cannot ask wrongkey for its GPUs over ssh (ended with exit code 255: "));
  EXPECT_EQ(std::count(second.err.begin(), second.err.end(), '\n'), 1) << second.err;
  // Started anyway (--devices-per-process off asks no GPUs), its rank is
  // named when its ssh fails.
  auto started = launch({"--hosts", "node0", "wrongkey", "--devices-per-process", "off", "--", "/bin/true"}, 30s);
  EXPECT_EQ(started.exit_code, 255) << describe(started);
  EXPECT_THAT(started.err, HasSubstr("dew launch: rank 1 on wrongkey ended with exit code 255 (ssh's code for a "
                                     "failed connection or login; passwordless ssh must work"));
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

}  // namespace
}  // namespace dew::testing
