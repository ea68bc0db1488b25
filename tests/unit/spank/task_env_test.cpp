#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <map>

#include "pool_plan.h"

namespace dew::spank {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;
using namespace std::chrono_literals;

TaskFacts four_tasks_on_two_nodes(std::uint32_t rank) {
  TaskFacts facts;
  facts.job_id = 42;
  facts.step_id = 3;
  facts.global_task = rank;
  facts.task_count = 4;
  facts.local_task = rank % 2;
  facts.local_task_count = 2;
  facts.node_id = rank / 2;
  facts.step_nodelist = "gpu[07-08]";
  facts.distribution = "block";
  facts.pool_secret = "s3cret";
  return facts;
}

PoolOptions pool() {
  PoolOptions options;
  options.pool = true;
  return options;
}

std::map<std::string, std::string> env_of(const Result<EnvPlan>& plan) {
  EXPECT_TRUE(plan.ok()) << (plan.ok() ? "" : plan.error().message);
  if (!plan.ok()) return {};
  return {plan.value().set.begin(), plan.value().set.end()};
}

TEST(PlanTaskEnvironment, PoolOfFourOnTwoNodes) {
  const PlugstackConfig config;
  const auto port = std::to_string(derive_port(42, 3, config.port_range));
  for (std::uint32_t rank = 0; rank < 4; ++rank) {
    auto env = env_of(plan_task_environment(four_tasks_on_two_nodes(rank), pool(), config));
    EXPECT_EQ(env["DEW_PROCESS_ID"], std::to_string(rank));
    EXPECT_EQ(env["DEW_PROCESS_COUNT"], "4");
    EXPECT_EQ(env["DEW_LOCAL_PROCESS_ID"], std::to_string(rank % 2));
    EXPECT_EQ(env["DEW_LOCAL_PROCESS_COUNT"], "2");
    EXPECT_EQ(env["DEW_NODE_ID"], std::to_string(rank / 2));
    EXPECT_EQ(env["DEW_COORDINATOR_ADDRESS"], "gpu07:" + port);
    EXPECT_EQ(env["JAX_COORDINATOR_ADDRESS"], "gpu07:" + port);
    EXPECT_EQ(env["DEW_POOL_SECRET"], "s3cret");
    EXPECT_EQ(env["XLA_FLAGS"], "--xla_gpu_execution_terminate_timeout=30m");
    EXPECT_EQ(env.count("CUDA_VISIBLE_DEVICES"), 0u);
    EXPECT_EQ(env.count("JAX_LOCAL_DEVICE_IDS"), 0u);
  }
}

TEST(PlanTaskEnvironment, OptionsOverridePlugstackDefaults) {
  PlugstackConfig config;
  config.watchdog = 10min;
  config.devices_per_process = 4;
  auto options = pool();
  options.port = 31337;
  options.coordinator = "head.example";
  options.watchdog = Watchdog{};  // --dew-watchdog=off
  options.devices_per_process = 1;
  auto facts = four_tasks_on_two_nodes(1);
  facts.visible_devices = "0,1";
  auto env = env_of(plan_task_environment(facts, options, config));
  EXPECT_EQ(env["DEW_COORDINATOR_ADDRESS"], "head.example:31337");
  EXPECT_EQ(env.count("XLA_FLAGS"), 0u);
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "1");
  EXPECT_EQ(env["JAX_LOCAL_DEVICE_IDS"], "0");
}

TEST(PlanTaskEnvironment, PlugstackDevicesPerProcessApplies) {
  PlugstackConfig config;
  config.devices_per_process = 2;
  auto facts = four_tasks_on_two_nodes(3);
  facts.visible_devices = "GPU-a,GPU-b,GPU-c,GPU-d";
  auto env = env_of(plan_task_environment(facts, pool(), config));
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "GPU-c,GPU-d");
  EXPECT_EQ(env["JAX_LOCAL_DEVICE_IDS"], "0,1");
}

