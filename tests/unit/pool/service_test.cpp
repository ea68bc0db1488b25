// The coordination service under the loads and faults a real pool meets:
// short-timeout polling racing puts, coordinators that never answer, file
// descriptors running out, payloads over the frame limit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "local_pool.h"

namespace {

using dew::testing::LocalPool;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

// Each get's 1 ms timer expires while, or just after, the put that answers it
// arrives: the service must neither answer twice nor touch a waiter twice.
// Under ASan a use-after-free here stops process 0 at once.
TEST(CoordinationService, ShortTimeoutGetsRacingPutsForThousandsOfRounds) {
  for (int size : {2, 4}) {
    LocalPool pool(size, {"race", "3000"});
    const auto codes = pool.wait_all(120s);
    ASSERT_EQ(codes, std::vector<int>(static_cast<std::size_t>(size), 0)) << pool.describe();
    for (int r = 1; r < size; ++r) {
      EXPECT_THAT(pool.ranks[static_cast<std::size_t>(r)]->out(),
                  HasSubstr("RACE rank " + std::to_string(r) + " read 3000 keys after "));
    }
  }
}

}  // namespace

namespace {

// CPU seconds (user + system) a process has used, from /proc/PID/stat.
double cpu_seconds(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

TEST(CoordinationService, RunningOutOfFileDescriptorsDoesNotSpinOrFloodTheLog) {
  const auto port = dew::testing::free_loopback_port();
  std::vector<std::unique_ptr<dew::testing::Spawned>> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    std::map<std::string, std::string> env{{"DEW_PROCESS_ID", std::to_string(rank)},
                                           {"DEW_PROCESS_COUNT", "2"},
                                           {"DEW_COORDINATOR_ADDRESS", "127.0.0.1:" + std::to_string(port)},
                                           {"DEW_POOL_SECRET", dew::testing::kSecret}};
    // Process 0 with 64 file descriptors, as under a low `ulimit -n`.
    const std::string limit = rank == 0 ? "ulimit -n 64; " : "";
    ranks.push_back(std::make_unique<dew::testing::Spawned>(
        std::vector<std::string>{"sh", "-c", limit + "exec \"$0\" hold 4", dew::testing::worker()}, env));
  }
  ASSERT_TRUE(ranks[0]->wait_for_output("READY", 20s)) << ranks[0]->err() << ranks[1]->err();
  std::vector<std::unique_ptr<dew::testing::RawClient>> idle;
  for (int i = 0; i < 100; ++i) idle.push_back(std::make_unique<dew::testing::RawClient>(port));
  std::this_thread::sleep_for(300ms);
  const double before = cpu_seconds(ranks[0]->pid());
  std::this_thread::sleep_for(1500ms);
  const double used = cpu_seconds(ranks[0]->pid()) - before;
  EXPECT_LT(used, 0.4) << "process 0 used " << used << " CPU seconds in 1.5 s with its descriptors gone";
  idle.clear();
  EXPECT_EQ(ranks[0]->wait(30s), 0) << ranks[0]->err();
  EXPECT_EQ(ranks[1]->wait(30s), 0) << ranks[1]->err();
  EXPECT_THAT(ranks[1]->out(), HasSubstr("gather=rank 0|rank 1"));
  const std::string log = ranks[0]->err();
  EXPECT_THAT(log, HasSubstr("cannot accept connections: Too many open files"));
  EXPECT_LE(dew::testing::occurrences(log, "coordination service: "), 15) << log;
}

TEST(CoordinationService, AGatherOverTheMessageLimitIsRefusedAtTheCallerNamingTheSize) {
  LocalPool pool(2, {"gather", std::to_string((64 << 20) + 1), "1"});
  EXPECT_EQ(pool.wait_all(60s), std::vector<int>({3, 3})) << pool.describe();
  for (const auto& rank : pool.ranks) {
    EXPECT_THAT(rank->out(), HasSubstr("GATHER refused: all_gather round 0: the payload of 67108865 bytes is over the "
                                       "coordination service's limit of "));
  }
  EXPECT_THAT(pool.all_output(), Not(HasSubstr("lost")));
}

TEST(CoordinationService, LargeGathersArriveWholeInRankOrder) {
  LocalPool pool(4, {"gather", std::to_string(3 << 20), "3"});
  EXPECT_EQ(pool.wait_all(60s), std::vector<int>({0, 0, 0, 0})) << pool.describe();
  for (const auto& rank : pool.ranks)
    EXPECT_THAT(rank->out(), HasSubstr("GATHER ok: 3 rounds of 4 parts of 3145728 bytes"));
}

}  // namespace
