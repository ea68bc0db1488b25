// dew launch --slurm's srun command and environment, and the query that asks
// a remote host for a free port (or whether --port is free) and its GPUs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "dew/launch_plan.h"
#include "expect_error.h"
#include "plan_helpers.h"
#include "process.h"

namespace dew::launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::options_with;
using ::testing::StartsWith;

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
  // With the plugin, its kill-on-bad-exit names the failing rank: srun's own is left off.
  auto pool = srun_command(o, true);
  ASSERT_TRUE(pool.ok());
  EXPECT_THAT(pool.value(), ElementsAre("srun", "--ntasks-per-node=8", "--export=ALL", "--label", "--dew-pool",
                                        "--chdir=/data", "/opt/venv/bin/python", "train.py"));
  o.devices_per_process = 2;
  o.port = 29500;
  o.coordinator = "n1-ib";
  o.watchdog = Watchdog(std::nullopt);
  pool = srun_command(o, true);
  ASSERT_TRUE(pool.ok());
  EXPECT_THAT(pool.value(),
              ElementsAre("srun", "--ntasks-per-node=8", "--export=ALL", "--label", "--dew-pool", "--dew-watchdog=off",
                          "--dew-devices-per-process=2", "--dew-port=29500", "--dew-coordinator=n1-ib", "--chdir=/data",
                          "/opt/venv/bin/python", "train.py"));
  auto refused = srun_command(o, false);
  EXPECT_THAT(dew::testing::message_of(refused, ErrorCode::kUnsupported),
              StartsWith("--devices-per-process with --slurm needs Dew's SPANK plugin (srun --dew-pool), which this "
                         "srun does not load; without it JAX gives each task the one GPU at SLURM_LOCALID"));
  // Without the plugin, --port and --coordinator go to the environment.
  o.devices_per_process.reset();
  EXPECT_TRUE(srun_command(o, false).ok());
  // off: the plugin's own off, whatever the admin's default.
  o.every_device = true;
  pool = srun_command(o, true);
  ASSERT_TRUE(pool.ok());
  EXPECT_THAT(pool.value(), ::testing::Contains("--dew-devices-per-process=off"));
}

std::map<std::string, std::string> as_map(const std::vector<EnvVar>& env) { return {env.begin(), env.end()}; }

TEST(Slurm, WithoutThePluginTheLauncherGivesWhatThePluginWould) {
  auto o = options_with({"/bin/true"});
  const std::string secret(64, 'f');
  // With the plugin: only the prefix rule; the plugin's values stand.
  EXPECT_EQ(as_map(slurm_environment(o, true, secret, "tag", "n1", 21000, std::nullopt)),
            (std::map<std::string, std::string>{{"DEW_LINES_PREFIXED", "1"}, {"DEW_NOTICE_TAG", "tag"}}));
  // Without: the secret and the watchdog; the coordinator by libdew's rule.
  auto env = as_map(slurm_environment(o, false, secret, "tag", "n1", 21000, std::nullopt));
  EXPECT_EQ(env["DEW_POOL_SECRET"], secret);
  EXPECT_EQ(env["XLA_FLAGS"], "--xla_gpu_execution_terminate_timeout=30m");
  EXPECT_EQ(env["DEW_WATCHDOG"], "30m");
  EXPECT_EQ(env.count("DEW_COORDINATOR_ADDRESS"), 0u);
  // --port alone: the allocation's first node; --coordinator alone: a drawn port.
  o.port = 23456;
  EXPECT_EQ(as_map(slurm_environment(o, false, secret, "tag", "n1", 21000, std::nullopt))["DEW_COORDINATOR_ADDRESS"],
            "n1:23456");
  o.port.reset();
  o.coordinator = "10.0.0.1";
  EXPECT_EQ(as_map(slurm_environment(o, false, secret, "tag", "n1", 21000, std::nullopt))["DEW_COORDINATOR_ADDRESS"],
            "10.0.0.1:21000");
  // A user's XLA_FLAGS (inherited or --env) is kept, the watchdog added; off leaves it alone.
  env = as_map(slurm_environment(o, false, secret, "tag", "n1", 21000, std::string("--xla_dump_to=/d")));
  EXPECT_EQ(env["XLA_FLAGS"], "--xla_dump_to=/d --xla_gpu_execution_terminate_timeout=30m");
  // A watchdog the user's flags hold already: nothing added (their --env carries it).
  o.env = {"XLA_FLAGS=--xla_gpu_execution_terminate_timeout=5m"};
  EXPECT_EQ(as_map(slurm_environment(o, false, secret, "tag", "n1", 21000, std::nullopt)).count("XLA_FLAGS"), 0u);
  o.env.clear();
  o.watchdog = Watchdog(std::nullopt);
  env = as_map(slurm_environment(o, false, secret, "tag", "n1", 21000, std::nullopt));
  EXPECT_EQ(env.count("XLA_FLAGS"), 0u);
  EXPECT_EQ(env["DEW_WATCHDOG"], "off");
  // --watchdog 2h reaches StepWatchdog and dew worker, not XLA's flag alone;
  // a user's own DEW_WATCHDOG stands.
  o.watchdog = Watchdog(std::chrono::hours(2));
  EXPECT_EQ(as_map(slurm_environment(o, false, secret, "tag", "n1", 21000, std::nullopt))["DEW_WATCHDOG"], "2h");
  o.env = {"DEW_WATCHDOG=5m"};
  EXPECT_EQ(as_map(slurm_environment(o, false, secret, "tag", "n1", 21000, std::nullopt)).count("DEW_WATCHDOG"), 0u);
}