TEST(PlanTaskEnvironment, TooFewGpusFailsTheTask) {
  auto options = pool();
  options.devices_per_process = 2;
  auto facts = four_tasks_on_two_nodes(1);
  facts.visible_devices = "0,1";
  auto plan = plan_task_environment(facts, options, PlugstackConfig{});
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.error().message, HasSubstr("the step has 2 GPUs on this node"));
}

TEST(PlanTaskEnvironment, SingleTaskFormsNoPool) {
  TaskFacts facts;
  facts.job_id = 9;
  facts.step_nodelist = "n1";
  auto plan = plan_task_environment(facts, pool(), PlugstackConfig{});
  auto env = env_of(plan);
  EXPECT_EQ(env["DEW_PROCESS_ID"], "0");
  EXPECT_EQ(env["DEW_PROCESS_COUNT"], "1");
  EXPECT_EQ(env.count("DEW_COORDINATOR_ADDRESS"), 0u);
  EXPECT_EQ(env.count("DEW_POOL_SECRET"), 0u);
  EXPECT_THAT(plan.value().unset,
              UnorderedElementsAre("DEW_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS", "DEW_POOL_SECRET"));
}

TEST(PlanTaskEnvironment, SingleTaskWithMultiHostFormsAPool) {
  TaskFacts facts;
  facts.job_id = 9;
  facts.step_nodelist = "n1";
  facts.pool_secret = "x";
  auto options = pool();
  options.multi_host = true;
  auto env = env_of(plan_task_environment(facts, options, PlugstackConfig{}));
  EXPECT_EQ(env["DEW_PROCESS_COUNT"], "1");
  EXPECT_THAT(env["DEW_COORDINATOR_ADDRESS"], HasSubstr("n1:"));
}

TEST(PlanTaskEnvironment, MissingSecretIsAnError) {
  auto facts = four_tasks_on_two_nodes(0);
  facts.pool_secret.reset();
  auto plan = plan_task_environment(facts, pool(), PlugstackConfig{});
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.error().message, HasSubstr("no pool secret reached this task"));
}

TEST(PlanTaskEnvironment, InconsistentNumbersAreRefused) {
  auto facts = four_tasks_on_two_nodes(0);
  facts.global_task = 4;
  EXPECT_FALSE(plan_task_environment(facts, pool(), PlugstackConfig{}).ok());
  facts = four_tasks_on_two_nodes(0);
  facts.local_task_count = 0;
  EXPECT_FALSE(plan_task_environment(facts, pool(), PlugstackConfig{}).ok());
}

TEST(CoordinatorHost, KnownDistributions) {
  auto facts = four_tasks_on_two_nodes(2);
  for (const char* dist : {"block", "cyclic", "plane", "block:cyclic", "cyclic:block:fcyclic", "block,Pack"}) {
    facts.distribution = dist;
    auto host = coordinator_host(facts, pool());
    ASSERT_TRUE(host.ok()) << dist;
    EXPECT_EQ(host.value(), "gpu07") << dist;
  }
  facts.distribution.reset();
  EXPECT_EQ(coordinator_host(facts, pool()).value(), "gpu07");
}

TEST(CoordinatorHost, ArbitraryNeedsAnExplicitHost) {
  auto facts = four_tasks_on_two_nodes(2);
  facts.distribution = "arbitrary";
  auto host = coordinator_host(facts, pool());
  ASSERT_FALSE(host.ok());
  EXPECT_THAT(host.error().message, HasSubstr("'arbitrary'"));
  EXPECT_THAT(host.error().message, HasSubstr("--dew-coordinator=HOST"));
  auto options = pool();
  options.coordinator = "n5";
  EXPECT_EQ(coordinator_host(facts, options).value(), "n5");
}

TEST(CoordinatorHost, BadNodelistIsNamed) {
  auto facts = four_tasks_on_two_nodes(0);
  facts.step_nodelist = "n[1-";
  auto host = coordinator_host(facts, pool());
  ASSERT_FALSE(host.ok());
  EXPECT_THAT(host.error().message, HasSubstr("SLURM_STEP_NODELIST: hostlist 'n[1-'"));
  facts.step_nodelist.reset();
  EXPECT_FALSE(coordinator_host(facts, pool()).ok());
}

