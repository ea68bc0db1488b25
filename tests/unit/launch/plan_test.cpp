// dew launch's pure core: option checks, every process's environment and
// command, quoting (checked through a real /bin/sh), the remote script.
// srun and host queries: slurm_test.cpp; output lines: lines_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dew/launch_plan.h"
#include "expect_error.h"
#include "plan_helpers.h"
#include "process.h"

namespace dew::launch {
namespace {

using ::testing::ElementsAre;
using testing::env_map;
using testing::facts;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::options_with;
using ::testing::Pair;
using testing::planned;
using ::testing::StartsWith;

const std::string kHostile = "a b 'q' \"dq\" $(touch /tmp/dew-pwned) `id` ; rm -rf x & | \\ $HOME\nline2\t*?[]{}!#~";

TEST(LaunchOptions, ShellNames) {
  EXPECT_TRUE(is_shell_name("A"));
  EXPECT_TRUE(is_shell_name("_x9"));
  EXPECT_TRUE(is_shell_name("NCCL_P2P_DISABLE"));
  EXPECT_FALSE(is_shell_name(""));
  EXPECT_FALSE(is_shell_name("9A"));
  EXPECT_FALSE(is_shell_name("A-B"));
  EXPECT_FALSE(is_shell_name("A B"));
  EXPECT_FALSE(is_shell_name("A.B"));
}

TEST(LaunchOptions, EnvSplitsAtTheFirstEquals) {
  auto env = parse_env_options({"A=1", "XLA_FLAGS=--x=y=z", "EMPTY=", "H=" + kHostile}, false, false);
  ASSERT_TRUE(env.ok()) << env.error().message;
  EXPECT_THAT(env.value(),
              ElementsAre(Pair("A", "1"), Pair("XLA_FLAGS", "--x=y=z"), Pair("EMPTY", ""), Pair("H", kHostile)));
}

TEST(LaunchOptions, EnvErrorsNameTheEntry) {
  auto no_equals = parse_env_options({"JUSTNAME"}, false, false);
  EXPECT_EQ(dew::testing::invalid_argument_of(no_equals),
            "--env: 'JUSTNAME' is not allowed; allowed: NAME=VALUE, such as --env NCCL_P2P_DISABLE=1");
  auto bad_name = parse_env_options({"FOO-BAR=1"}, false, false);
  ASSERT_FALSE(bad_name.ok());
  EXPECT_THAT(bad_name.error().message, StartsWith("--env: the name 'FOO-BAR' in 'FOO-BAR=1' is not allowed"));
  EXPECT_THAT(bad_name.error().message, HasSubstr("shell variable name"));
  auto newline = parse_env_options({"A\nB=1"}, false, false);
  ASSERT_FALSE(newline.ok());
  EXPECT_THAT(newline.error().message, StartsWith("--env: the name $'A\\nB' in $'A\\nB=1' is not allowed"));
  EXPECT_EQ(newline.error().message.find('\n'), std::string::npos) << "one line";
  auto twice = parse_env_options({"A=1", "A=2"}, false, false);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.error().message, "--env: 'A' is given twice; allowed: each name once");
  auto reserved = parse_env_options({"DEW_PROCESS_ID=3"}, false, false);
  ASSERT_FALSE(reserved.ok());
  EXPECT_THAT(reserved.error().message, HasSubstr("'DEW_PROCESS_ID' is not allowed: dew launch sets it"));
  for (const auto& bad : {bad_name, newline, twice, reserved}) dew::testing::invalid_argument_of(bad);
  EXPECT_TRUE(parse_env_options({"CUDA_VISIBLE_DEVICES=1"}, false, false).ok());
  EXPECT_FALSE(parse_env_options({"CUDA_VISIBLE_DEVICES=1"}, true, false).ok());
  EXPECT_TRUE(parse_env_options({"HOME=/x"}, false, false).ok());
  EXPECT_FALSE(parse_env_options({"HOME=/x"}, false, true).ok());
}

TEST(LaunchOptions, ValidateNamesTheOptionAndTheLimits) {
  auto message = [](LaunchOptions o) {
    auto r = validate(std::move(o));
    return r.ok() ? std::string("ok") : dew::testing::invalid_argument_of(r);
  };
  EXPECT_THAT(message(LaunchOptions{}), StartsWith("no command: give it after --"));
  auto o = options_with({"true"});
  EXPECT_EQ(message(o), "ok");
  o.processes_per_host = 0;
  EXPECT_EQ(message(o), "--processes-per-host: '0' is not allowed; allowed: a whole number from 1 to 1024");
  o.processes_per_host = 2;
  o.devices_per_process = 2000;
  EXPECT_EQ(message(o), "--devices-per-process: '2000' is not allowed; allowed: a whole number from 1 to 1024");
  o.devices_per_process = 2;
  o.port = 70000;
  EXPECT_EQ(message(o), "--port: '70000' is not allowed; allowed: a whole number from 1024 to 65535");
  // The plugin's floor too (srun --dew-port): `--slurm --port 80` used to
  // pass the launcher and be refused by srun.
  o.port = 80;
  EXPECT_EQ(message(o), "--port: '80' is not allowed; allowed: a whole number from 1024 to 65535");
  o.port = 29500;
  o.hosts = {"a", "-oProxyCommand=x"};
  EXPECT_THAT(message(o), StartsWith("--hosts: '-oProxyCommand=x' is not allowed; allowed: a host name"));
  o.hosts = {"a", "b c"};
  EXPECT_THAT(message(o), StartsWith("--hosts: 'b c' is not allowed"));
  // Issue 26: "@host" reached ssh, whose usage text was all the user saw.
  for (const char* empty_part : {"@host", "user@", "@"}) {
    o.hosts = {"a", empty_part};
    EXPECT_THAT(message(o), StartsWith("--hosts: '" + std::string(empty_part) +
                                       "' is not allowed; allowed: a host "
                                       "name or address as ssh takes it, [user@]host with neither part empty"));
  }
  o.hosts = {"a", "me@b"};
  EXPECT_EQ(message(o), "ok");
  o.hosts = {"a", "b", "a"};
  EXPECT_THAT(message(o), StartsWith("--hosts: 'a' is listed twice"));
  o.hosts = {"a", "b"};
  EXPECT_EQ(message(o), "ok");
  o.coordinator = "-x";
  EXPECT_THAT(message(o), StartsWith("--coordinator: '-x' is not allowed"));
  // Issue 42: a half-bracketed address and a host:port were accepted (the
  // latter then bracketed as if IPv6: "[127.0.0.1:80]:PORT").
  for (const char* bad :
       {"[::1", "::1]", "127.0.0.1:80", "node0:80", "[node0]", "a..b", ".a", "a b", "-a.b", "a/b", "[]", "a.-b"}) {
    o.coordinator = bad;
    EXPECT_EQ(message(o), "--coordinator: '" + std::string(bad) +
                              "' is not allowed; allowed: a host name (letters, digits, '-', '_' and dots) or an "
                              "IPv4 or IPv6 address, without a port (that is --port)");
  }
  for (const char* good : {"node0", "n1.cluster.example", "10.0.0.1", "::1", "[::1]", "fe80::1", "gpu_node-7"}) {
    o.coordinator = good;
    EXPECT_EQ(message(o), "ok") << good;
  }
  o.coordinator = "";
  o.private_dirs = true;
  o.cwd = "/tmp";
  EXPECT_THAT(message(o), StartsWith("--cwd is not allowed with --private-dirs"));
  o.cwd = "";
  o.slurm = true;
  EXPECT_THAT(message(o), StartsWith("--hosts is not allowed with --slurm"));
  o.hosts.clear();
  EXPECT_THAT(message(o), StartsWith("--private-dirs is not allowed with --slurm"));
}

TEST(LaunchPlan, FourLocalProcessesGetTheirIdentities) {
  auto o = options_with({"/bin/sh", "-c", "env"});
  o.processes_per_host = 4;
  auto plan = planned(o, {{"A", "1"}}, facts());
  EXPECT_EQ(plan.coordinator, "127.0.0.1:41234");
  ASSERT_EQ(plan.processes.size(), 4u);
  for (int k = 0; k < 4; ++k) {
    const auto& p = plan.processes[static_cast<std::size_t>(k)];
    EXPECT_EQ(p.rank, k);
    EXPECT_TRUE(p.local);
    EXPECT_EQ(p.host, "localhost");
    EXPECT_EQ(p.cwd, "/srv/here");
    EXPECT_EQ(p.argv, o.command);
    auto env = env_map(p);
    EXPECT_EQ(env["DEW_PROCESS_ID"], std::to_string(k));
    EXPECT_EQ(env["DEW_PROCESS_COUNT"], "4");
    EXPECT_EQ(env["DEW_LOCAL_PROCESS_ID"], std::to_string(k));
    EXPECT_EQ(env["DEW_LOCAL_PROCESS_COUNT"], "4");
    EXPECT_EQ(env["DEW_COORDINATOR_ADDRESS"], "127.0.0.1:41234");
    // The framework's rendezvous: the same host, a port of its own.
    EXPECT_EQ(env["JAX_COORDINATOR_ADDRESS"], "127.0.0.1:11234");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["MASTER_PORT"], "11234");
    EXPECT_EQ(env["RANK"], std::to_string(k));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(k));
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
    EXPECT_EQ(env["GROUP_RANK"], "0");
    EXPECT_EQ(env["DEW_POOL_SECRET"], std::string(64, 'a'));
    EXPECT_EQ(env["A"], "1");
    EXPECT_EQ(env.count("CUDA_VISIBLE_DEVICES"), 0u) << "without --devices-per-process every device";
    EXPECT_EQ(env.count("JAX_LOCAL_DEVICE_IDS"), 0u);
  }
}

