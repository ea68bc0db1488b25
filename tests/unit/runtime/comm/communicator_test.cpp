// The Gloo communicator with every rank a thread of this process over real
// loopback TCP, rendezvous through the in-process stand-in store: each
// collective for groups of 1, 2, 3 and 4, and its errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.h"
#include "dew/comm.h"
#include "expect_error.h"

namespace {

using dew::comm::Communicator;
using dew::comm::GlooOptions;
using dew::comm::KeyValue;
using ::testing::HasSubstr;
using dew::ErrorCode;
using dew::error_code_name;
using namespace dew::comm::testing;

// Runs body(communicator) on `size` threads, one Gloo rank each.
void spawn(int size, const std::function<void(Communicator&)>& body, const std::string& prefix = "test") {
  KeyValue store = dew::comm::local_key_value();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      GlooOptions options;
      options.rank = rank;
      options.size = size;
      options.store = store;
      options.prefix = prefix;
      auto comm = dew::comm::make_gloo_communicator(options);
      ASSERT_TRUE(comm.ok()) << comm.error().message;
      body(*comm.value());
    });
  }
  for (auto& t : threads) t.join();
}

class CommunicatorTest : public ::testing::TestWithParam<int> {};

TEST_P(CommunicatorTest, AllToAll) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_all_to_all(comm, n); });
}

TEST_P(CommunicatorTest, AllGather) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_all_gather(comm, n); });
}

TEST_P(CommunicatorTest, ReduceScatterSumsInRankOrder) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_reduce_scatter(comm, n, /*rank_order=*/true); });
}

TEST_P(CommunicatorTest, AllReduceSumsInRankOrderAndAgreesOnEveryRank) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_all_reduce(comm, n, /*rank_order=*/true); });
}

// Past one segment of the two-rank reduce-scatter (256 KiB) and not a
// multiple of it: the same bits as the rank-order sum, float and double.
TEST_P(CommunicatorTest, LargeReduceScattersAndAllReducesSumInRankOrder) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) {
    const std::size_t chunk = 200003;
    std::vector<float> send(chunk * std::size_t(n)), recv(chunk);
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = float(comm.rank() + 1) * 0.37f + float(i % 1000) * 1e-3f;
    ASSERT_TRUE(comm.reduce_scatter(std::span<const float>(send), std::span<float>(recv)).ok());
    for (std::size_t i = 0; i < chunk; i += 997) {
      float expected = 0;
      for (int r = 0; r < n; ++r) {
        expected += float(r + 1) * 0.37f + float((std::size_t(comm.rank()) * chunk + i) % 1000) * 1e-3f;
      }
      ASSERT_EQ(recv[i], expected) << "element " << i;
    }
    std::vector<double> data(chunk * 2 + 1);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = double(comm.rank()) * 0.1 + double(i) * 1e-7;
    ASSERT_TRUE(comm.all_reduce(std::span<double>(data)).ok());
    for (std::size_t i = 0; i < data.size(); i += 1009) {
      double expected = 0;
      for (int r = 0; r < n; ++r) expected += double(r) * 0.1 + double(i) * 1e-7;
      ASSERT_EQ(data[i], expected) << "element " << i;
    }
  });
}

// Three or more ranks run the all-reduce as a chain of 1 MiB segments:
// past three segments and not a multiple of one, every element of a float
// sum has the rank-order bits on every rank (a ring's order would differ);
// so does every element of a reduce-scatter past one segment.
TEST_P(CommunicatorTest, MultiSegmentFloatAllReduceAndReduceScatterHaveRankOrderBitsEverywhere) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) {
    const std::size_t length = 3 * 262144 + 12345;
    const auto value = [](int rank, std::size_t i) {
      return float(rank + 1) * 0.37f + float(i % 1013) * 1e-3f + float(rank * rank) * 1e-5f;
    };
    std::vector<float> data(length);
    for (std::size_t i = 0; i < length; ++i) data[i] = value(comm.rank(), i);
    ASSERT_TRUE(comm.all_reduce(std::span<float>(data)).ok());
    std::size_t wrong = 0, first_wrong = length;
    for (std::size_t i = 0; i < length; ++i) {
      float expected = 0;
      for (int r = 0; r < n; ++r) expected += value(r, i);
      if (data[i] != expected && wrong++ == 0) first_wrong = i;
    }
    EXPECT_EQ(wrong, 0u) << "first at element " << first_wrong << " on rank " << comm.rank();
    // The reduce-scatter's segments (equal, at least 1 MiB past two ranks):
    // a chunk of two and a half, every element in rank order.
    const std::size_t chunk = 655360;
    std::vector<float> send(chunk * std::size_t(n)), mine(chunk);
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = value(comm.rank(), i);
    ASSERT_TRUE(comm.reduce_scatter(std::span<const float>(send), std::span<float>(mine)).ok());
    wrong = 0;
    for (std::size_t i = 0; i < chunk; ++i) {
      float expected = 0;
      for (int r = 0; r < n; ++r) expected += value(r, std::size_t(comm.rank()) * chunk + i);
      if (mine[i] != expected && wrong++ == 0) first_wrong = i;
    }
    EXPECT_EQ(wrong, 0u) << "reduce-scatter: first at element " << first_wrong << " on rank " << comm.rank();
  });
}

