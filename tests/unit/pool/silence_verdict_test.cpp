// The silence verdict (pool/silence_verdict.h): when the service counts a
// process, or a process the service, as lost for not being heard.
#include "silence_verdict.h"

#include <gtest/gtest.h>

namespace dew::runtime {
namespace {

using namespace std::chrono_literals;

// A 10 s timeout, looked at every 2.5 s.
SilenceFacts facts(std::chrono::milliseconds since_heard, std::chrono::milliseconds since_last_look = 2500ms,
                   std::size_t bytes_unread = 0) {
  return SilenceFacts{since_heard, since_last_look, 2500ms, 10s, bytes_unread};
}

TEST(SilenceVerdict, APeerUnheardForTheTimeoutByAWatcherOnTimeIsLost) {
  EXPECT_TRUE(lost_for_silence(facts(10001ms)));
  EXPECT_TRUE(lost_for_silence(facts(60s, 5000ms)));  // a look up to two intervals late is on time
  EXPECT_FALSE(lost_for_silence(facts(10s)));
  EXPECT_FALSE(lost_for_silence(facts(2600ms)));
}

// 1,024 processes on two cores: the watcher's thread ran 11 s late, and the
// peer's heartbeats are in its socket, not yet taken by its reader.
TEST(SilenceVerdict, AWatcherThatWasItselfStoppedOrStarvedJudgesAtItsNextLook) {
  EXPECT_FALSE(lost_for_silence(facts(12s, 11s)));
  EXPECT_FALSE(lost_for_silence(facts(12s, 5001ms)));
  EXPECT_TRUE(lost_for_silence(facts(12s + 2500ms, 2500ms)));  // the next look, still nothing
}

TEST(SilenceVerdict, BytesWaitingUnreadInTheSocketAreThePeerHeard) {
  EXPECT_FALSE(lost_for_silence(facts(12s, 2500ms, 48)));
  EXPECT_TRUE(lost_for_silence(facts(12s, 2500ms, 0)));
}

// A joining process allows the service 10 ms for each process of the pool
// besides the heartbeat timeout: it answers the hellos one at a time.
TEST(SilenceVerdict, TheJoinsBoundGrowsWithThePool) {
  EXPECT_EQ(handshake_silence_bound(10s, 2), 10020ms);
  EXPECT_EQ(handshake_silence_bound(10s, 1024), 20240ms);
  EXPECT_EQ(handshake_silence_bound(2s, 0), 2010ms);
}

}  // namespace
}  // namespace dew::runtime