TEST(LaunchPlan, RanksRunHostByHostAndRemoteOnesGoOverSsh) {
  auto o = options_with({"/opt/venv/bin/python", "train.py"});
  o.hosts = {"node0", "alice@node1", "localhost"};
  o.processes_per_host = 2;
  o.ssh_config = "/etc/dew/ssh_config";
  o.ssh_options = {"Port=2222"};
  auto plan = planned(o, {}, facts());
  EXPECT_EQ(plan.coordinator, "node0:41234");
  ASSERT_EQ(plan.processes.size(), 6u);
  const std::vector<std::string> hosts = {"node0", "node0", "alice@node1", "alice@node1", "localhost", "localhost"};
  for (std::size_t k = 0; k < 6; ++k) {
    const auto& p = plan.processes[k];
    EXPECT_EQ(p.rank, static_cast<int>(k));
    EXPECT_EQ(p.local_rank, static_cast<int>(k % 2));
    EXPECT_EQ(p.host, hosts[k]);
    EXPECT_EQ(env_map(p)["DEW_PROCESS_COUNT"], "6");
    EXPECT_EQ(env_map(p)["DEW_LOCAL_PROCESS_COUNT"], "2");
  }
  const auto& remote = plan.processes[2];
  EXPECT_FALSE(remote.local);
  ASSERT_EQ(remote.argv.size(), 10u);
  EXPECT_THAT(
      std::vector<std::string>(remote.argv.begin(), remote.argv.begin() + 9),
      ElementsAre("ssh", "-o", "BatchMode=yes", "-F", "/etc/dew/ssh_config", "-o", "Port=2222", "--", "alice@node1"));
  EXPECT_THAT(remote.argv[9], StartsWith("sh -c 'IFS= read -r DEW_POOL_SECRET"));
  EXPECT_THAT(remote.argv[9], HasSubstr("cd -- /srv/here || exit 126; "));
  EXPECT_THAT(remote.argv[9], Not(HasSubstr(std::string(64, 'a')))) << "the secret never goes on a command line";
  EXPECT_TRUE(plan.processes[4].local);
}

