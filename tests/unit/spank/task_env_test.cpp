#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <map>

#include "expect_error.h"
#include "pool_plan.h"

namespace dew::spank {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
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
  const auto framework_port = std::to_string(derive_port(42, 3, kFrameworkPortRange));
  ASSERT_NE(port, framework_port);
  for (std::uint32_t rank = 0; rank < 4; ++rank) {
    auto env = env_of(plan_task_environment(four_tasks_on_two_nodes(rank), pool(), config));
    EXPECT_EQ(env["DEW_PROCESS_ID"], std::to_string(rank));
    EXPECT_EQ(env["DEW_PROCESS_COUNT"], "4");
    EXPECT_EQ(env["DEW_LOCAL_PROCESS_ID"], std::to_string(rank % 2));
    EXPECT_EQ(env["DEW_LOCAL_PROCESS_COUNT"], "2");
    EXPECT_EQ(env["DEW_NODE_ID"], std::to_string(rank / 2));
    EXPECT_EQ(env["DEW_COORDINATOR_ADDRESS"], "gpu07:" + port);
    // The framework's coordinator: the same host, its own port.
    EXPECT_EQ(env["JAX_COORDINATOR_ADDRESS"], "gpu07:" + framework_port);
    EXPECT_EQ(env["DEW_FRAMEWORK_COORDINATOR"], "gpu07:" + framework_port);
    EXPECT_EQ(env["MASTER_ADDR"], "gpu07");
    EXPECT_EQ(env["MASTER_PORT"], framework_port);
    EXPECT_EQ(env["RANK"], std::to_string(rank));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(rank % 2));
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env["GROUP_RANK"], std::to_string(rank / 2));
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
  options.devices_per_process = DevicesPerProcess(1u);
  auto facts = four_tasks_on_two_nodes(1);
  facts.visible_devices = "0,1";
  auto env = env_of(plan_task_environment(facts, options, config));
  EXPECT_EQ(env["DEW_COORDINATOR_ADDRESS"], "head.example:31337");
  EXPECT_EQ(env["MASTER_ADDR"], "head.example");
  EXPECT_EQ(env["JAX_COORDINATOR_ADDRESS"], "head.example:" + std::to_string(derive_port(42, 3, kFrameworkPortRange)));
  EXPECT_EQ(env.count("XLA_FLAGS"), 0u);
  EXPECT_EQ(env["DEW_WATCHDOG"], "off") << "libdew and Python hear it too";
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "1");
  EXPECT_EQ(env["JAX_LOCAL_DEVICE_IDS"], "0");
}

// Nothing says how many GPUs a task takes: several tasks on a node share its
// GPUs evenly instead of each seeing all of them (JAX would take them all).
TEST(PlanTaskEnvironment, WithoutDevicesPerProcessTasksShareTheNodesGpusEvenly) {
  const auto task = [](unsigned local, unsigned count, const char* visible) {
    auto facts = four_tasks_on_two_nodes(0);
    facts.local_task = local;
    facts.local_task_count = count;
    facts.task_count = 2 * count;
    facts.global_task = local;
    facts.visible_devices = visible;
    return facts;
  };
  auto env = env_of(plan_task_environment(task(2, 4, "0,1,2,3"), pool(), PlugstackConfig{}));
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "2") << "4 tasks on 4 GPUs: one each";
  EXPECT_EQ(env["JAX_LOCAL_DEVICE_IDS"], "0");
  env = env_of(plan_task_environment(task(1, 2, "0,1,2,3"), pool(), PlugstackConfig{}));
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "2,3") << "2 tasks on 4 GPUs: two each";
  auto three = plan_task_environment(task(0, 3, "0,1,2,3"), pool(), PlugstackConfig{});
  EXPECT_EQ(env_of(three)["CUDA_VISIBLE_DEVICES"], "0") << "3 tasks on 4 GPUs: one each";
  ASSERT_EQ(three.value().notes.size(), 1u);
  EXPECT_EQ(three.value().notes[0], "3 processes on 4 GPUs of this node: 1 each, 1 left idle");
  EXPECT_EQ(env_of(plan_task_environment(task(2, 3, "0,1,2,3"), pool(), PlugstackConfig{}))["CUDA_VISIBLE_DEVICES"],
            "2");
  EXPECT_EQ(dew::testing::invalid_argument_of(plan_task_environment(task(0, 5, "0,1,2,3"), pool(), PlugstackConfig{})),
            "--dew-devices-per-process is not set and 5 processes on this node would share 4 GPUs; allowed: at "
            "most 4 processes per node, a devices-per-process value that fits, or off to let every process see "
            "every GPU");
  env = env_of(plan_task_environment(task(0, 1, "0,1,2,3"), pool(), PlugstackConfig{}));
  EXPECT_EQ(env.count("CUDA_VISIBLE_DEVICES"), 0u) << "one task keeps them all";
  EXPECT_EQ(env["JAX_LOCAL_DEVICE_IDS"], "0,1,2,3");
  auto off = pool();
  off.devices_per_process = DevicesPerProcess{};  // --dew-devices-per-process=off
  EXPECT_EQ(env_of(plan_task_environment(task(2, 5, "0,1,2,3"), off, PlugstackConfig{}))["JAX_LOCAL_DEVICE_IDS"],
            "0,1,2,3");
  auto bound = task(2, 4, "1");
  bound.gpus_per_task = "1";  // Slurm's own --gpus-per-task binding is kept
  EXPECT_EQ(env_of(plan_task_environment(bound, pool(), PlugstackConfig{})).count("CUDA_VISIBLE_DEVICES"), 0u);
  EXPECT_EQ(env_of(plan_task_environment(task(0, 4, ""), pool(), PlugstackConfig{})).count("CUDA_VISIBLE_DEVICES"), 0u)
      << "a step without GPUs is left alone";
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

