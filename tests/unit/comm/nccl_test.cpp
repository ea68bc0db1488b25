// The NCCL communicator with every rank a thread of this process, one GPU
// each (NCCL allows one rank per GPU in a communicator), rendezvous through
// the in-process stand-in store: each collective for groups of 1 to 4 ranks
// as far as there are GPUs, and its errors. Without a GPU the collective
// tests skip with cudaGetDeviceCount's reason; the option checks and the
// one-line errors of a machine without a GPU still run.
#include "dew/nccl.h"

#include <cuda_runtime_api.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.h"
#include "dew/axes.h"
#include "expect_error.h"

namespace {

using dew::error_code_name;
using dew::ErrorCode;
using dew::comm::Communicator;
using dew::comm::KeyValue;
using dew::comm::NcclOptions;
using ::testing::HasSubstr;
using namespace dew::comm::testing;

// The number of GPUs, or 0 with cudaGetDeviceCount's reason in *why.
int gpus(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    *why = "no GPU: cudaGetDeviceCount says " + std::string(cudaGetErrorString(status));
    return 0;
  }
  if (count == 0) *why = "no GPU: cudaGetDeviceCount says 0 devices";
  return count;
}

// Skips the test unless there are `size` GPUs, printing why.
#define NEED_GPUS(size)                                                                           \
  do {                                                                                            \
    std::string why_;                                                                             \
    const int have_ = gpus(&why_);                                                                \
    if (have_ == 0) GTEST_SKIP() << why_;                                                         \
    if (have_ < (size))                                                                           \
      GTEST_SKIP() << (size) << " ranks need " << (size) << " GPUs (one rank per GPU in an NCCL " \
                   << "communicator); this machine has " << have_;                                \
  } while (0)

// Runs body(communicator) on `size` threads, rank r on GPU r.
void spawn(int size, const std::function<void(Communicator&)>& body, const std::string& prefix = "test") {
  KeyValue store = dew::comm::local_key_value();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      NcclOptions options;
      options.rank = rank;
      options.size = size;
      options.device = rank;
      options.store = store;
      options.prefix = prefix;
      auto comm = dew::comm::make_nccl_communicator(options);
      ASSERT_TRUE(comm.ok()) << comm.error().message;
      body(*comm.value());
    });
  }
  for (auto& t : threads) t.join();
}

class NcclCommunicatorTest : public ::testing::TestWithParam<int> {};

TEST_P(NcclCommunicatorTest, AllToAll) {
  NEED_GPUS(GetParam());
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_all_to_all(comm, n); });
}

TEST_P(NcclCommunicatorTest, AllGather) {
  NEED_GPUS(GetParam());
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_all_gather(comm, n); });
}

TEST_P(NcclCommunicatorTest, ReduceScatter) {
  NEED_GPUS(GetParam());
  // NCCL adds in its own order: the same bits as rank order up to 2 ranks.
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_reduce_scatter(comm, n, n <= 2); });
}

TEST_P(NcclCommunicatorTest, AllReduce) {
  NEED_GPUS(GetParam());
  // NCCL's reduce-scatter, then its all-gather: the same bits on every rank,
  // rank order's up to 2 ranks.
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_all_reduce(comm, n, n <= 2); });
}

TEST_P(NcclCommunicatorTest, Broadcast) {
  NEED_GPUS(GetParam());
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_broadcast(comm, n); });
}

TEST_P(NcclCommunicatorTest, ManyCallsInARowAndGrowingSizes) {
  NEED_GPUS(GetParam());
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_many_calls(comm, n); });
}

INSTANTIATE_TEST_SUITE_P(Sizes, NcclCommunicatorTest, ::testing::Values(1, 2, 3, 4));

TEST(NcclCommunicatorErrorsTest, SizesThatDoNotFit) {
  NEED_GPUS(2);
  spawn(2, check_size_errors);
}

TEST(NcclCommunicatorErrorsTest, BadOptions) {
  NcclOptions options;
  options.rank = 2;
  options.size = 2;
  options.store = dew::comm::local_key_value();
  EXPECT_EQ(dew::testing::invalid_argument_of(dew::comm::make_nccl_communicator(options)),
            "nccl: rank 2 of 2 is not allowed; allowed: 0 <= rank < size, size >= 1");
  options.rank = 0;
  options.device = -1;
  EXPECT_EQ(dew::testing::invalid_argument_of(dew::comm::make_nccl_communicator(options)),
            "nccl: rank 0 of 2: device -1 is not allowed; allowed: 0 or more");
  options.device = 0;
  options.timeout = std::chrono::milliseconds(0);
  EXPECT_EQ(dew::testing::invalid_argument_of(dew::comm::make_nccl_communicator(options)),
            "nccl: timeout 0 ms is not allowed; allowed: more than 0 ms");
  options.timeout = std::chrono::seconds(1);
  options.store.get = nullptr;
  EXPECT_EQ(dew::testing::invalid_argument_of(dew::comm::make_nccl_communicator(options)),
            "nccl: the key-value store needs both put and get");
}