TEST(LaunchPlan, CoordinatorNames) {
  auto o = options_with({"x"});
  EXPECT_EQ(coordinator_host(o, "me"), "127.0.0.1");
  o.hosts = {"localhost", "node1"};
  EXPECT_EQ(coordinator_host(o, "me"), "me") << "remote hosts reach this machine by its name";
  o.hosts = {"bob@node0", "node1"};
  EXPECT_EQ(coordinator_host(o, "me"), "node0");
  o.coordinator = "10.0.0.1";
  EXPECT_EQ(coordinator_host(o, "me"), "10.0.0.1");
  o.coordinator = "fe80::1";
  EXPECT_EQ(planned(o, {}, facts()).coordinator, "[fe80::1]:41234");
}

TEST(LaunchPlan, DevicesPerProcessSlicesEachHostsDevicesAsThePluginDoes) {
  auto o = options_with({"x"});
  o.hosts = {"localhost", "n1"};
  o.processes_per_host = 4;
  o.devices_per_process = 2;
  auto f = facts();
  f.devices["localhost"] = HostDevices{std::nullopt, 8};                                // 8 GPUs, none hidden
  f.devices["n1"] = HostDevices{"GPU-a,GPU-b,GPU-c,GPU-d,GPU-e,GPU-f,GPU-g,GPU-h", 8};  // an inherited list
  auto plan = planned(o, {}, f);
  const std::vector<std::string> local = {"0,1", "2,3", "4,5", "6,7"};
  const std::vector<std::string> remote = {"GPU-a,GPU-b", "GPU-c,GPU-d", "GPU-e,GPU-f", "GPU-g,GPU-h"};
  for (const auto& p : plan.processes) {
    const auto& want = p.local ? local : remote;
    EXPECT_EQ(env_map(p)["CUDA_VISIBLE_DEVICES"], want[static_cast<std::size_t>(p.local_rank)]) << p.rank;
    EXPECT_EQ(env_map(p)["JAX_LOCAL_DEVICE_IDS"], "0,1");
  }
  o.devices_per_process = 1;
  f.devices["localhost"] = HostDevices{"4,5,6,7", 8};  // the launcher's own CUDA_VISIBLE_DEVICES is sliced
  plan = planned(o, {}, f);
  EXPECT_EQ(env_map(plan.processes[3])["CUDA_VISIBLE_DEVICES"], "7");
  EXPECT_EQ(env_map(plan.processes[3])["JAX_LOCAL_DEVICE_IDS"], "0");
}

