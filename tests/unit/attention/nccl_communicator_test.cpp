// The NCCL communicator with every rank a thread of this process, one GPU
// each (NCCL allows one rank per GPU in a communicator), rendezvous through
// the in-process stand-in store: each collective for groups of 1 to 4 ranks
// as far as there are GPUs, and its errors. Without a GPU the collective
// tests skip with cudaGetDeviceCount's reason; the option checks and the
// one-line errors of a machine without a GPU still run.
#include <cuda_runtime_api.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "nccl_communicator.h"

namespace {

using dew::attention::Communicator;
using dew::attention::KeyValue;
using dew::attention::NcclOptions;
using ::testing::HasSubstr;

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
#define NEED_GPUS(size)                                                                                    \
  do {                                                                                                     \
    std::string why_;                                                                                      \
    const int have_ = gpus(&why_);                                                                         \
    if (have_ == 0) GTEST_SKIP() << why_;                                                                  \
    if (have_ < (size))                                                                                    \
      GTEST_SKIP() << (size) << " ranks need " << (size) << " GPUs (one rank per GPU in an NCCL "          \
                   << "communicator); this machine has " << have_;                                         \
  } while (0)

// Runs body(communicator) on `size` threads, rank r on GPU r.
void spawn(int size, const std::function<void(Communicator&)>& body, const std::string& prefix = "test") {
  KeyValue store = dew::attention::local_key_value();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      NcclOptions options;
      options.rank = rank;
      options.size = size;
      options.device = rank;
      options.store = store;
      options.prefix = prefix;
      auto comm = dew::attention::make_nccl_communicator(options);
      ASSERT_TRUE(comm.ok()) << comm.error().message;
      body(*comm.value());
    });
  }
  for (auto& t : threads) t.join();
}

class NcclCommunicatorTest : public ::testing::TestWithParam<int> {};

TEST_P(NcclCommunicatorTest, AllToAll) {
  const int n = GetParam();
  NEED_GPUS(n);
  spawn(n, [n](Communicator& comm) {
    const int chunk = 5;
    std::vector<float> send(std::size_t(n * chunk)), recv(send.size());
    for (int to = 0; to < n; ++to)
      for (int i = 0; i < chunk; ++i) send[std::size_t(to * chunk + i)] = float(comm.rank() * 1000 + to * 10 + i);
    auto done = comm.all_to_all<float>(send, recv);
    ASSERT_TRUE(done.ok()) << done.error().message;
    for (int from = 0; from < n; ++from)
      for (int i = 0; i < chunk; ++i)
        EXPECT_EQ(recv[std::size_t(from * chunk + i)], float(from * 1000 + comm.rank() * 10 + i));
  });
}

TEST_P(NcclCommunicatorTest, AllGather) {
  const int n = GetParam();
  NEED_GPUS(n);
  spawn(n, [n](Communicator& comm) {
    std::vector<double> send = {comm.rank() + 0.5, comm.rank() * 2.0, -1.0};
    std::vector<double> recv(std::size_t(3 * n));
    auto done = comm.all_gather<double>(send, recv);
    ASSERT_TRUE(done.ok()) << done.error().message;
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(recv[std::size_t(3 * r)], r + 0.5);
      EXPECT_EQ(recv[std::size_t(3 * r + 1)], r * 2.0);
      EXPECT_EQ(recv[std::size_t(3 * r + 2)], -1.0);
    }
  });
}

TEST_P(NcclCommunicatorTest, ReduceScatter) {
  const int n = GetParam();
  NEED_GPUS(n);
  spawn(n, [n](Communicator& comm) {
    const int chunk = 4;
    std::vector<float> send(std::size_t(n * chunk)), recv(chunk);
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = float(comm.rank() + 1) * 0.1f + float(i);
    auto done = comm.reduce_scatter(std::span<const float>(send), std::span<float>(recv));
    ASSERT_TRUE(done.ok()) << done.error().message;
    for (int i = 0; i < chunk; ++i) {
      float expected = 0;  // rank order, fp32
      for (int r = 0; r < n; ++r) expected += float(r + 1) * 0.1f + float(comm.rank() * chunk + i);
      // NCCL adds in its own order: the same bits as rank order up to 2 ranks.
      if (n <= 2) {
        EXPECT_EQ(recv[std::size_t(i)], expected);
      } else {
        EXPECT_FLOAT_EQ(recv[std::size_t(i)], expected);
      }
    }
    std::vector<double> send64(std::size_t(n * chunk)), recv64(chunk);
    for (std::size_t i = 0; i < send64.size(); ++i) send64[i] = double(comm.rank()) + double(i) * 0.25;
    done = comm.reduce_scatter(std::span<const double>(send64), std::span<double>(recv64));
    ASSERT_TRUE(done.ok()) << done.error().message;
    for (int i = 0; i < chunk; ++i) {
      double expected = 0;  // quarters and integers: exact in any order
      for (int r = 0; r < n; ++r) expected += double(r) + double(comm.rank() * chunk + i) * 0.25;
      EXPECT_EQ(recv64[std::size_t(i)], expected);
    }
    done = comm.barrier();
    EXPECT_TRUE(done.ok()) << done.error().message;
  });
}