TEST(CoordinatorAddress, Ipv6IsBracketed) {
  auto options = pool();
  options.coordinator = "[::1]";
  options.port = 2000;
  auto env = env_of(plan_task_environment(four_tasks_on_two_nodes(0), options, PlugstackConfig{}));
  EXPECT_EQ(env["DEW_COORDINATOR_ADDRESS"], "[::1]:2000");
}

TEST(MergeXlaFlags, AppendsToExistingFlags) {
  EXPECT_EQ(merge_xla_flags("--xla_dump_to=/tmp/x", Watchdog(90s)),
            "--xla_dump_to=/tmp/x --xla_gpu_execution_terminate_timeout=1m30s");
  EXPECT_EQ(merge_xla_flags(std::nullopt, Watchdog(2h)), "--xla_gpu_execution_terminate_timeout=2h");
  EXPECT_EQ(merge_xla_flags("  ", Watchdog(2h)), "--xla_gpu_execution_terminate_timeout=2h");
}

TEST(MergeXlaFlags, KeepsAFlagAlreadySet) {
  EXPECT_FALSE(merge_xla_flags("--xla_gpu_execution_terminate_timeout=5m", Watchdog(30min)));
  EXPECT_FALSE(merge_xla_flags("--a=1 --xla_gpu_execution_terminate_timeout=5m --b", Watchdog(30min)));
  EXPECT_FALSE(merge_xla_flags("--xla_gpu_execution_terminate_timeout 5m", Watchdog(30min)));
  // A longer flag that merely starts with the same name is another flag.
  EXPECT_EQ(merge_xla_flags("--xla_gpu_execution_terminate_timeout_x=1", Watchdog(60s)),
            "--xla_gpu_execution_terminate_timeout_x=1 --xla_gpu_execution_terminate_timeout=1m");
}

TEST(MergeXlaFlags, OffLeavesFlagsAlone) { EXPECT_FALSE(merge_xla_flags("--a", Watchdog{})); }

TEST(WaitStatus, DescribesExitsAndSignals) {
  EXPECT_EQ(describe_wait_status(3 << 8), "exit code 3");
  EXPECT_EQ(describe_wait_status(0), "exit code 0");
  EXPECT_EQ(describe_wait_status(SIGSEGV), "signal 11 (SIGSEGV)");
  EXPECT_EQ(describe_wait_status(SIGKILL | 0x80), "signal 9 (SIGKILL)") << "core dump bit";
  EXPECT_FALSE(is_bad_exit(0));
  EXPECT_TRUE(is_bad_exit(3 << 8));
  EXPECT_TRUE(is_bad_exit(SIGTERM));
}

TEST(ReportBadExit, NamesRankStatusAndStep) {
  EXPECT_FALSE(report_bad_exit(0, 1, 42, 0));
  auto report = report_bad_exit(3 << 8, 1, 42, 7);
  ASSERT_TRUE(report);
  EXPECT_EQ(report->line, "rank 1 ended with exit code 3; ending step 42.7 (kill-on-bad-exit)");
  EXPECT_TRUE(report->tell_srun);
  report = report_bad_exit(SIGABRT, 5, 1, 0);
  EXPECT_EQ(report->line, "rank 5 ended with signal 6 (SIGABRT); ending step 1.0 (kill-on-bad-exit)");
  EXPECT_TRUE(report->tell_srun);
  report = report_bad_exit(SIGKILL, 2, 1, 0);
  ASSERT_TRUE(report);
  EXPECT_FALSE(report->tell_srun) << "a SIGKILL is most often the step's own kill";
}

TEST(Hex, EncodesBytes) {
  const unsigned char bytes[] = {0x00, 0x0f, 0xa5, 0xff};
  EXPECT_EQ(to_hex(bytes, 4), "000fa5ff");
}

}  // namespace
}  // namespace dew::spank
