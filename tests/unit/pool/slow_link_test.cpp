// A slow link, for real: two network namespaces joined by a veth pair, the
// second one's way out shaped by `tc … htb rate 1kbit`, process 0 in the
// first and process 1 in the second. Agreements then take seconds each;
// process 0 must say so, naming process 1, once one has waited past
// DEW_SLOW_SECONDS, here half a second (before, nothing was printed at all: only the 24 h
// patience bounded it). And the other way, a link fast enough but a reply
// slower than the heartbeat timeout. Needs root (namespaces); skipped,
// saying so, without.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <string>
#include <utility>

#include "local_pool.h"

namespace {

using dew::testing::run;
using dew::testing::Spawned;
using ::testing::ContainsRegex;
using namespace std::chrono_literals;

// Two namespaces and the shaped link between them, removed whatever happens
// (deleting a namespace deletes its end of the veth pair, and so the pair).
class ShapedLink {
 public:
  // `rate` (tc's syntax) on the second namespace's way out, or with
  // `first_out`, on the first's (towards process 1).
  explicit ShapedLink(std::string rate = "1kbit", bool first_out = false)
      : rate_(std::move(rate)),
        first_out_(first_out),
        tag_(std::to_string(::getpid() % 100000)),
        first_("dew-slow-a-" + tag_),
        second_("dew-slow-b-" + tag_),
        subnet_("10.251." + std::to_string(::getpid() % 250) + ".") {}
  ~ShapedLink() {
    run({"ip", "netns", "del", first_});
    run({"ip", "netns", "del", second_});
  }
  // Empty when every step worked; else the failing command and its error.
  std::string build() {
    const std::string a = "dwa" + tag_;
    const std::string b = "dwb" + tag_;
    const std::string& shaped = first_out_ ? first_ : second_;
    const std::string& device = first_out_ ? a : b;
    const std::vector<std::vector<std::string>> steps = {
        {"ip", "netns", "add", first_},
        {"ip", "netns", "add", second_},
        {"ip", "link", "add", a, "type", "veth", "peer", "name", b},
        {"ip", "link", "set", a, "netns", first_},
        {"ip", "link", "set", b, "netns", second_},
        {"ip", "-n", first_, "addr", "add", first_address() + "/24", "dev", a},
        {"ip", "-n", second_, "addr", "add", subnet_ + "2/24", "dev", b},
        {"ip", "-n", first_, "link", "set", "lo", "up"},  // process 0 reaches its own service there
        {"ip", "-n", second_, "link", "set", "lo", "up"},
        {"ip", "-n", first_, "link", "set", a, "up"},
        {"ip", "-n", second_, "link", "set", b, "up"},
        {"ip", "netns", "exec", shaped, "tc", "qdisc", "add", "dev", device, "root", "handle", "1:", "htb", "default",
         "10"},
        {"ip", "netns", "exec", shaped, "tc", "class", "add", "dev", device, "parent", "1:", "classid", "1:10", "htb",
         "rate", rate_, "ceil", rate_},
    };
    for (const auto& step : steps) {
      const auto result = run(step);
      if (result.exit_code != 0) return step[0] + " " + step[1] + " " + step[2] + " ...: " + result.err;
    }
    return "";
  }
  std::string first_address() const { return subnet_ + "1"; }
  std::vector<std::string> in_first(const std::vector<std::string>& argv) const { return in(first_, argv); }
  std::vector<std::string> in_second(const std::vector<std::string>& argv) const { return in(second_, argv); }