TEST(NcclCommunicatorErrorsTest, RankZeroNeverComes) {
  NcclOptions options;
  options.rank = 1;
  options.size = 2;
  options.device = 1;
  options.store = dew::comm::local_key_value(std::chrono::milliseconds(200));
  EXPECT_THAT(dew::testing::message_of(dew::comm::make_nccl_communicator(options), ErrorCode::kTimeout),
              HasSubstr("nccl: rank 1 of 2 (GPU 1) could not get the NCCL unique id from rank 0: "
                        "key-value store: no value for 'dew/comm/nccl-unique-id'"));
}

TEST(NcclCommunicatorErrorsTest, AnIdOfTheWrongSize) {
  NcclOptions options;
  options.rank = 1;
  options.size = 2;
  options.store = dew::comm::local_key_value(std::chrono::milliseconds(200));
  ASSERT_TRUE(options.store.put("dew/comm/nccl-unique-id", {'x', 'y'}).ok());
  EXPECT_THAT(dew::testing::invalid_argument_of(dew::comm::make_nccl_communicator(options)),
              HasSubstr("nccl: rank 1 of 2 (GPU 0): the NCCL unique id under 'dew/comm/nccl-unique-id' has 2 "
                        "bytes; allowed: 128"));
}

// Where there is no GPU, making a communicator is one line naming the call.
TEST(NcclCommunicatorErrorsTest, NoGpuIsOneLine) {
  std::string why;
  if (gpus(&why) > 0) GTEST_SKIP() << "this machine has a GPU: the no-GPU error cannot happen here";
  NcclOptions options;
  options.store = dew::comm::local_key_value(std::chrono::milliseconds(200));
  const auto message = dew::testing::message_of(dew::comm::make_nccl_communicator(options), ErrorCode::kUnavailable);
  EXPECT_THAT(message, HasSubstr("nccl: rank 0 of 1 (GPU 0): cudaSetDevice failed: "));
  EXPECT_EQ(message.find('\n'), std::string::npos);
}

// A device's group from the pool and a mesh (axis_rendezvous) feeding NCCL,
// as a training process does: here a pool of one, two devices on the sequence
// axis, each a thread on its own GPU. Without two GPUs, the rendezvous itself
// still runs and the communicator's failure is one line.
TEST(NcclFromTheMesh, AxisRendezvousFeedsMakeNcclCommunicator) {
  dew::runtime::JoinOptions join_options;
  join_options.failure_handlers = false;  // gtest keeps its own
  auto pool = dew::runtime::join(join_options);
  auto built = dew::mesh::build_mesh(dew::mesh::parse_mesh_spec("sequence=2").value(), dew::mesh::cpu_pool(1, 2));
  ASSERT_TRUE(built.ok()) << built.error().message;
  std::string why;
  const int have = gpus(&why);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int device = 0; device < 2; ++device) {
    threads.emplace_back([&, device] {
      auto r =
          dew::axes::axis_rendezvous(pool, built.value(), dew::mesh::Axis::kSequence, device, std::chrono::seconds(10));
      if (!r.ok()) {
        errors[std::size_t(device)] = r.error().message;
        return;
      }
      EXPECT_EQ(r.value().member.rank, device);
      EXPECT_EQ(r.value().member.size, 2);
      if (have < 2) return;  // nothing to join NCCL on
      auto comm = dew::comm::make_nccl_communicator({.rank = r.value().member.rank,
                                                     .size = r.value().member.size,
                                                     .device = device,
                                                     .store = r.value().store,
                                                     .prefix = r.value().prefix});
      if (!comm.ok()) {
        errors[std::size_t(device)] = comm.error().message;
        return;
      }
      check_all_gather(*comm.value(), 2);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors, std::vector<std::string>(2)) << "GPUs: " << have << " " << why;
  if (have < 2) GTEST_SKIP() << "the rendezvous ran; NCCL needs 2 GPUs here (one rank per GPU): " << (have ? "1" : why);
}

}  // namespace