// In place: recv is this rank's own chunk of send, as NCCL allows.
TEST_P(CommunicatorTest, ReduceScatterInPlaceSumsInRankOrder) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) {
    const std::size_t chunk = 300007;
    const auto value = [](int rank, std::size_t i) { return float(rank + 1) * 0.37f + float(i % 997) * 1e-3f; };
    std::vector<float> data(chunk * std::size_t(n));
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = value(comm.rank(), i);
    const std::span<float> mine(data.data() + std::size_t(comm.rank()) * chunk, chunk);
    ASSERT_TRUE(comm.reduce_scatter(std::span<const float>(data), mine).ok());
    for (std::size_t i = 0; i < chunk; i += 101) {
      float expected = 0;
      for (int r = 0; r < n; ++r) expected += value(r, std::size_t(comm.rank()) * chunk + i);
      ASSERT_EQ(mine[i], expected) << "element " << i;
    }
  });
}

TEST_P(CommunicatorTest, BroadcastFromEveryRoot) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_broadcast(comm, n); });
}

TEST_P(CommunicatorTest, ManyCallsInARowAndGrowingSizes) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_many_calls(comm, n); });
}

INSTANTIATE_TEST_SUITE_P(Sizes, CommunicatorTest, ::testing::Values(1, 2, 3, 4, 5));

TEST(CommunicatorErrorsTest, SizesThatDoNotFit) { spawn(2, check_size_errors); }

// A rank that leaves instead of joining a large all-reduce: the others end
// with an error naming the collective, not a hang.
TEST(CommunicatorErrorsTest, PeerGoneDuringAllReduceIsAnErrorNotAHang) {
  KeyValue store = dew::comm::local_key_value();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(3);
  const auto start = std::chrono::steady_clock::now();
  for (int rank = 0; rank < 3; ++rank) {
    threads.emplace_back([&, rank] {
      GlooOptions options;
      options.rank = rank;
      options.size = 3;
      options.store = store;
      options.timeout = std::chrono::seconds(20);
      auto comm = dew::comm::make_gloo_communicator(options);
      ASSERT_TRUE(comm.ok()) << comm.error().message;
      if (rank == 2) return;  // its connections close with it
      std::vector<float> data(3 * 262144, 1.0f);
      const auto done = comm.value()->all_reduce(std::span<float>(data));
      ASSERT_FALSE(done.ok());
      errors[std::size_t(rank)] = done.error().message;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(errors[std::size_t(rank)], HasSubstr("all_reduce on rank " + std::to_string(rank) + " of 3 failed"));
    EXPECT_EQ(errors[std::size_t(rank)].find('\n'), std::string::npos) << "one line";
  }
}

TEST(CommunicatorErrorsTest, BadRankAndMissingPeer) {
  GlooOptions options;
  options.rank = 2;
  options.size = 2;
  options.store = dew::comm::local_key_value();
  EXPECT_EQ(dew::testing::invalid_argument_of(dew::comm::make_gloo_communicator(options)),
            "gloo: rank 2 of 2 is not allowed; allowed: 0 <= rank < size, size >= 1");
  // Rank 1 never comes: rank 0's rendezvous ends with an error, not a hang.
  options.rank = 0;
  options.store = dew::comm::local_key_value(std::chrono::milliseconds(300));
  const auto r = dew::comm::make_gloo_communicator(options);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.error().code == ErrorCode::kTimeout || r.error().code == ErrorCode::kUnavailable)
      << error_code_name(r.error().code);
  EXPECT_EQ(r.error().message.find('\n'), std::string::npos) << "one line";
}

}  // namespace
