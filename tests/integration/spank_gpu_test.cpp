// Per-task GPU binding with GPUs that Slurm itself hands out: the test
// cluster declares 4 GPUs per node in gres.conf over stand-in character
// devices (no real GPU here), so CUDA_VISIBLE_DEVICES comes from Slurm's
// gres/gpu plugin exactly as on a GPU node.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "slurm_cluster.h"
#include "srun_output.h"

namespace dew::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(SrunDewPoolGpus, DevicesPerProcessSplitsTheNodesGpus) {
  auto tasks = srun_task_environments(
      {"--dew-pool", "--dew-devices-per-process=2", "-N2", "-n4", "--ntasks-per-node=2", "--gpus-per-node=4"});
  ASSERT_EQ(tasks.size(), 4u);
  for (auto& [rank, env] : tasks) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(env["SLURM_STEP_GPUS"], "0,1,2,3") << "Slurm gave the step all four GPUs of the node";
    EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], env["SLURM_LOCALID"] == "0" ? "0,1" : "2,3");
    EXPECT_EQ(env["JAX_LOCAL_DEVICE_IDS"], "0,1");
  }
}

// Nothing says how many GPUs a task takes: several tasks on a node share its
// GPUs evenly (JAX would otherwise take every visible GPU in every task);
// more tasks than GPUs is refused before any task runs; one task keeps all.
TEST(SrunDewPoolGpus, WithoutDevicesPerProcessTasksShareTheNodesGpusEvenly) {
  const auto visible = [](int tasks_per_node) {
    auto r = cluster().srun(
        {"--dew-pool", "-N1", "-n" + std::to_string(tasks_per_node), "--gpus-per-node=4", "-l", "env"}, {}, 30s);
    std::map<std::string, std::string> by_local;
    for (auto& [rank, env] : task_environments(r.out)) by_local[env["SLURM_LOCALID"]] = env["CUDA_VISIBLE_DEVICES"];
    return std::make_pair(r, by_local);
  };
  auto [four, four_visible] = visible(4);
  ASSERT_EQ(four.exit_code, 0) << describe(four);
  EXPECT_EQ(four_visible, (std::map<std::string, std::string>{{"0", "0"}, {"1", "1"}, {"2", "2"}, {"3", "3"}}));
  auto [two, two_visible] = visible(2);
  ASSERT_EQ(two.exit_code, 0) << describe(two);
  EXPECT_EQ(two_visible, (std::map<std::string, std::string>{{"0", "0,1"}, {"1", "2,3"}}));
  auto [three, three_visible] = visible(3);
  ASSERT_EQ(three.exit_code, 0) << describe(three);
  EXPECT_EQ(three_visible, (std::map<std::string, std::string>{{"0", "0"}, {"1", "1"}, {"2", "2"}}));
  auto [one, one_visible] = visible(1);
  ASSERT_EQ(one.exit_code, 0) << describe(one);
  EXPECT_EQ(one_visible, (std::map<std::string, std::string>{{"0", "0,1,2,3"}})) << "one task keeps them all";

  const auto markers = marker_path("five-on-four");
  std::filesystem::create_directories(markers);
  auto five = cluster().srun(
      {"--dew-pool", "-N1", "-n5", "--gpus-per-node=4", "bash", "-c", "touch " + markers + "/$SLURM_PROCID; sleep 30"},
      {}, 60s);
  EXPECT_NE(five.exit_code, 0) << describe(five);
  EXPECT_LT(five.seconds, 20.0);
  EXPECT_THAT(five.err, HasSubstr("5 processes on this node would share 4 GPUs; allowed: at most 4")) << describe(five);
  EXPECT_TRUE(std::filesystem::is_empty(markers)) << "no task ran";
}