TEST(LaunchPlan, TooFewDevicesOnAHostGiveTheCounts) {
  auto o = options_with({"x"});
  o.hosts = {"localhost", "n1"};
  o.processes_per_host = 4;
  o.devices_per_process = 2;
  auto f = facts();
  f.devices["localhost"] = HostDevices{std::nullopt, 8};
  f.devices["n1"] = HostDevices{std::nullopt, 6};
  const auto message = dew::testing::invalid_argument_of(plan_launch(o, {}, f));
  EXPECT_THAT(message, HasSubstr("--devices-per-process: local process 3 of 4 needs GPUs [6, 8)"));
  EXPECT_THAT(message, HasSubstr("host n1 has 6 GPUs"));
  EXPECT_THAT(message, HasSubstr("4 processes need 8"));
  f.devices["n1"] = HostDevices{"0,1,2", 8};
  EXPECT_THAT(dew::testing::invalid_argument_of(plan_launch(o, {}, f)),
              HasSubstr("host n1 has 3 GPUs (CUDA_VISIBLE_DEVICES=0,1,2)"));
}

// Nothing said: the plugin's default (dew/gpu_binding.h default_share), not
// every process on every GPU.
TEST(LaunchPlan, WithoutDevicesPerProcessAHostsGpusAreSharedEvenlyAsUnderThePlugin) {
  auto o = options_with({"x"});
  o.processes_per_host = 2;
  auto f = facts();
  f.devices["localhost"] = HostDevices{"0,1,2,3", 4};
  auto plan = planned(o, {}, f);
  EXPECT_EQ(env_map(plan.processes[0])["CUDA_VISIBLE_DEVICES"], "0,1");
  EXPECT_EQ(env_map(plan.processes[1])["CUDA_VISIBLE_DEVICES"], "2,3");
  EXPECT_EQ(env_map(plan.processes[1])["JAX_LOCAL_DEVICE_IDS"], "0,1");
  EXPECT_TRUE(plan.notes.empty());
  // Three on four: one each, one idle, said once.
  o.processes_per_host = 3;
  plan = planned(o, {}, f);
  EXPECT_EQ(env_map(plan.processes[2])["CUDA_VISIBLE_DEVICES"], "2");
  EXPECT_THAT(plan.notes, ElementsAre("3 processes on 4 GPUs of this machine: 1 each, 1 left idle"));
  // One process keeps them all; no GPUs, nothing set.
  o.processes_per_host = 1;
  plan = planned(o, {}, f);
  EXPECT_EQ(env_map(plan.processes[0]).count("CUDA_VISIBLE_DEVICES"), 0u);
  EXPECT_EQ(env_map(plan.processes[0])["JAX_LOCAL_DEVICE_IDS"], "0,1,2,3");
  o.processes_per_host = 2;
  f.devices["localhost"] = HostDevices{};
  plan = planned(o, {}, f);
  EXPECT_EQ(env_map(plan.processes[1]).count("CUDA_VISIBLE_DEVICES"), 0u);
  EXPECT_EQ(env_map(plan.processes[1]).count("JAX_LOCAL_DEVICE_IDS"), 0u);
}

