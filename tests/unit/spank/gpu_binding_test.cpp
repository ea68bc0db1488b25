#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pool_plan.h"

namespace dew::spank {
namespace {

using ::testing::HasSubstr;

GpuBindingInput input(std::optional<std::string> visible, unsigned local, unsigned count,
                      std::optional<unsigned> per_process, bool bound = false) {
  GpuBindingInput in;
  in.visible_devices = std::move(visible);
  in.local_task = local;
  in.local_task_count = count;
  in.devices_per_process = per_process;
  in.bound_by_slurm = bound;
  return in;
}

TEST(BindGpus, SplitsIndicesByLocalTask) {
  for (unsigned task = 0; task < 4; ++task) {
    auto binding = bind_gpus(input("0,1,2,3,4,5,6,7", task, 4, 2));
    ASSERT_TRUE(binding.ok());
    EXPECT_EQ(binding.value().visible_devices,
              std::to_string(2 * task) + "," + std::to_string(2 * task + 1));
    EXPECT_EQ(binding.value().local_device_ids, "0,1");
  }
}

TEST(BindGpus, TreatsUuidsAsOpaqueTokens) {
  auto binding = bind_gpus(input("GPU-aaaa-1,GPU-bbbb-2,MIG-cccc/1/0", 2, 3, 1));
  ASSERT_TRUE(binding.ok());
  EXPECT_EQ(binding.value().visible_devices, "MIG-cccc/1/0");
  EXPECT_EQ(binding.value().local_device_ids, "0");
}

TEST(BindGpus, KeepsStepOrderNotNumericOrder) {
  auto binding = bind_gpus(input("3,1,2,0", 1, 2, 2));
  ASSERT_TRUE(binding.ok());
  EXPECT_EQ(binding.value().visible_devices, "2,0");
}

TEST(BindGpus, TooFewGpusGivesTheCounts) {
  auto binding = bind_gpus(input("0,1,2", 1, 2, 2));
  ASSERT_FALSE(binding.ok());
  EXPECT_THAT(binding.error().message, HasSubstr("local task 1 of 2 needs GPUs [2, 4)"));
  EXPECT_THAT(binding.error().message, HasSubstr("the step has 3 GPUs on this node"));
  EXPECT_THAT(binding.error().message, HasSubstr("CUDA_VISIBLE_DEVICES=0,1,2"));
  EXPECT_THAT(binding.error().message, HasSubstr("2 tasks need 4"));
  // Task 0 of the same step fits.
  EXPECT_TRUE(bind_gpus(input("0,1,2", 0, 2, 2)).ok());
}

TEST(BindGpus, NoGpusAtAllWithDevicesPerProcess) {
  auto binding = bind_gpus(input(std::nullopt, 0, 1, 1));
  ASSERT_FALSE(binding.ok());
  EXPECT_THAT(binding.error().message, HasSubstr("the step has 0 GPUs"));
  EXPECT_THAT(binding.error().message, HasSubstr("<unset>"));
  EXPECT_FALSE(bind_gpus(input("NoDevFiles", 0, 1, 1)).ok());
}

TEST(BindGpus, WithoutDevicesPerProcessEveryTaskSeesAll) {
  auto binding = bind_gpus(input("0,1,2,3", 1, 2, std::nullopt));
  ASSERT_TRUE(binding.ok());
  EXPECT_FALSE(binding.value().visible_devices) << "CUDA_VISIBLE_DEVICES left as Slurm set it";
  EXPECT_EQ(binding.value().local_device_ids, "0,1,2,3");
}

TEST(BindGpus, NoGpusAndNoRequestSetsNothing) {
  auto binding = bind_gpus(input(std::nullopt, 0, 4, std::nullopt));
  ASSERT_TRUE(binding.ok());
  EXPECT_FALSE(binding.value().visible_devices);
  EXPECT_FALSE(binding.value().local_device_ids);
}

TEST(BindGpus, SlurmsOwnBindingIsKept) {
  auto binding = bind_gpus(input("5", 3, 4, 2, /*bound=*/true));
  ASSERT_TRUE(binding.ok());
  EXPECT_FALSE(binding.value().visible_devices);
  EXPECT_EQ(binding.value().local_device_ids, "0");
}

TEST(BindGpus, EmptyTokenIsAnError) {
  auto binding = bind_gpus(input("0,,1", 0, 1, 1));
  ASSERT_FALSE(binding.ok());
  EXPECT_THAT(binding.error().message, HasSubstr("CUDA_VISIBLE_DEVICES='0,,1' has an empty entry"));
}

TEST(SlurmBoundGpus, ReadsTresBindAndGpusPerTask) {
  EXPECT_TRUE(slurm_bound_gpus("gpu:per_task:1", std::nullopt));
  EXPECT_TRUE(slurm_bound_gpus("gpu:map_gpu:0,1", std::nullopt));
  EXPECT_TRUE(slurm_bound_gpus(std::nullopt, "1"));
  EXPECT_FALSE(slurm_bound_gpus(std::nullopt, std::nullopt));
  EXPECT_FALSE(slurm_bound_gpus("", ""));
}

}  // namespace
}  // namespace dew::spank