 private:
  static std::vector<std::string> in(const std::string& name, const std::vector<std::string>& argv) {
    std::vector<std::string> full = {"ip", "netns", "exec", name};
    full.insert(full.end(), argv.begin(), argv.end());
    return full;
  }
  std::string rate_;
  bool first_out_;
  std::string tag_, first_, second_, subnet_;
};

std::map<std::string, std::string> pool_env(int rank, const std::string& coordinator,
                                            std::map<std::string, std::string> settings) {
  settings.insert({{"DEW_PROCESS_ID", std::to_string(rank)},
                   {"DEW_PROCESS_COUNT", "2"},
                   {"DEW_COORDINATOR_ADDRESS", coordinator},
                   {"DEW_POOL_SECRET", dew::testing::kSecret}});
  return settings;
}

TEST(SlowLink, AnAgreementHeldUpByA1KbitLinkIsSaidNamingTheProcessBehindIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  if (run({"ip", "-V"}).exit_code != 0) GTEST_SKIP() << "no ip command (iproute2)";
  ShapedLink link;
  const std::string failed = link.build();
  ASSERT_EQ(failed, "");
  const std::string coordinator = link.first_address() + ":" + std::to_string(dew::testing::free_loopback_port());
  auto env_of = [&](int rank) {
    return pool_env(
        rank, coordinator,
        {{"DEW_SLOW_SECONDS", "0.5"}, {"DEW_JOIN_TIMEOUT_SECONDS", "60"}, {"DEW_HEARTBEAT_TIMEOUT_SECONDS", "60"}});
  };
  Spawned zero(link.in_first({dew::testing::worker(), "hold", "5"}), env_of(0));
  Spawned one(link.in_second({dew::testing::worker(), "hold", "5"}), env_of(1));
  const bool said = zero.wait_for_output("for process 1 (1 of 2 processes arrived)", 60s);
  EXPECT_TRUE(said) << zero.err() << one.err();
  EXPECT_THAT(zero.err(),
              ContainsRegex("\\[0\\] coordination service: (agreement '[a-z.]+'( \\(round [0-9]+\\))?|all_gather round "
                            "[0-9]+) has "
                            "waited [0-9]+\\.[0-9] s for process 1 \\(1 of 2 processes arrived\\)"))
      << zero.err();
  zero.signal(SIGKILL);
  one.signal(SIGKILL);
}

// A reply longer in coming than the heartbeat timeout: an 8 MiB gather reply
// to process 1 over a 16 Mbit/s link takes about 4 s, and the service's
// heartbeats queue behind it on the same connection. Every byte of the
// reply counts as hearing from the service, so process 1 does not take the
// service for lost at the 2 s timeout, and the round completes.
TEST(SlowLink, ABulkReplyLongerThanTheHeartbeatTimeoutDoesNotStarveHeartbeats) {
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  if (run({"ip", "-V"}).exit_code != 0) GTEST_SKIP() << "no ip command (iproute2)";
  ShapedLink link("16mbit", /*first_out=*/true);
  const std::string failed = link.build();
  ASSERT_EQ(failed, "");
  const std::string coordinator = link.first_address() + ":" + std::to_string(dew::testing::free_loopback_port());
  const std::map<std::string, std::string> settings = {{"DEW_HEARTBEAT_TIMEOUT_SECONDS", "2"},
                                                       {"DEW_JOIN_TIMEOUT_SECONDS", "60"}};
  const std::string part = std::to_string(4 << 20);
  Spawned zero(link.in_first({dew::testing::worker(), "gather", part, "1"}), pool_env(0, coordinator, settings));
  Spawned one(link.in_second({dew::testing::worker(), "gather", part, "1"}), pool_env(1, coordinator, settings));
  EXPECT_EQ(one.wait(60s), 0) << one.out() << one.err();
  EXPECT_EQ(zero.wait(60s), 0) << zero.out() << zero.err();
  EXPECT_THAT(one.out(), ::testing::HasSubstr("GATHER ok: 1 rounds of 2 parts of 4194304 bytes"));
  EXPECT_GT(one.seconds(), 3.0) << "the reply came faster than the heartbeat timeout: the test shows nothing";
  EXPECT_THAT(one.err() + zero.err(), ::testing::Not(::testing::HasSubstr("stopped answering")));
}

}  // namespace