// An admin's default must not fail every step that asks for no GPUs.
TEST(PlanTaskEnvironment, AnAdminDefaultLeavesAStepWithoutGpusAlone) {
  PlugstackConfig config;
  config.devices_per_process = 2;
  auto facts = four_tasks_on_two_nodes(1);  // no CUDA_VISIBLE_DEVICES: the step asked for no GPUs
  auto plan = plan_task_environment(facts, pool(), config);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  auto env = env_of(plan);
  EXPECT_EQ(env.count("CUDA_VISIBLE_DEVICES"), 0u);
  EXPECT_EQ(env.count("JAX_LOCAL_DEVICE_IDS"), 0u);
  ASSERT_EQ(plan.value().notes.size(), 1u);
  EXPECT_EQ(plan.value().notes[0],
            "rank 1: the step has no GPUs on this node, so plugstack's devices_per_process=2 "
            "does not apply; CUDA_VISIBLE_DEVICES left as it is");
  // The user's own value that does not fit stays an error.
  auto options = pool();
  options.devices_per_process = DevicesPerProcess(2u);
  EXPECT_THAT(dew::testing::invalid_argument_of(plan_task_environment(facts, options, config)), HasSubstr("GPUs"));
}

TEST(PlanTaskEnvironment, TheUserCanSwitchTheAdminDefaultOffForAStep) {
  PlugstackConfig config;
  config.devices_per_process = 2;
  auto facts = four_tasks_on_two_nodes(1);
  facts.visible_devices = "0";  // fewer than the default wants
  auto options = pool();
  options.devices_per_process = DevicesPerProcess(std::nullopt);  // --dew-devices-per-process=off
  auto env = env_of(plan_task_environment(facts, options, config));
  EXPECT_EQ(env.count("CUDA_VISIBLE_DEVICES"), 0u) << "left as Slurm set it";
  EXPECT_EQ(parse_devices_per_process_choice("off", "--dew-devices-per-process").value(), DevicesPerProcess());
  EXPECT_EQ(parse_devices_per_process_choice("3", "--dew-devices-per-process").value(), DevicesPerProcess(3u));
  EXPECT_THAT(dew::testing::invalid_argument_of(parse_devices_per_process_choice("none", "--dew-devices-per-process")),
              HasSubstr("an integer from 1 to 1024, or off"));
}