TEST(LaunchPlan, MoreProcessesThanGpusWithoutDevicesPerProcessIsRefusedNamingTheWaysOut) {
  auto o = options_with({"x"});
  o.hosts = {"n1"};
  o.processes_per_host = 4;
  auto f = facts();
  f.devices["n1"] = HostDevices{std::nullopt, 2};
  const auto message = dew::testing::invalid_argument_of(plan_launch(o, {}, f));
  EXPECT_THAT(message, HasSubstr("--devices-per-process is not set and 4 processes on host n1 would share 2 GPUs"));
  EXPECT_THAT(message, HasSubstr("or off to let every process see every GPU"));
}

TEST(LaunchPlan, OffOrTheUsersOwnGpuVariablesLeaveEveryProcessEveryGpu) {
  auto o = options_with({"x"});
  o.processes_per_host = 2;
  o.every_device = true;
  auto f = facts();
  f.devices["localhost"] = HostDevices{"0,1,2,3", 4};
  auto plan = planned(o, {}, f);
  EXPECT_EQ(env_map(plan.processes[1]).count("CUDA_VISIBLE_DEVICES"), 0u);
  EXPECT_EQ(env_map(plan.processes[1])["JAX_LOCAL_DEVICE_IDS"], "0,1,2,3");
  o.every_device = false;
  plan = planned(o, {{"CUDA_VISIBLE_DEVICES", "3"}}, f);
  EXPECT_EQ(env_map(plan.processes[1])["CUDA_VISIBLE_DEVICES"], "3");
  EXPECT_EQ(env_map(plan.processes[1]).count("JAX_LOCAL_DEVICE_IDS"), 0u);
  o.devices_per_process = 1;
  o.every_device = true;
  EXPECT_THAT(dew::testing::invalid_argument_of(validate(o)), HasSubstr("a number and off at once"));
}

