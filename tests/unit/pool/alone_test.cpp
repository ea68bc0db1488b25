// A pool of one (no pool variables set: this test process alone): its
// key-value exchange still serves several threads of the process, as the
// devices of a one-process job rendezvous through it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "dew/pool.h"

namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

TEST(PoolOfOne, GetWaitsForAnotherThreadsPutAndTimesOutNamingTheKey) {
  dew::runtime::JoinOptions options;
  options.failure_handlers = false;  // gtest keeps its own
  auto pool = dew::runtime::join(options);
  ASSERT_EQ(pool.size(), 1);
  ASSERT_EQ(pool.backend(), "none");

  std::thread later([&pool] {
    std::this_thread::sleep_for(200ms);
    pool.put("device-1/address", "127.0.0.1:4242");
  });
  const auto asked = std::chrono::steady_clock::now();
  EXPECT_EQ(pool.get("device-1/address", 10s), "127.0.0.1:4242");
  EXPECT_GE(std::chrono::steady_clock::now() - asked, 150ms);  // it waited for the put
  later.join();

  try {
    pool.get("never-put", 100ms);
    FAIL() << "get of a key nobody puts returned";
  } catch (const dew::runtime::PoolError& e) {
    EXPECT_THAT(e.what(), HasSubstr("get('never-put'): no process put it within"));
  }
}

}  // namespace
