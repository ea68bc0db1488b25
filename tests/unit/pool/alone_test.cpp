// A pool of one (no pool variables set: this test process alone): its
// key-value exchange still serves several threads of the process, as the
// devices of a one-process job rendezvous through it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
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

  // Issue 42: an agreement's name or a get's key over the limit ended the
  // pool (the service dropped the frame); refused at the caller, alone too.
  for (const auto& call : std::vector<std::function<void()>>{[&] { pool.agree(std::string(64 << 20, 'n')); },
                                                             [&] { pool.get(std::string(64 << 20, 'k'), 100ms); }}) {
    try {
      call();
      FAIL() << "a 64 MiB name or key went through";
    } catch (const dew::runtime::PoolError& e) {
      EXPECT_EQ(e.code(), dew::ErrorCode::kInvalidArgument);
      EXPECT_THAT(e.what(),
                  HasSubstr("over the coordination service's limit of 64 MiB a message; allowed: a short key"));
    }
  }
  pool.agree("after");  // the pool goes on

  // Alone, all_gather returns its own bytes.
  const auto all = pool.all_gather("mine");
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0], "mine");

  // The same calls without exceptions: each error is a Result's, with its
  // code, and the pool goes on (issue 39: the pool was the one library that
  // threw, with a catch-and-convert around it at every caller).
  auto missing = pool.try_get("never-put", 50ms);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, dew::ErrorCode::kTimeout);
  EXPECT_THAT(missing.error().message, HasSubstr("get('never-put'): no process put it within"));
  auto too_big = pool.try_put("big", std::string((64 << 20) + 1, 'v'));
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.error().code, dew::ErrorCode::kInvalidArgument);
  auto long_name = pool.try_agree(std::string(64 << 20, 'n'));
  ASSERT_FALSE(long_name.ok());
  EXPECT_EQ(long_name.error().code, dew::ErrorCode::kInvalidArgument);
  ASSERT_TRUE(pool.try_put("k", "v").ok());
  auto got = pool.try_get("k", 1s);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got.value(), "v");
  auto gathered = pool.try_all_gather("again");
  ASSERT_TRUE(gathered.ok());
  EXPECT_EQ(gathered.value()[0], "again");
  EXPECT_TRUE(pool.try_agree("after-results").ok());
  auto not_there = pool.check_shared_directory("/nonexistent-dew-directory/below");
  ASSERT_FALSE(not_there.ok());
  EXPECT_EQ(not_there.error().code, dew::ErrorCode::kInvalidArgument);
  EXPECT_THAT(not_there.error().message, HasSubstr("directory '/nonexistent-dew-directory/below' is not usable"));
  auto key = pool.try_compile_cache_key("platform=cpu\n");
  ASSERT_TRUE(key.ok());
  EXPECT_TRUE(key.value().has_value());

  // A process joins one pool: the second join is refused as a value.
  auto twice = dew::runtime::try_join(options);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.error().code, dew::ErrorCode::kInvalidArgument);
  EXPECT_THAT(twice.error().message, HasSubstr("join() was called twice"));
}

TEST(StepWatchdogCreate, AnUnreadableWatchdogIsAnErrorNotAnException) {
  ::setenv("DEW_WATCHDOG", "forever", 1);
  auto watchdog = dew::runtime::StepWatchdog::create();
  EXPECT_THROW({ dew::runtime::StepWatchdog watchdog; }, dew::runtime::PoolError);  // the throwing convenience
  ::unsetenv("DEW_WATCHDOG");
  ASSERT_FALSE(watchdog.ok());
  EXPECT_EQ(watchdog.error().code, dew::ErrorCode::kInvalidArgument);
  EXPECT_THAT(watchdog.error().message, HasSubstr("forever"));
  auto fine = dew::runtime::StepWatchdog::create(std::chrono::milliseconds(60000));
  ASSERT_TRUE(fine.ok());
  EXPECT_EQ(fine.value()->bound(), std::chrono::milliseconds(60000));
}

}  // namespace

namespace {

// all_gather's parts are views into one buffer: they survive the Gathered
// they came from as long as a copy lives, and hold any bytes (NULs included).
TEST(Gathered, PartsAreViewsThatLiveAsLongAsAnyCopy) {
  dew::runtime::Gathered copy;
  {
    const dew::runtime::Gathered parts(std::vector<std::string>{"first", "", std::string("a\0b", 3)});
    ASSERT_EQ(parts.size(), 3u);
    EXPECT_EQ(parts.front(), "first");
    EXPECT_TRUE(parts[1].empty());
    EXPECT_EQ(parts.back(), std::string_view("a\0b", 3));
    EXPECT_THROW((void)parts.at(3), std::out_of_range);
    copy = parts;
  }
  EXPECT_EQ(copy.strings(), (std::vector<std::string>{"first", "", std::string("a\0b", 3)}));
  std::vector<std::string_view> seen(copy.begin(), copy.end());
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_TRUE(dew::runtime::Gathered().empty());
}

}  // namespace