TEST(LaunchPlan, CwdAndPrivateDirs) {
  auto o = options_with({"x"});
  o.cwd = "sub/dir";
  EXPECT_EQ(planned(o, {}, facts()).processes[0].cwd, "/srv/here/sub/dir");
  o.cwd = "/abs";
  EXPECT_EQ(planned(o, {}, facts()).processes[0].cwd, "/abs");
  o.cwd = "";
  o.private_dirs = true;
  o.processes_per_host = 2;
  auto plan = planned(o, {}, facts());
  const auto& p = plan.processes[1];
  EXPECT_EQ(p.cwd, "/tmp/dew-launch-0123456789ab/1/work");
  EXPECT_EQ(env_map(p)["HOME"], "/tmp/dew-launch-0123456789ab/1/home");
  EXPECT_EQ(env_map(p)["DEW_CACHE_DIR"], "/tmp/dew-launch-0123456789ab/1/cache");
  EXPECT_EQ(env_map(p)["XDG_CACHE_HOME"], "/tmp/dew-launch-0123456789ab/1/cache");
  EXPECT_EQ(env_map(p)["HF_HOME"], "/tmp/dew-launch-0123456789ab/1/cache/huggingface");
  EXPECT_EQ(env_map(p)["JAX_COMPILATION_CACHE_DIR"], "/tmp/dew-launch-0123456789ab/1/cache/jax");
  EXPECT_EQ(env_map(p)["TMPDIR"], "/tmp/dew-launch-0123456789ab/1/tmp");
  EXPECT_THAT(p.make_dirs,
              ElementsAre("/tmp/dew-launch-0123456789ab/1/work", "/tmp/dew-launch-0123456789ab/1/home",
                          "/tmp/dew-launch-0123456789ab/1/cache", "/tmp/dew-launch-0123456789ab/1/cache/huggingface",
                          "/tmp/dew-launch-0123456789ab/1/cache/jax", "/tmp/dew-launch-0123456789ab/1/tmp"));
  // What --private-dirs sets, --env may not.
  for (const char* name : {"HF_HOME", "TMPDIR", "XDG_CACHE_HOME", "JAX_COMPILATION_CACHE_DIR"}) {
    EXPECT_THAT(dew::testing::invalid_argument_of(parse_env_options({std::string(name) + "=/x"}, false, true)),
                HasSubstr("--private-dirs sets it"));
    EXPECT_TRUE(parse_env_options({std::string(name) + "=/x"}, false, false).ok());
  }
  EXPECT_EQ(private_root_for("0123456789abcdef"), "/tmp/dew-launch-0123456789ab");
}

TEST(Quoting, ShellQuote) {
  EXPECT_EQ(shell_quote("plain/path-1.2_x=y:z,@%+"), "plain/path-1.2_x=y:z,@%+");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote("a\nb"), "'a\nb'");
  EXPECT_EQ(display_quote("a\nb"), "$'a\\nb'");
  EXPECT_EQ(display_quote("it's\t\x01\\"), "$'it\\'s\\t\\x01\\\\'");
  EXPECT_EQ(display_quote("a b"), "'a b'");
}

// The words survive a real POSIX shell byte for byte.
std::string through_sh(const std::string& quoted) {
  auto r = dew::testing::run({"/bin/sh", "-c", "printf '%s\\0' " + quoted});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.out;
}

TEST(Quoting, HostileWordsReachAShellByteForByte) {
  for (const std::string& word : {kHostile, std::string("'"), std::string("''\\'"), std::string("\n"),
                                  std::string("-n"), std::string("\xff\xfe"), std::string("a\"b")}) {
    EXPECT_EQ(through_sh(shell_quote(word)), word + std::string(1, '\0'));
  }
  // bash reads the one-line display form back as the same word.
  auto r = dew::testing::run({"/bin/bash", "-c", "printf '%s' " + display_quote(kHostile)});
  EXPECT_EQ(r.out, kHostile);
}

// The remote script, run by a real /bin/sh here as the remote shell runs it:
// the secret from stdin, the variables and arguments byte for byte, the
// directory, the exit status.
TEST(RemoteScript, RunsTheCommandWithTheExactEnvironment) {
  char dir_pattern[] = "/tmp/dew-launch-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir_pattern), nullptr);
  const std::string dir = dir_pattern;
  const std::string out = dir + "/out";
  const std::string script = remote_script(
      {{"DEW_PROCESS_ID", "3"}, {"DEW_POOL_SECRET", "s"}, {"HOSTILE", kHostile}}, dir + "/w", {dir + "/w", dir + "/h"},
      {"/bin/sh", "-c",
       "{ pwd; printf '%s|%s|%s|%s' \"$DEW_PROCESS_ID\" \"$DEW_POOL_SECRET\" \"$HOSTILE\" "
       "\"$1\"; } > " +
           shell_quote(out) + "; exit 7",
       "arg0", kHostile});
  const std::string secret(64, 'f');
  // stdin stays open (as the launcher keeps it) until the command is done.
  auto r = dew::testing::run(
      {"/bin/sh", "-c", "{ printf '%s\\n' " + secret + "; sleep 2; } | /bin/sh -c " + shell_quote(script)});
  EXPECT_EQ(r.exit_code, 7) << r.err;
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), dir + "/w\n3|" + secret + "|" + kHostile + "|" + kHostile);
  std::system(("rm -rf " + shell_quote(dir)).c_str());
}

