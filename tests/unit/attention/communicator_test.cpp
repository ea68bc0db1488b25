// The Gloo communicator with every rank a thread of this process over real
// loopback TCP, rendezvous through the in-process stand-in store: each
// collective for groups of 1, 2, 3 and 4, and its errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "communicator.h"

namespace {

using dew::attention::Communicator;
using dew::attention::GlooOptions;
using dew::attention::KeyValue;
using ::testing::HasSubstr;

// Runs body(communicator) on `size` threads, one Gloo rank each.
void spawn(int size, const std::function<void(Communicator&)>& body, const std::string& prefix = "test") {
  KeyValue store = dew::attention::local_key_value();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      GlooOptions options;
      options.rank = rank;
      options.size = size;
      options.store = store;
      options.prefix = prefix;
      auto comm = dew::attention::make_gloo_communicator(options);
      ASSERT_TRUE(comm.ok()) << comm.error().message;
      body(*comm.value());
    });
  }
  for (auto& t : threads) t.join();
}

class CommunicatorTest : public ::testing::TestWithParam<int> {};

TEST_P(CommunicatorTest, AllToAll) {
  const int n = GetParam();
  spawn(n, [n](Communicator& comm) {
    const int chunk = 5;
    std::vector<float> send(std::size_t(n * chunk)), recv(send.size());
    for (int to = 0; to < n; ++to)
      for (int i = 0; i < chunk; ++i) send[std::size_t(to * chunk + i)] = float(comm.rank() * 1000 + to * 10 + i);
    ASSERT_TRUE(comm.all_to_all<float>(send, recv).ok());
    for (int from = 0; from < n; ++from)
      for (int i = 0; i < chunk; ++i)
        EXPECT_EQ(recv[std::size_t(from * chunk + i)], float(from * 1000 + comm.rank() * 10 + i));
  });
}

TEST_P(CommunicatorTest, AllGather) {
  const int n = GetParam();
  spawn(n, [n](Communicator& comm) {
    std::vector<double> send = {comm.rank() + 0.5, comm.rank() * 2.0, -1.0};
    std::vector<double> recv(std::size_t(3 * n));
    ASSERT_TRUE(comm.all_gather<double>(send, recv).ok());
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(recv[std::size_t(3 * r)], r + 0.5);
      EXPECT_EQ(recv[std::size_t(3 * r + 1)], r * 2.0);
      EXPECT_EQ(recv[std::size_t(3 * r + 2)], -1.0);
    }
  });
}

TEST_P(CommunicatorTest, ReduceScatterSumsInRankOrder) {
  const int n = GetParam();
  spawn(n, [n](Communicator& comm) {
    const int chunk = 4;
    std::vector<float> send(std::size_t(n * chunk)), recv(chunk);
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = float(comm.rank() + 1) * 0.1f + float(i);
    ASSERT_TRUE(comm.reduce_scatter(std::span<const float>(send), std::span<float>(recv)).ok());
    for (int i = 0; i < chunk; ++i) {
      float expected = 0;  // the same order and precision
      for (int r = 0; r < n; ++r) expected += float(r + 1) * 0.1f + float(comm.rank() * chunk + i);
      EXPECT_EQ(recv[std::size_t(i)], expected);
    }
    EXPECT_TRUE(comm.barrier().ok());
  });
}

TEST_P(CommunicatorTest, ManyCallsInARow) {
  const int n = GetParam();
  spawn(n, [n](Communicator& comm) {
    for (int round = 0; round < 20; ++round) {
      std::vector<int> send(static_cast<std::size_t>(n), comm.rank() + round);
      std::vector<int> recv(static_cast<std::size_t>(n));
      ASSERT_TRUE(comm.all_to_all<int>(send, recv).ok());
      for (int r = 0; r < n; ++r) EXPECT_EQ(recv[std::size_t(r)], r + round);
      ASSERT_TRUE(comm.barrier().ok());
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, CommunicatorTest, ::testing::Values(1, 2, 3, 4));

TEST(CommunicatorErrorsTest, SizesThatDoNotFit) {
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
  });
}

TEST(CommunicatorErrorsTest, BadRankAndMissingPeer) {
  GlooOptions options;
  options.rank = 2;
  options.size = 2;
  options.store = dew::attention::local_key_value();
  auto r = dew::attention::make_gloo_communicator(options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "gloo: rank 2 of 2 is not allowed; allowed: 0 <= rank < size, size >= 1");
  // Rank 1 never comes: rank 0's rendezvous ends with an error, not a hang.
  options.rank = 0;
  options.store = dew::attention::local_key_value(std::chrono::milliseconds(300));
  r = dew::attention::make_gloo_communicator(options);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("gloo: rank 0 of 2 could not connect: "));
  EXPECT_EQ(r.error().message.find('\n'), std::string::npos);
}

}  // namespace