TEST(HostQuery, AGivenPortIsCheckedFreeOnTheHost) {
  // A listening socket on a port: the query says it is busy.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ::listen(fd, 1);
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  const int busy = ntohs(address.sin_port);
  auto r = dew::testing::run({"/bin/sh", "-c", host_query_script(true, false, busy)});
  EXPECT_THAT(r.out, StartsWith("port-busy=" + std::to_string(busy) + "\n"));
  EXPECT_EQ(dew::testing::message_of(parse_host_reply(r.out, "node0", true, false), ErrorCode::kUnavailable),
            "--port " + std::to_string(busy) +
                ": the port is in use on node0; allowed: a port no socket uses there (or "
                "leave --port out for a free one)");
  ::close(fd);
  r = dew::testing::run({"/bin/sh", "-c", host_query_script(true, false, busy)});
  EXPECT_EQ(parse_host_reply(r.out, "node0", true, false).value().port, busy);
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
  // And one for the framework's coordinator, from its own range.
  ASSERT_TRUE(answer.value().framework_port) << r.out;
  EXPECT_GE(*answer.value().framework_port, kFrameworkPortRange.low);
  EXPECT_LE(*answer.value().framework_port, kFrameworkPortRange.high);
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
  EXPECT_EQ(parse_host_reply("port=41234\nframework-port=11234\n", "h", true, false).value().port, 41234);
  EXPECT_EQ(parse_host_reply("port=41234\nframework-port=11234\n", "h", true, false).value().framework_port, 11234);
  dew::testing::invalid_argument_of(parse_host_reply("port=41234\n", "h", true, false));
  const auto answer = parse_host_reply("visible=0,1\r\ngpus=2\n", "h", false, true);
  ASSERT_TRUE(answer.ok());
  EXPECT_EQ(answer.value().devices->visible_devices, "0,1");
  EXPECT_EQ(answer.value().devices->gpu_count, 2u);
  EXPECT_EQ(dew::testing::invalid_argument_of(parse_host_reply("bash: awk: command not found\n", "node0", true, false)),
            "the query on node0 answered an unexpected line 'bash: awk: command not found'; expected the lines "
            "port=N, framework-port=N, visible=LIST or visible-unset, gpus=N (give --port to skip the port query)");
  for (const char* bad : {"", "port=70000", "port=x", "gpus=-1\nvisible-unset", "visible-unset"}) {
    dew::testing::invalid_argument_of(parse_host_reply(bad, "h", true, true));
  }
}

}  // namespace
}  // namespace dew::launch