TEST(PlanTaskEnvironment, TooFewGpusFailsTheTask) {
  auto options = pool();
  options.devices_per_process = DevicesPerProcess(2u);
  auto facts = four_tasks_on_two_nodes(1);
  facts.visible_devices = "0,1";
  EXPECT_THAT(dew::testing::invalid_argument_of(plan_task_environment(facts, options, PlugstackConfig{})),
              HasSubstr("this node has 2 GPUs"));
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
  EXPECT_THAT(plan.value().unset, UnorderedElementsAre("DEW_COORDINATOR_ADDRESS", "DEW_POOL_SECRET", "DEW_MULTI_HOST"));
  // A torch or JAX script alone still finds its (one-process) rendezvous here.
  EXPECT_EQ(env["RANK"], "0");
  EXPECT_EQ(env["WORLD_SIZE"], "1");
  EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
  EXPECT_EQ(env["JAX_COORDINATOR_ADDRESS"], "127.0.0.1:" + std::to_string(derive_port(9, 0, kFrameworkPortRange)));
}

TEST(PlanTaskEnvironment, ADewPortGivenInsideTheFrameworkRangeNeverBecomesTheFrameworkPort) {
  PlugstackConfig config;
  auto options = pool();
  options.port = derive_port(42, 3, config.framework_port_range);
  auto env = env_of(plan_task_environment(four_tasks_on_two_nodes(0), options, config));
  EXPECT_EQ(env["DEW_COORDINATOR_ADDRESS"], "gpu07:" + std::to_string(*options.port));
  EXPECT_NE(env["MASTER_PORT"], std::to_string(*options.port));
  EXPECT_EQ(env["MASTER_PORT"], std::to_string(*options.port + 1));
}

TEST(PlanTaskEnvironment, AnAdminsFrameworkRangeIsWhereTheFrameworkPortComesFrom) {
  auto config = parse_plugstack_args({"port_range=35000-35000", "framework_port_range=36000-36000"});
  ASSERT_TRUE(config.ok()) << config.error().message;
  auto env = env_of(plan_task_environment(four_tasks_on_two_nodes(3), pool(), config.value()));
  EXPECT_EQ(env["DEW_COORDINATOR_ADDRESS"], "gpu07:35000");
  EXPECT_EQ(env["MASTER_PORT"], "36000");
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
  // libdew reads the Slurm variables first: it is told that one task is a pool.
  EXPECT_EQ(env["DEW_MULTI_HOST"], "1");
  EXPECT_EQ(env_of(plan_task_environment(facts, pool(), PlugstackConfig{})).count("DEW_MULTI_HOST"), 0u);
}

TEST(PlanTaskEnvironment, MissingSecretIsAnError) {
  auto facts = four_tasks_on_two_nodes(0);
  facts.pool_secret.reset();
  dew::testing::message_of(plan_task_environment(facts, pool(), PlugstackConfig{}), ErrorCode::kUnavailable);
}

TEST(PlanTaskEnvironment, InconsistentNumbersAreRefused) {
  auto facts = four_tasks_on_two_nodes(0);
  facts.global_task = 4;
  dew::testing::message_of(plan_task_environment(facts, pool(), PlugstackConfig{}), ErrorCode::kInternal);
  facts = four_tasks_on_two_nodes(0);
  facts.local_task_count = 0;
  dew::testing::message_of(plan_task_environment(facts, pool(), PlugstackConfig{}), ErrorCode::kInternal);
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
  // The way out is the feature: the message names the option that fixes it.
  const auto message = dew::testing::message_of(coordinator_host(facts, pool()), ErrorCode::kUnsupported);
  EXPECT_THAT(message, HasSubstr("'arbitrary'"));
  EXPECT_THAT(message, HasSubstr("--dew-coordinator=HOST"));
  auto options = pool();
  options.coordinator = "n5";
  EXPECT_EQ(coordinator_host(facts, options).value(), "n5");
}

// NodeName and NodeAddr differ (a test cluster's n1 at 127.0.0.1, a real
// cluster's node names on another network): a name that does not resolve is
// replaced by the node's NodeAddr from Slurm; an explicit host wins.
TEST(CoordinatorHost, ANodeNameThatDoesNotResolveGivesWayToItsNodeAddr) {
  auto facts = four_tasks_on_two_nodes(2);
  facts.rank0_name_resolves = false;
  facts.rank0_node_address = "10.42.0.7";
  EXPECT_EQ(coordinator_host(facts, pool()).value(), "10.42.0.7");
  auto env = env_of(plan_task_environment(facts, pool(), PlugstackConfig{}));
  EXPECT_THAT(env["DEW_COORDINATOR_ADDRESS"], StartsWith("10.42.0.7:"));
  EXPECT_EQ(env["MASTER_ADDR"], "10.42.0.7");
  auto options = pool();
  options.coordinator = "head.example";
  EXPECT_EQ(coordinator_host(facts, options).value(), "head.example");
  facts.rank0_name_resolves = true;  // a name that resolves is kept
  EXPECT_EQ(coordinator_host(facts, pool()).value(), "gpu07");
}

