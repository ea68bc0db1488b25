// dew launch's pure core: option checks, every process's environment and
// command, quoting (checked through a real /bin/sh), srun's command, and
// the output line splitting.
#include "dew/launch_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "expect_error.h"
#include "process.h"

namespace dew::launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;
using ::testing::StartsWith;

const std::string kHostile = "a b 'q' \"dq\" $(touch /tmp/dew-pwned) `id` ; rm -rf x & | \\ $HOME\nline2\t*?[]{}!#~";

LaunchOptions options_with(std::vector<std::string> command) {
  LaunchOptions o;
  o.command = std::move(command);
  return o;
}

LaunchFacts facts() {
  LaunchFacts f;
  f.port = 41234;
  f.secret = std::string(64, 'a');
  f.launcher_cwd = "/work/here";
  f.local_hostname = "me";
  f.private_root = "/tmp/dew-launch-0123456789ab";
  return f;
}

// The plan of a launch that must succeed.
LaunchPlan planned(const LaunchOptions& o, const std::vector<EnvVar>& env, const LaunchFacts& f) {
  auto plan = plan_launch(o, env, f);
  EXPECT_TRUE(plan.ok()) << plan.error().message;
  return plan.ok() ? plan.value() : LaunchPlan{};
}

std::map<std::string, std::string> env_map(const ProcessSpec& p) {
  std::map<std::string, std::string> out;
  for (const auto& [name, value] : p.env) out[name] = value;
  return out;
}

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
  EXPECT_EQ(message(o), "--port: '70000' is not allowed; allowed: a whole number from 1 to 65535");
  o.port = 29500;
  o.hosts = {"a", "-oProxyCommand=x"};
  EXPECT_THAT(message(o), StartsWith("--hosts: '-oProxyCommand=x' is not allowed; allowed: a host name"));
  o.hosts = {"a", "b c"};
  EXPECT_THAT(message(o), StartsWith("--hosts: 'b c' is not allowed"));
  o.hosts = {"a", "b", "a"};
  EXPECT_THAT(message(o), StartsWith("--hosts: 'a' is listed twice"));
  o.hosts = {"a", "b"};
  EXPECT_EQ(message(o), "ok");
  o.coordinator = "-x";
  EXPECT_THAT(message(o), StartsWith("--coordinator: '-x' is not allowed"));
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
    EXPECT_EQ(p.cwd, "/work/here");
    EXPECT_EQ(p.argv, o.command);
    auto env = env_map(p);
    EXPECT_EQ(env["DEW_PROCESS_ID"], std::to_string(k));
    EXPECT_EQ(env["DEW_PROCESS_COUNT"], "4");
    EXPECT_EQ(env["DEW_LOCAL_PROCESS_ID"], std::to_string(k));
    EXPECT_EQ(env["DEW_LOCAL_PROCESS_COUNT"], "4");
    EXPECT_EQ(env["DEW_COORDINATOR_ADDRESS"], "127.0.0.1:41234");
    EXPECT_EQ(env["JAX_COORDINATOR_ADDRESS"], "127.0.0.1:41234");
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
  EXPECT_THAT(remote.argv[9], HasSubstr("cd -- /work/here || exit 126; "));
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
  f.devices["localhost"] = HostDevices{std::nullopt, 8};          // 8 GPUs, none hidden
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

