#include "dew/gpu_binding.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "expect_error.h"

namespace dew {
namespace {

using ::testing::HasSubstr;

GpuBindingInput input(std::optional<std::string> visible, unsigned local, unsigned count,
                      std::optional<unsigned> per_process, bool bound = false) {
  GpuBindingInput in;
  in.visible_devices = std::move(visible);
  in.local_process = local;
  in.local_process_count = count;
  in.devices_per_process = per_process;
  in.bound_by_slurm = bound;
  return in;
}

TEST(BindGpus, SplitsIndicesByLocalTask) {
  for (unsigned task = 0; task < 4; ++task) {
    auto binding = bind_gpus(input("0,1,2,3,4,5,6,7", task, 4, 2));
    ASSERT_TRUE(binding.ok());
    EXPECT_EQ(binding.value().visible_devices, std::to_string(2 * task) + "," + std::to_string(2 * task + 1));
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
  // The counts are the feature: which GPUs the process needs, how many the
  // node has, how many all its processes need.
  const auto message = dew::testing::invalid_argument_of(bind_gpus(input("0,1,2", 1, 2, 2)));
  EXPECT_THAT(message, HasSubstr("local process 1 of 2 needs GPUs [2, 4)"));
  EXPECT_THAT(message, HasSubstr("this node has 3 GPUs"));
  EXPECT_THAT(message, HasSubstr("CUDA_VISIBLE_DEVICES=0,1,2"));
  EXPECT_THAT(message, HasSubstr("2 processes need 4"));
  // Task 0 of the same node would fit, but starts no more than task 1: the
  // step is refused whole, with the same line on every task.
  EXPECT_EQ(dew::testing::invalid_argument_of(bind_gpus(input("0,1,2", 0, 2, 2))), message);
  EXPECT_EQ(dew::testing::invalid_argument_of(bind_gpus(input("0,1,2,3", 0, 3, 3))),
            dew::testing::invalid_argument_of(bind_gpus(input("0,1,2,3", 2, 3, 3))));
  EXPECT_TRUE(bind_gpus(input("0,1,2,3", 1, 2, 2)).ok());
}

TEST(BindGpus, NoGpusAtAllWithDevicesPerProcess) {
  const auto message = dew::testing::invalid_argument_of(bind_gpus(input(std::nullopt, 0, 1, 1)));
  EXPECT_THAT(message, HasSubstr("this node has 0 GPUs"));
  EXPECT_THAT(message, HasSubstr("with 1 device per process")) << "one device, not 'devices'";
  EXPECT_THAT(message, HasSubstr("CUDA_VISIBLE_DEVICES unset"));
  dew::testing::invalid_argument_of(bind_gpus(input("NoDevFiles", 0, 1, 1)));
}

TEST(BindGpus, WithoutVisibleDevicesTheNodesGpusAreIndices) {
  GpuBindingInput in = input(std::nullopt, 1, 2, 2);
  in.gpu_count = 4;
  auto binding = bind_gpus(in);
  ASSERT_TRUE(binding.ok()) << binding.error().message;
  EXPECT_EQ(binding.value().visible_devices, "2,3");
  EXPECT_EQ(binding.value().local_device_ids, "0,1");
  in.gpu_count = 3;
  in.place = "host node7";
  EXPECT_THAT(dew::testing::invalid_argument_of(bind_gpus(in)), HasSubstr("host node7 has 3 GPUs"));
}

TEST(BindGpus, AVisibleListWinsOverTheGpuCount) {
  GpuBindingInput in = input("4,5,6,7", 1, 2, 2);
  in.gpu_count = 8;
  auto binding = bind_gpus(in);
  ASSERT_TRUE(binding.ok());
  EXPECT_EQ(binding.value().visible_devices, "6,7") << "the inherited list is sliced, not the node's indices";
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
  EXPECT_THAT(dew::testing::invalid_argument_of(bind_gpus(input("0,,1", 0, 1, 1))),
              HasSubstr("CUDA_VISIBLE_DEVICES='0,,1' has an empty entry"));
}

TEST(SlurmBoundGpus, ReadsTresBindAndGpusPerTask) {
  EXPECT_TRUE(slurm_bound_gpus("gpu:per_task:1", std::nullopt));
  EXPECT_TRUE(slurm_bound_gpus("gpu:map_gpu:0,1", std::nullopt));
  EXPECT_TRUE(slurm_bound_gpus(std::nullopt, "1"));
  EXPECT_FALSE(slurm_bound_gpus(std::nullopt, std::nullopt));
  EXPECT_FALSE(slurm_bound_gpus("", ""));
}

}  // namespace
}  // namespace dew

TEST(EvenShare, OneProcessKeepsAllSeveralShareMoreThanGpusAreRefused) {
  EXPECT_EQ(dew::even_share(4, 1, "this node").value(), std::nullopt);
  EXPECT_EQ(dew::even_share(4, 4, "this node").value(), 1u);
  EXPECT_EQ(dew::even_share(4, 2, "this node").value(), 2u);
  EXPECT_EQ(dew::even_share(4, 3, "this node").value(), 1u);
  EXPECT_EQ(dew::even_share(8, 3, "this node").value(), 2u);
  EXPECT_EQ(dew::even_share(0, 3, "this node").value(), std::nullopt) << "no GPUs: nothing to share";
  auto refused = dew::even_share(4, 5, "host n1");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().message.rfind("5 processes on host n1 would share 4 GPUs; allowed: at most 4", 0), 0u);
}
