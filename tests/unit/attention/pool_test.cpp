// Both sequence-parallel exchanges over pools of real processes: 2 processes
// x 2 devices, 4 x 1 and 4 x 2, every device a Gloo rank over TCP whose
// rendezvous goes through libdew's key-value exchange.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <thread>

#include "process.h"

namespace {

using dew::testing::Spawned;
using ::testing::HasSubstr;
using ::testing::Not;

class AttentionPool : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(AttentionPool, BothExchangesMatchWholeSequenceAttention) {
  const auto [processes, devices] = GetParam();
  const char* worker = std::getenv("DEW_ATTENTION_POOL_WORKER");
  ASSERT_NE(worker, nullptr);
  const std::string port = std::to_string(dew::testing::free_loopback_port());
  std::vector<std::unique_ptr<Spawned>> ranks;
  for (int rank = 0; rank < processes; ++rank) {
    ranks.push_back(
        std::make_unique<Spawned>(std::vector<std::string>{worker, std::to_string(devices)},
                                  std::map<std::string, std::string>{{"DEW_PROCESS_ID", std::to_string(rank)},
                                                                     {"DEW_PROCESS_COUNT", std::to_string(processes)},
                                                                     {"DEW_COORDINATOR_ADDRESS", "127.0.0.1:" + port},
                                                                     {"DEW_POOL_SECRET", std::string(64, 'e')},
                                                                     {"OPENBLAS_NUM_THREADS", "1"}}));
  }
  const int n = processes * devices;
  for (int rank = 0; rank < processes; ++rank) {
    auto& process = *ranks[static_cast<std::size_t>(rank)];
    ASSERT_EQ(process.wait(std::chrono::seconds(300)), 0) << process.out() << process.err();
    EXPECT_THAT(process.out(), Not(HasSubstr("MISMATCH")));
    // 9 cases x 2 exchanges x 2 precisions, each checked on this process's
    // devices, then the tensor 2 x sequence N/2 mesh: in these layouts each
    // process's devices hold one tensor shard, checked for both exchanges.
    EXPECT_EQ(dew::testing::occurrences(process.out(), ": ok"), 38) << process.out();
    EXPECT_EQ(dew::testing::occurrences(process.out(), "CASE tensor-2-x-sequence-" + std::to_string(n / 2) + " shard "),
              2)
        << process.out();
    EXPECT_THAT(process.out(), HasSubstr("ALL OK: " + std::to_string(n) + " devices"));
  }
}

// A process killed while its peers wait for it inside an exchange's
// collective: the pool notices the lost connection and ends every peer within
// seconds, naming the process, instead of leaving them blocked in Gloo.
TEST(AttentionPoolFailure, AKilledProcessEndsItsPeersMidExchange) {
  const char* worker = std::getenv("DEW_ATTENTION_POOL_WORKER");
  ASSERT_NE(worker, nullptr);
  const std::string port = std::to_string(dew::testing::free_loopback_port());
  std::vector<std::unique_ptr<Spawned>> ranks;
  for (int rank = 0; rank < 3; ++rank) {
    ranks.push_back(
        std::make_unique<Spawned>(std::vector<std::string>{worker, "2", "stall", "1"},
                                  std::map<std::string, std::string>{{"DEW_PROCESS_ID", std::to_string(rank)},
                                                                     {"DEW_PROCESS_COUNT", "3"},
                                                                     {"DEW_COORDINATOR_ADDRESS", "127.0.0.1:" + port},
                                                                     {"DEW_POOL_SECRET", std::string(64, 'e')},
                                                                     {"OPENBLAS_NUM_THREADS", "1"}}));
  }
  auto describe = [&ranks] {
    std::string text;
    for (std::size_t r = 0; r < ranks.size(); ++r)
      text += "--- rank " + std::to_string(r) + ":\n" + ranks[r]->out() + ranks[r]->err();
    return text;
  };
  ASSERT_TRUE(ranks[1]->wait_for_output("STALLING", std::chrono::seconds(120))) << describe();
  // The peers are in the third exchange's first collective, waiting for process 1.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ranks[1]->signal(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  for (int r : {0, 2}) {
    auto& peer = *ranks[static_cast<std::size_t>(r)];
    EXPECT_EQ(peer.wait(std::chrono::seconds(10)), 75) << describe();
    EXPECT_THAT(peer.err(), HasSubstr("ending: process 1 failed: process 1 lost its connection")) << describe();
    EXPECT_THAT(peer.out(), Not(HasSubstr("ALL OK")));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_LT(seconds, 5.0) << describe();
  EXPECT_EQ(ranks[1]->wait(std::chrono::seconds(5)), 128 + SIGKILL);
}

INSTANTIATE_TEST_SUITE_P(Layouts, AttentionPool,
                         ::testing::Values(std::make_pair(2, 2), std::make_pair(4, 1), std::make_pair(4, 2)),
                         [](const auto& info) {
                           return std::to_string(info.param.first) + "x" + std::to_string(info.param.second);
                         });

}  // namespace