TEST(CoordinatorHost, ANodeNameThatDoesNotResolveWithoutANodeAddrSaysWhatToGive) {
  auto facts = four_tasks_on_two_nodes(2);
  facts.rank0_name_resolves = false;
  const auto message = dew::testing::message_of(coordinator_host(facts, pool()), ErrorCode::kUnavailable);
  EXPECT_THAT(message, HasSubstr("process 0's node 'gpu07' does not resolve here"));
  EXPECT_THAT(message, HasSubstr("--dew-coordinator=HOST"));
}

TEST(CoordinatorHost, BadNodelistIsNamed) {
  auto facts = four_tasks_on_two_nodes(0);
  facts.step_nodelist = "n[1-";
  EXPECT_THAT(dew::testing::invalid_argument_of(coordinator_host(facts, pool())),
              HasSubstr("SLURM_STEP_NODELIST: hostlist 'n[1-'"));
  facts.step_nodelist.reset();
  dew::testing::message_of(coordinator_host(facts, pool()), ErrorCode::kNotFound);
}

TEST(CoordinatorAddress, Ipv6IsBracketed) {
  auto options = pool();
  options.coordinator = "[::1]";
  options.port = 2000;
  auto env = env_of(plan_task_environment(four_tasks_on_two_nodes(0), options, PlugstackConfig{}));
  EXPECT_EQ(env["DEW_COORDINATOR_ADDRESS"], "[::1]:2000");
}

TEST(ClassifyTaskEnd, AFailureIsNamedWithRankStatusAndStep) {
  EXPECT_EQ(classify_task_end(0, 1, 42, 0, false).kind, TaskEnd::kClean);
  auto end = classify_task_end(3 << 8, 1, 42, 7, false);
  EXPECT_EQ(end.kind, TaskEnd::kFailed);
  EXPECT_EQ(end.line, "rank 1 ended with exit code 3; ending step 42.7 (kill-on-bad-exit)");
  end = classify_task_end(SIGABRT, 5, 1, 0, false);
  EXPECT_EQ(end.kind, TaskEnd::kFailed);
  EXPECT_EQ(end.line, "rank 5 ended with signal 6 (SIGABRT); ending step 1.0 (kill-on-bad-exit)");
}

TEST(ClassifyTaskEnd, APeersExit75IsNeverTheCause) {
  const auto end = classify_task_end(75 << 8, 0, 42, 0, false);
  EXPECT_EQ(end.kind, TaskEnd::kPeerFailed);
  EXPECT_EQ(end.line,
            "rank 0 ended because another rank of its pool failed (exit code 75); the failing rank's own "
            "exit ends step 42.0, or this node does in 1 s");
  EXPECT_EQ(classify_task_end(75 << 8, 0, 42, 0, true).kind, TaskEnd::kPeerFailed);
}

TEST(ClassifyTaskEnd, SigkillFromOutsideIsNamedButTheStepsOwnEndIsNot) {
  // Before the node knows of any end of the step, a SIGKILL came from
  // outside it: the OOM killer, kill -9.
  auto end = classify_task_end(SIGKILL, 2, 1, 0, false);
  EXPECT_EQ(end.kind, TaskEnd::kFailed);
  EXPECT_EQ(end.line,
            "rank 2 ended with signal 9 (SIGKILL), killed from outside the step (the OOM killer, kill -9); "
            "ending step 1.0 (kill-on-bad-exit)");
  // The step's own end: SIGTERM, and SIGKILL once the node knows.
  end = classify_task_end(SIGTERM, 3, 1, 0, false);
  EXPECT_EQ(end.kind, TaskEnd::kStepEnding);
  EXPECT_EQ(end.line, "rank 3 ended with signal 15 (SIGTERM): step 1.0 is ending");
  EXPECT_EQ(classify_task_end(SIGKILL, 3, 1, 0, true).kind, TaskEnd::kStepEnding);
  // Other signals stay a task's own failure even then.
  EXPECT_EQ(classify_task_end(SIGSEGV, 3, 1, 0, true).kind, TaskEnd::kFailed);
}

}  // namespace
}  // namespace dew::spank
