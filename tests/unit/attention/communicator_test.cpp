// The Gloo communicator with every rank a thread of this process over real
// loopback TCP, rendezvous through the in-process stand-in store: each
// collective for groups of 1, 2, 3 and 4, and its errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.h"
#include "communicator.h"

namespace {

using dew::attention::Communicator;
using dew::attention::GlooOptions;
using dew::attention::KeyValue;
using ::testing::HasSubstr;
using namespace dew::attention::testing;

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
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_all_to_all(comm, n); });
}

TEST_P(CommunicatorTest, AllGather) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_all_gather(comm, n); });
}

TEST_P(CommunicatorTest, ReduceScatterSumsInRankOrder) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_reduce_scatter(comm, n, /*rank_order=*/true); });
}

TEST_P(CommunicatorTest, ManyCallsInARowAndGrowingSizes) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_many_calls(comm, n); });
}

INSTANTIATE_TEST_SUITE_P(Sizes, CommunicatorTest, ::testing::Values(1, 2, 3, 4));

TEST(CommunicatorErrorsTest, SizesThatDoNotFit) { spawn(2, check_size_errors); }

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