TEST(SrunDewPoolGpus, PlugstackDevicesPerProcessIsTheDefault) {
  cluster().set_plugstack_args("devices_per_process=1");
  auto r = cluster().srun({"--dew-pool", "-N1", "-n4", "--gpus-per-node=4", "-l", "env"}, {}, 30s);
  cluster().set_plugstack_args("");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  auto tasks = task_environments(r.out);
  ASSERT_EQ(tasks.size(), 4u);
  for (auto& [rank, env] : tasks) EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], env["SLURM_LOCALID"]) << rank;
}

// The admin's default binds the GPUs of steps that have some; a step that
// asked for none runs; a user can switch the default off for one step.
TEST(SrunDewPoolGpus, PlugstackDevicesPerProcessLeavesStepsWithoutGpusAndCanBeSwitchedOff) {
  cluster().set_plugstack_args("devices_per_process=2");
  auto cpu_only = cluster().srun({"--dew-pool", "-N2", "-n4", "-l", "env"}, {}, 30s);
  auto off = cluster().srun(
      {"--dew-pool", "--dew-devices-per-process=off", "-N1", "-n4", "--gpus-per-node=4", "-l", "env"}, {}, 30s);
  cluster().set_plugstack_args("");
  ASSERT_EQ(cpu_only.exit_code, 0) << describe(cpu_only);
  auto tasks = task_environments(cpu_only.out);
  ASSERT_EQ(tasks.size(), 4u);
  for (auto& [rank, env] : tasks) {
    EXPECT_EQ(env.count("CUDA_VISIBLE_DEVICES"), 0u) << rank;
    EXPECT_EQ(env["DEW_PROCESS_COUNT"], "4");
  }
  ASSERT_EQ(off.exit_code, 0) << describe(off);
  tasks = task_environments(off.out);
  ASSERT_EQ(tasks.size(), 4u);
  for (auto& [rank, env] : tasks) EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "0,1,2,3") << rank;
}

TEST(SrunDewPoolGpus, SlurmsPerTaskBindingIsKept) {
  auto tasks = srun_task_environments(
      {"--dew-pool", "--dew-devices-per-process=2", "-N2", "-n4", "--ntasks-per-node=2", "--gpus-per-task=1"});
  ASSERT_EQ(tasks.size(), 4u);
  for (auto& [rank, env] : tasks) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_THAT(env["SLURMD_TRES_BIND"], HasSubstr("gpu:"));
    EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], env["SLURM_LOCALID"]) << "Slurm's one GPU per task";
    EXPECT_EQ(env["JAX_LOCAL_DEVICE_IDS"], "0");
  }
}

TEST(SrunDewPoolGpus, SlurmsMapGpuBindingIsKept) {
  auto tasks = srun_task_environments({"--dew-pool", "-N1", "-n2", "--gpus-per-node=4", "--gpu-bind=map_gpu:3,1"});
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_EQ(tasks[0]["CUDA_VISIBLE_DEVICES"], "3");
  EXPECT_EQ(tasks[1]["CUDA_VISIBLE_DEVICES"], "1");
}

TEST(SrunDewPoolGpus, TooFewGpusFailsEveryTaskBeforeExecWithTheCounts) {
  const auto markers = marker_path("gpus");
  std::filesystem::create_directories(markers);
  auto r = cluster().srun({"--dew-pool", "--dew-devices-per-process=2", "-N2", "-n4", "--ntasks-per-node=2",
                           "--gpus-per-node=2", "bash", "-c", "touch " + markers + "/$SLURM_PROCID; sleep 30"},
                          {}, 60s);
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_THAT(r.err, HasSubstr("local process 1 of 2 needs GPUs [2, 4) with 2 devices per process, but this node has "
                               "2 GPUs (CUDA_VISIBLE_DEVICES=0,1)"))
      << describe(r);
  // Not even the tasks that would fit (local task 0 of each node) ran.
  EXPECT_TRUE(std::filesystem::is_empty(markers)) << "no task ran";
}

}  // namespace
}  // namespace dew::testing