TEST_P(NcclCommunicatorTest, ManyCallsInARowAndGrowingSizes) {
  const int n = GetParam();
  NEED_GPUS(n);
  spawn(n, [n](Communicator& comm) {
    for (int round = 0; round < 20; ++round) {
      const std::size_t per = std::size_t(1 + round * 37);  // the device buffer grows
      std::vector<int> send(std::size_t(n) * per, comm.rank() + round);
      std::vector<int> recv(send.size());
      auto done = comm.all_to_all<int>(send, recv);
      ASSERT_TRUE(done.ok()) << done.error().message;
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < per; ++i) EXPECT_EQ(recv[std::size_t(r) * per + i], r + round);
      done = comm.barrier();
      ASSERT_TRUE(done.ok()) << done.error().message;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, NcclCommunicatorTest, ::testing::Values(1, 2, 3, 4));

TEST(NcclCommunicatorErrorsTest, SizesThatDoNotFit) {
  NEED_GPUS(2);
  spawn(2, [](Communicator& comm) {
    std::vector<float> send(3), recv(3);
    auto r = comm.all_to_all<float>(send, recv);
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.error().message, HasSubstr("all_to_all: 3 values to send and 3 to receive are not allowed"));
    std::vector<float> small(5);
    r = comm.all_gather<float>(send, small);
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.error().message, HasSubstr("all_gather: 20 bytes to receive is not allowed; allowed: 2 ranks x 12"));
    std::vector<float> one(2);
    r = comm.reduce_scatter(std::span<const float>(send), std::span<float>(one));
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.error().message, HasSubstr("reduce_scatter: 3 values to send is not allowed"));
    // A refused call exchanged nothing: the communicator still works.
    r = comm.barrier();
    EXPECT_TRUE(r.ok()) << r.error().message;
  });
}

// These need no GPU: options are checked, and rank 0's id awaited, before
// any CUDA call.
TEST(NcclCommunicatorErrorsTest, BadOptions) {
  NcclOptions options;
  options.rank = 2;
  options.size = 2;
  options.store = dew::attention::local_key_value();
  auto r = dew::attention::make_nccl_communicator(options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "nccl: rank 2 of 2 is not allowed; allowed: 0 <= rank < size, size >= 1");
  options.rank = 0;
  options.device = -1;
  r = dew::attention::make_nccl_communicator(options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "nccl: rank 0 of 2: device -1 is not allowed; allowed: 0 or more");
  options.device = 0;
  options.timeout = std::chrono::milliseconds(0);
  r = dew::attention::make_nccl_communicator(options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "nccl: timeout 0 ms is not allowed; allowed: more than 0 ms");
  options.timeout = std::chrono::seconds(1);
  options.store.get = nullptr;
  r = dew::attention::make_nccl_communicator(options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "nccl: the key-value store needs both put and get");
}

TEST(NcclCommunicatorErrorsTest, RankZeroNeverComes) {
  NcclOptions options;
  options.rank = 1;
  options.size = 2;
  options.device = 1;
  options.store = dew::attention::local_key_value(std::chrono::milliseconds(200));
  auto r = dew::attention::make_nccl_communicator(options);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("nccl: rank 1 of 2 (GPU 1) could not get the NCCL unique id from rank 0: "
                                           "key-value store: no value for 'dew/attention/nccl-unique-id'"));
  EXPECT_EQ(r.error().message.find('\n'), std::string::npos);
}

TEST(NcclCommunicatorErrorsTest, AnIdOfTheWrongSize) {
  NcclOptions options;
  options.rank = 1;
  options.size = 2;
  options.store = dew::attention::local_key_value(std::chrono::milliseconds(200));
  options.store.put("dew/attention/nccl-unique-id", {'x', 'y'});
  auto r = dew::attention::make_nccl_communicator(options);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message,
              HasSubstr("nccl: rank 1 of 2 (GPU 0): the NCCL unique id under 'dew/attention/nccl-unique-id' has 2 "
                        "bytes; allowed: 128"));
}

// Where there is no GPU, making a communicator is one line naming the call.
TEST(NcclCommunicatorErrorsTest, NoGpuIsOneLine) {
  std::string why;
  if (gpus(&why) > 0) GTEST_SKIP() << "this machine has a GPU: the no-GPU error cannot happen here";
  NcclOptions options;
  options.store = dew::attention::local_key_value(std::chrono::milliseconds(200));
  auto r = dew::attention::make_nccl_communicator(options);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("nccl: rank 0 of 1 (GPU 0): cudaSetDevice failed: "));
  EXPECT_EQ(r.error().message.find('\n'), std::string::npos);
}

}  // namespace