TEST(RemoteScript, EndOfStdinEndsTheCommandsProcessGroup) {
  // stdin is /dev/null: no secret line, so the script refuses at once.
  auto refused = dew::testing::run({"/bin/sh", "-c", remote_script({}, "/", {}, {"sleep", "30"})});
  EXPECT_EQ(refused.exit_code, 126);
  // The secret, then end of file (at once, and after the command's shell has
  // started two sleeps): the watcher ends the whole process group, far
  // before 30 s. A sleep left behind would hold the output pipe open until
  // the 20 s timeout.
  const std::string script = remote_script({}, "/", {}, {"/bin/sh", "-c", "sleep 30 & sleep 30; wait"});
  for (const std::string feed : {"echo secret", "{ echo secret; sleep 0.5; }"}) {
    SCOPED_TRACE(feed);
    auto ended = dew::testing::run({"/bin/sh", "-c", feed + " | /bin/sh -c " + shell_quote(script)}, {},
                                   std::chrono::seconds(20));
    EXPECT_FALSE(ended.timed_out);
    EXPECT_EQ(ended.exit_code, 128 + 15) << ended.err;
    EXPECT_LT(ended.seconds, 5);
  }
}

// dew launch inside an allocation (`srun --pty bash`): the interactive
// step's task variables are not handed to the local processes, so each is
// process R of the launch, not "alone, rank 0 of 1"; a remote process never
// had them (ssh carries none).
TEST(InheritedTaskVariables, ALocalProcessDoesNotInheritItsLaunchersTaskIdentity) {
  auto o = options_with({"/bin/true"});
  o.hosts = {"localhost", "n1"};
  auto f = facts();
  f.inherited_task_variables = {"SLURM_PROCID", "SLURM_NTASKS", "PMIX_RANK"};
  auto plan = planned(o, {}, f);
  EXPECT_EQ(plan.processes[0].unset, f.inherited_task_variables);
  EXPECT_TRUE(plan.processes[1].unset.empty());
  EXPECT_THAT(
      dry_run_line(plan.processes[0]),
      StartsWith("0 localhost: env -u SLURM_PROCID -u SLURM_NTASKS -u PMIX_RANK -C /srv/here DEW_PROCESS_ID=0 "));
}

TEST(DryRun, OneLinePerProcessThatPastesIntoBash) {
  auto o = options_with({"/bin/echo", "x y"});
  o.hosts = {"localhost", "n1"};
  auto plan = planned(o, {{"V", "a\nb"}}, facts());
  const std::string local = dry_run_line(plan.processes[0]);
  EXPECT_EQ(local,
            "0 localhost: env -C /srv/here DEW_PROCESS_ID=0 DEW_PROCESS_COUNT=2 DEW_LOCAL_PROCESS_ID=0 "
            "DEW_LOCAL_PROCESS_COUNT=1 DEW_COORDINATOR_ADDRESS=me:41234 DEW_POOL_SECRET=" +
                std::string(64, 'a') +
                " DEW_LINES_PREFIXED=1 DEW_NOTICE_TAG=0123456789abcdef DEW_FRAMEWORK_COORDINATOR=me:11234 "
                "JAX_COORDINATOR_ADDRESS=me:11234 "
                "MASTER_ADDR=me MASTER_PORT=11234 RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=0 "
                "$'V=a\\nb' XLA_FLAGS=--xla_gpu_execution_terminate_timeout=30m DEW_WATCHDOG=30m "
                "/bin/echo 'x y'");
  const std::string remote = dry_run_line(plan.processes[1]);
  EXPECT_THAT(remote, StartsWith("1 n1: ssh -o BatchMode=yes -- n1 $'sh -c \\'IFS= read -r DEW_POOL_SECRET"));
  EXPECT_EQ(remote.find('\n'), std::string::npos);
  // bash reads the command back as exactly the argv the launcher runs.
  auto r = dew::testing::run({"/bin/bash", "-c", "printf '%s\\0' " + remote.substr(std::string("1 n1: ").size())});
  std::string expected;
  for (const auto& word : plan.processes[1].argv) expected += word + std::string(1, '\0');
  EXPECT_EQ(r.out, expected);
}

