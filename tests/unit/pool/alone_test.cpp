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

  // Issue 26: a 64 MiB key's error printed an underflowed limit (a number
  // near 2^64); now it says the key alone is over the limit.
  try {
    pool.put(std::string(64 << 20, 'k'), "v");
    FAIL() << "a put with a 64 MiB key went through";
  } catch (const dew::runtime::PoolError& e) {
    EXPECT_EQ(e.code(), dew::ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("the key and the frame take 67108877 bytes, over the coordination service's "
                                    "limit of 64 MiB a message; allowed: a short key"));
  }
  try {
    pool.put("big", std::string((64 << 20) + 1, 'v'));
    FAIL() << "a put over the limit went through";
  } catch (const dew::runtime::PoolError& e) {
    EXPECT_THAT(e.what(), HasSubstr("the payload of 67108865 bytes is over the coordination service's limit of "
                                    "67108848 bytes a message (64 MiB with the frame)"));
  }
}

}  // namespace