TEST(LaunchPlan, CwdAndPrivateDirs) {
  auto o = options_with({"x"});
  o.cwd = "sub/dir";
  EXPECT_EQ(planned(o, {}, facts()).processes[0].cwd, "/work/here/sub/dir");
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
  EXPECT_THAT(p.make_dirs, ElementsAre("/tmp/dew-launch-0123456789ab/1/work", "/tmp/dew-launch-0123456789ab/1/home",
                                       "/tmp/dew-launch-0123456789ab/1/cache"));
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

TEST(DryRun, OneLinePerProcessThatPastesIntoBash) {
  auto o = options_with({"/bin/echo", "x y"});
  o.hosts = {"localhost", "n1"};
  auto plan = planned(o, {{"V", "a\nb"}}, facts());
  const std::string local = dry_run_line(plan.processes[0]);
  EXPECT_EQ(local,
            "0 localhost: env -C /work/here DEW_PROCESS_ID=0 DEW_PROCESS_COUNT=2 DEW_LOCAL_PROCESS_ID=0 "
            "DEW_LOCAL_PROCESS_COUNT=1 DEW_COORDINATOR_ADDRESS=me:41234 JAX_COORDINATOR_ADDRESS=me:41234 "
            "DEW_POOL_SECRET=" +
                std::string(64, 'a') + " DEW_LINES_PREFIXED=1 $'V=a\\nb' /bin/echo 'x y'");
  const std::string remote = dry_run_line(plan.processes[1]);
  EXPECT_THAT(remote, StartsWith("1 n1: ssh -o BatchMode=yes -- n1 $'sh -c \\'IFS= read -r DEW_POOL_SECRET"));
  EXPECT_EQ(remote.find('\n'), std::string::npos);
  // bash reads the command back as exactly the argv the launcher runs.
  auto r = dew::testing::run({"/bin/bash", "-c", "printf '%s\\0' " + remote.substr(std::string("1 n1: ").size())});
  std::string expected;
  for (const auto& word : plan.processes[1].argv) expected += word + std::string(1, '\0');
  EXPECT_EQ(r.out, expected);
}

TEST(Slurm, DetectsThePlugin) {
  EXPECT_TRUE(srun_has_dew_pool("      --dew-pool              Dew: give every task its rank\n"));
  EXPECT_TRUE(srun_has_dew_pool("--dew-pool"));
  EXPECT_FALSE(srun_has_dew_pool("      --dew-pool-x   something\n"));
  EXPECT_FALSE(srun_has_dew_pool("Usage: srun [OPTIONS(0)... [executable(0) [args(0)...]]]\n"));
}

TEST(Slurm, SrunCommandWithAndWithoutThePlugin) {
  auto o = options_with({"/opt/venv/bin/python", "train.py"});
  o.processes_per_host = 8;
  o.cwd = "/data";
  auto plain = srun_command(o, false);
  ASSERT_TRUE(plain.ok());
  EXPECT_THAT(plain.value(), ElementsAre("srun", "--ntasks-per-node=8", "--kill-on-bad-exit=1", "--export=ALL",
                                         "--label", "--chdir=/data", "/opt/venv/bin/python", "train.py"));
  auto pool = srun_command(o, true);
  ASSERT_TRUE(pool.ok());
  EXPECT_THAT(pool.value(), ElementsAre("srun", "--ntasks-per-node=8", "--kill-on-bad-exit=1", "--export=ALL",
                                        "--label", "--dew-pool", "--chdir=/data", "/opt/venv/bin/python", "train.py"));
  o.devices_per_process = 2;
  o.port = 29500;
  o.coordinator = "n1-ib";
  pool = srun_command(o, true);
  ASSERT_TRUE(pool.ok());
  EXPECT_THAT(pool.value(),
              ElementsAre("srun", "--ntasks-per-node=8", "--kill-on-bad-exit=1", "--export=ALL", "--label",
                          "--dew-pool", "--dew-devices-per-process=2", "--dew-port=29500", "--dew-coordinator=n1-ib",
                          "--chdir=/data", "/opt/venv/bin/python", "train.py"));
  auto refused = srun_command(o, false);
  EXPECT_THAT(dew::testing::message_of(refused, ErrorCode::kUnsupported),
              StartsWith("--devices-per-process with --slurm needs Dew's SPANK plugin (srun --dew-pool), which this "
                         "srun does not load; without it JAX gives each task the one GPU at SLURM_LOCALID"));
  o.devices_per_process.reset();
  EXPECT_THAT(dew::testing::message_of(srun_command(o, false), ErrorCode::kUnsupported),
              StartsWith("--port with --slurm needs Dew's SPANK plugin"));
  o.port.reset();
  EXPECT_THAT(dew::testing::message_of(srun_command(o, false), ErrorCode::kUnsupported),
              StartsWith("--coordinator with --slurm needs"));
}

TEST(Output, LinesAreSplitWholeAndPrefixed) {
  LineSplitter s;
  EXPECT_TRUE(s.feed("par").empty());
  EXPECT_THAT(s.feed("tial\nnext\n\nlast"), ElementsAre("partial", "next", ""));
  EXPECT_EQ(s.finish(), std::optional<std::string>("last"));
  EXPECT_EQ(s.finish(), std::nullopt);
  EXPECT_EQ(rank_line(12, "hello"), "[12] hello\n");
  EXPECT_EQ(rank_line(0, ""), "[0] \n");
}

TEST(Output, OverlongLinesAreCutAtTheLimit) {
  LineSplitter s(4);
  EXPECT_THAT(s.feed("abcdefghij\nxy"), ElementsAre("abcd", "efgh", "ij"));
  EXPECT_THAT(s.feed("zw"), ElementsAre("xyzw"));
  EXPECT_EQ(s.finish(), std::nullopt);
}

TEST(Output, SrunLabelsBecomeRankPrefixes) {
  EXPECT_EQ(relabel_srun_line(" 3: hello: world"), "[3] hello: world\n");
  EXPECT_EQ(relabel_srun_line("12: x"), "[12] x\n");
  EXPECT_EQ(relabel_srun_line(" 0: "), "[0] \n");
  EXPECT_EQ(relabel_srun_line("srun: error: n1: task 1: Exited with exit code 3"),
            "srun: error: n1: task 1: Exited with exit code 3\n");
  EXPECT_EQ(relabel_srun_line(""), "\n");
}

TEST(HostQuery, TheScriptPrintsAPortNoSocketUsesAndTheGpus) {
  const std::string script = host_query_script(true, true);
  auto r = dew::testing::run({"/bin/sh", "-c", script});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto answer = parse_host_reply(r.out, "localhost", true, true);
  ASSERT_TRUE(answer.ok()) << answer.error().message;
  ASSERT_TRUE(answer.value().port && answer.value().devices);
  EXPECT_GE(*answer.value().port, kPortRange.low);
  EXPECT_LE(*answer.value().port, kPortRange.high);
  // Random each time: mawk clips a seed above 2^31 - 1, so the script
  // reduces it first (six draws, at most one repeat allowed).
  std::set<std::string> draws;
  for (int i = 0; i < 6; ++i) draws.insert(dew::testing::run({"/bin/sh", "-c", host_query_script(true, false)}).out);
  EXPECT_GE(draws.size(), 5u);
}

TEST(HostQuery, TheGpuFactsComeFromTheRemoteShell) {
  auto r = dew::testing::run({"/bin/sh", "-c", host_query_script(false, true)}, {{"CUDA_VISIBLE_DEVICES", "3,1"}});
  auto answer = parse_host_reply(r.out, "h", false, true);
  ASSERT_TRUE(answer.ok()) << answer.error().message;
  EXPECT_EQ(answer.value().devices->visible_devices, "3,1");
  EXPECT_FALSE(answer.value().port);
  r = dew::testing::run({"/bin/sh", "-c", host_query_script(false, true)}, {{"CUDA_VISIBLE_DEVICES", ""}});
  EXPECT_EQ(parse_host_reply(r.out, "h", false, true).value().devices->visible_devices, std::nullopt)
      << "unset in the remote shell";
}

TEST(HostQuery, Replies) {
  EXPECT_EQ(parse_host_reply("port=41234\n", "h", true, false).value().port, 41234);
  const auto answer = parse_host_reply("visible=0,1\r\ngpus=2\n", "h", false, true);
  ASSERT_TRUE(answer.ok());
  EXPECT_EQ(answer.value().devices->visible_devices, "0,1");
  EXPECT_EQ(answer.value().devices->gpu_count, 2u);
  EXPECT_EQ(dew::testing::invalid_argument_of(parse_host_reply("bash: awk: command not found\n", "node0", true, false)),
            "the query on node0 answered an unexpected line 'bash: awk: command not found'; expected the lines "
            "port=N, visible=LIST or visible-unset, gpus=N (give --port to skip the port query)");
  for (const char* bad : {"", "port=70000", "port=x", "gpus=-1\nvisible-unset", "visible-unset"}) {
    dew::testing::invalid_argument_of(parse_host_reply(bad, "h", true, true));
  }
}

TEST(Output, TheFailureNamedIsNotAPeerFailedExit) {
  EXPECT_EQ(pick_failure({{1, 75 << 8}, {2, 1 << 8}, {3, 75 << 8}}), 1u);
  EXPECT_EQ(pick_failure({{3, 75 << 8}, {1, 75 << 8}}), 1u) << "all peer-failed: the lowest rank";
  EXPECT_EQ(pick_failure({{3, 2 << 8}, {0, SIGSEGV}}), 1u) << "a signal counts as a failure of its own";
  EXPECT_EQ(pick_failure({{5, 3 << 8}}), 0u);
}

}  // namespace
}  // namespace dew::launch