// ssh carries no environment: a remote process gets the launcher's
// PYTHONPATH and VIRTUAL_ENV (a local one inherits them), unless --env says.
TEST(LaunchPlan, RemoteProcessesGetTheLaunchersPythonPath) {
  auto o = options_with({"/usr/bin/python3", "train.py"});
  o.hosts = {"localhost", "n1"};
  auto f = facts();
  f.forwarded = {{"PYTHONPATH", "/opt/dew/build/python"}, {"VIRTUAL_ENV", "/opt/venv"}};
  auto plan = planned(o, {}, f);
  EXPECT_EQ(env_map(plan.processes[1])["PYTHONPATH"], "/opt/dew/build/python");
  EXPECT_EQ(env_map(plan.processes[1])["VIRTUAL_ENV"], "/opt/venv");
  EXPECT_EQ(env_map(plan.processes[0]).count("PYTHONPATH"), 0u) << "a local process inherits it";
  auto given = planned(o, {{"PYTHONPATH", "/elsewhere"}}, f).processes[1];
  EXPECT_EQ(std::count_if(given.env.begin(), given.env.end(), [](const EnvVar& v) { return v.first == "PYTHONPATH"; }),
            1);
  EXPECT_EQ(env_map(given)["PYTHONPATH"], "/elsewhere");
}

TEST(LaunchPlan, TheWatchdogGoesIntoXlaFlagsAsThePluginPutsIt) {
  auto o = options_with({"/bin/true"});
  auto f = facts();
  EXPECT_EQ(env_map(planned(o, {}, f).processes[0])["XLA_FLAGS"], "--xla_gpu_execution_terminate_timeout=30m");
  EXPECT_EQ(env_map(planned(o, {}, f).processes[0])["DEW_WATCHDOG"], "30m") << "for libdew and Python too";
  o.watchdog = Watchdog(std::chrono::seconds(5400));
  EXPECT_EQ(env_map(planned(o, {}, f).processes[0])["XLA_FLAGS"], "--xla_gpu_execution_terminate_timeout=1h30m");
  EXPECT_EQ(env_map(planned(o, {}, f).processes[0])["DEW_WATCHDOG"], "1h30m");
  EXPECT_EQ(env_map(planned(o, {{"DEW_WATCHDOG", "7s"}}, f).processes[0])["DEW_WATCHDOG"], "7s") << "--env wins";
  f.xla_flags = "--xla_dump_to=/d";
  EXPECT_EQ(env_map(planned(o, {}, f).processes[0])["XLA_FLAGS"],
            "--xla_dump_to=/d --xla_gpu_execution_terminate_timeout=1h30m");
  // --env XLA_FLAGS stands for the inherited one, once.
  auto p = planned(o, {{"XLA_FLAGS", "--xla_gpu_execution_terminate_timeout=2m"}}, f).processes[0];
  EXPECT_EQ(std::count_if(p.env.begin(), p.env.end(), [](const EnvVar& v) { return v.first == "XLA_FLAGS"; }), 1);
  EXPECT_EQ(env_map(p)["XLA_FLAGS"], "--xla_gpu_execution_terminate_timeout=2m");
  o.watchdog = Watchdog(std::nullopt);
  EXPECT_EQ(env_map(planned(o, {}, f).processes[0]).count("XLA_FLAGS"), 0u) << "off: the inherited value is inherited";
  EXPECT_EQ(env_map(planned(o, {}, f).processes[0])["DEW_WATCHDOG"], "off");
}

}  // namespace
}  // namespace dew::launch
