// How a join ends when the coordinator is not what it should be: nothing
// listening, a silent listener, another program, a process 0 that stopped,
// a host that does not resolve, a missing secret, a taken port. Every case
// ends within the join timeout with one line naming the address, the phase
// and what was heard, and exit code 69 (kJoinFailedExitCode).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>

#include "dew/exit_status.h"
#include "local_pool.h"

namespace {

using dew::testing::LocalPool;
using dew::testing::Spawned;
using dew::testing::worker;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

// Rank `rank` of `size` joining the coordinator at 127.0.0.1:port.
std::unique_ptr<Spawned> joiner(int rank, int size, std::uint16_t port, const std::string& join_timeout,
                                std::map<std::string, std::string> extra = {}) {
  extra["DEW_PROCESS_ID"] = std::to_string(rank);
  extra["DEW_PROCESS_COUNT"] = std::to_string(size);
  extra.try_emplace("DEW_COORDINATOR_ADDRESS", "127.0.0.1:" + std::to_string(port));
  extra.try_emplace("DEW_POOL_SECRET", dew::testing::kSecret);
  extra["DEW_JOIN_TIMEOUT_SECONDS"] = join_timeout;
  return std::make_unique<Spawned>(std::vector<std::string>{worker(), "join"}, extra);
}

// A listening socket that never accepts: the kernel completes connections
// into its backlog, and nothing is ever said.
struct SilentListener {
  SilentListener() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
    listen(fd, 16);
    socklen_t length = sizeof address;
    getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
    port = ntohs(address.sin_port);
  }
  ~SilentListener() { close(fd); }
  int fd = -1;
  std::uint16_t port = 0;
};

TEST(Join, ASilentListenerEndsTheJoinAtItsTimeoutWithProgressLines) {
  SilentListener listener;
  auto rank = joiner(1, 2, listener.port, "7");
  ASSERT_EQ(rank->wait(20s), dew::kJoinFailedExitCode) << rank->err();
  EXPECT_GE(rank->seconds(), 6.5);
  EXPECT_LT(rank->seconds(), 10.0);
  const std::string where = "127.0.0.1:" + std::to_string(listener.port);
  EXPECT_THAT(rank->err(),
              HasSubstr("[1] waiting for the coordination service at " + where + " to answer (5 s of 7 s)"));
  EXPECT_THAT(rank->err(), HasSubstr("[1] error: cannot join the pool: the coordinator at " + where +
                                     " accepted the connection but the handshake did not end within 7 s "
                                     "(DEW_JOIN_TIMEOUT_SECONDS): heard nothing"));
  EXPECT_EQ(dew::testing::occurrences(rank->err(), "error"), 1) << rank->err();
}

TEST(Join, AnotherProgramOnThePortIsNamedAtOnce) {
  SilentListener listener;
  std::chrono::steady_clock::time_point answered;
  std::thread server([&] {
    const int connection = accept(listener.fd, nullptr, nullptr);
    const std::string reply = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
    [[maybe_unused]] auto n = send(connection, reply.data(), reply.size(), MSG_NOSIGNAL);
    answered = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(1s);
    close(connection);
  });
  const auto started = std::chrono::steady_clock::now();
  auto rank = joiner(1, 2, listener.port, "30");
  EXPECT_EQ(rank->wait(20s), dew::kJoinFailedExitCode) << rank->err();
  server.join();
  // Timed from the answer, not from the start (slow under the sanitizers): it ends on what it heard, before the
  // other program closes the connection 1 s later.
  const auto ended = started + std::chrono::duration<double>(rank->seconds());
  EXPECT_LT(std::chrono::duration<double>(ended - answered).count(), 0.8);
  EXPECT_THAT(rank->err(), HasSubstr("is not a Dew coordination service: handshake: heard 'HTTP/1.1 400 Bad Request"));
}

TEST(Join, NothingListeningEndsAtTheTimeoutSayingWhatWasTried) {
  const auto port = dew::testing::free_loopback_port();
  auto rank = joiner(1, 2, port, "1");
  ASSERT_EQ(rank->wait(20s), dew::kJoinFailedExitCode) << rank->err();
  EXPECT_LT(rank->seconds(), 3.0);
  const std::string where = "127.0.0.1:" + std::to_string(port);
  EXPECT_THAT(rank->err(), HasSubstr("error: cannot join the pool: cannot reach the coordinator at " + where +
                                     " within 1 s (DEW_JOIN_TIMEOUT_SECONDS): connecting: Connection refused"));
}

// A pool of three whose rank 0 alone is wanted, stopped (SIGSTOP) once it
// listens. The others are pointed at a port where nothing listens, so they
// never reach rank 0's service, however late the kill lands (a rank that
// connected and was then killed would end the pool as a failed process).
struct StoppedProcessZero {
  StoppedProcessZero() {
    zero_alone.ranks[1]->signal(SIGKILL);
    zero_alone.ranks[2]->signal(SIGKILL);
    listening = zero_alone.ranks[0]->wait_for_output("listens on port", 20s);
    zero_alone.ranks[0]->signal(SIGSTOP);
  }
  ~StoppedProcessZero() { zero_alone.ranks[0]->signal(SIGKILL); }
  const std::map<std::string, std::string> elsewhere = {{"DEW_COORDINATOR_ADDRESS", "127.0.0.1:1"}};
  LocalPool zero_alone{3, {"join"}, {{"DEW_LOG_LEVEL", "debug"}}, {{1, elsewhere}, {2, elsewhere}}};
  bool listening = false;
};

TEST(Join, AProcessZeroStoppedBeforeTheOthersJoinedIsNotWaitedForBeyondTheTimeout) {
  StoppedProcessZero zero;
  ASSERT_TRUE(zero.listening) << zero.zero_alone.describe();
  auto rank = joiner(1, 3, zero.zero_alone.port, "2");
  EXPECT_EQ(rank->wait(20s), dew::kJoinFailedExitCode) << rank->err();
  EXPECT_LT(rank->seconds(), 5.0);
  EXPECT_THAT(rank->err(), HasSubstr("did not end within 2 s (DEW_JOIN_TIMEOUT_SECONDS): heard nothing (a silent "
                                     "listener on that port, or process 0 is stopped)"));
}

// The same stop with the join's default 300 s: a service that accepted the
// connection and then says nothing for the heartbeat timeout is named at
// once, not waited for until the join's timeout (it was, 6 of 6).
TEST(Join, AProcessZeroStoppedBeforeTheOthersJoinedIsNamedWithinTheHeartbeatTimeout) {
  StoppedProcessZero zero;
  ASSERT_TRUE(zero.listening) << zero.zero_alone.describe();
  auto rank = joiner(1, 3, zero.zero_alone.port, "300", {{"DEW_HEARTBEAT_TIMEOUT_SECONDS", "2"}});
  EXPECT_EQ(rank->wait(20s), dew::kJoinFailedExitCode) << rank->err();
  EXPECT_LT(rank->seconds(), 5.0);
  EXPECT_THAT(rank->err(), HasSubstr("[1] error: cannot join the pool: process 0 stopped answering during the join: "
                                     "the coordination service at 127.0.0.1:" +
                                     std::to_string(zero.zero_alone.port) +
                                     " accepted the connection, then said nothing for 2.03 s "
                                     "(DEW_HEARTBEAT_TIMEOUT_SECONDS and 10 ms a process of the pool; process 0 "
                                     "stopped or frozen); heard nothing"));
}

TEST(Join, AProcessZeroStoppedDuringTheJoinsAgreementEndsItsPeersAtTheTimeout) {
  // Rank 2 never comes; rank 0 stops once rank 1 has connected and waits in
  // the join's agreement, which a stopped service never answers: rank 1
  // ends soon after the 2 s timeout.
  // Rank 2 is pointed at a port where nothing listens: it can never reach
  // rank 0's service, however late the kill lands (it once connected first
  // on a busy machine, and its loss ended the pool before the stop).
  LocalPool pool(3, {"join"}, {{"DEW_JOIN_TIMEOUT_SECONDS", "2"}, {"DEW_LOG_LEVEL", "debug"}},
                 {{2, {{"DEW_COORDINATOR_ADDRESS", "127.0.0.1:1"}}}});
  pool.ranks[2]->signal(SIGKILL);
  // Both in the join's agreement (a slow machine, a sanitizer: rank 0 once
  // was stopped before its service had answered rank 1's handshake).
  for (int r : {0, 1}) {
    ASSERT_TRUE(pool.ranks[static_cast<std::size_t>(r)]->wait_for_output(
        "[" + std::to_string(r) + "] join: connected to the coordination service", 20s))
        << pool.describe();
  }
  std::this_thread::sleep_for(100ms);
  pool.ranks[0]->signal(SIGSTOP);
  EXPECT_EQ(pool.ranks[1]->wait(20s), dew::kPeerFailedExitCode) << pool.describe();
  EXPECT_LT(pool.ranks[1]->seconds(), 7.0);
  EXPECT_THAT(pool.ranks[1]->err(), HasSubstr("[1] ending: process 0 failed: the coordination service at 127.0.0.1:" +
                                              std::to_string(pool.port) + " stopped answering during the join"));
  pool.ranks[0]->signal(SIGKILL);
}

TEST(Join, ARankThatNeverJoinsIsNamedByEveryOtherOnce) {
  // Rank 2 never joins: pointed at a port where nothing listens, and killed.
  LocalPool pool(3, {"join"}, {{"DEW_JOIN_TIMEOUT_SECONDS", "6"}}, {{2, {{"DEW_COORDINATOR_ADDRESS", "127.0.0.1:1"}}}});
  pool.ranks[2]->signal(SIGKILL);
  EXPECT_EQ(pool.ranks[0]->wait(20s), dew::kPeerFailedExitCode) << pool.describe();
  EXPECT_EQ(pool.ranks[1]->wait(20s), dew::kPeerFailedExitCode) << pool.describe();
  for (int r : {0, 1}) {
    EXPECT_THAT(pool.ranks[static_cast<std::size_t>(r)]->err(),
                HasSubstr("[" + std::to_string(r) +
                          "] ending: process 2 failed: process 2 never joined the pool "
                          "within 6 s (DEW_JOIN_TIMEOUT_SECONDS)"))
        << pool.describe();
  }
  // While it waited, process 0 said who had not come.
  EXPECT_THAT(pool.ranks[0]->err(), HasSubstr("[0] waiting for every process to join the pool (5 s of 6 s): process 2 "
                                              "not connected yet"));
  EXPECT_THAT(pool.ranks[1]->err(), HasSubstr("[1] waiting for every process to join the pool (5 s of 6 s)"));
  EXPECT_THAT(pool.all_output(), ::testing::Not(HasSubstr("error:")));
}

TEST(Join, AHostThatDoesNotResolveIsAnErrorAtOnce) {
  auto rank = joiner(1, 2, 1, "20", {{"DEW_COORDINATOR_ADDRESS", "no-such-host.invalid:29500"}});
  EXPECT_EQ(rank->wait(40s), dew::kJoinFailedExitCode) << rank->err();
  EXPECT_THAT(rank->err(), HasSubstr("cannot join the pool: cannot resolve the coordinator's host "
                                     "'no-such-host.invalid'"));
}

TEST(Join, AMissingSecretIsOneLineAndTheJoinFailedCode) {
  auto rank = joiner(1, 2, 1, "5", {{"DEW_POOL_SECRET", ""}});
  EXPECT_EQ(rank->wait(20s), dew::kJoinFailedExitCode) << rank->err();
  EXPECT_THAT(rank->err(), HasSubstr("[1] error: cannot join the pool: DEW_POOL_SECRET is not set"));
  EXPECT_THAT(rank->err(), ::testing::Not(HasSubstr("terminate")));
  EXPECT_EQ(dew::testing::occurrences(rank->err(), "\n"), 1) << rank->err();
}

TEST(Join, ATakenPortFailsProcessZeroNamingThePort) {
  SilentListener taken;
  auto rank = joiner(0, 2, taken.port, "5");
  EXPECT_EQ(rank->wait(20s), dew::kJoinFailedExitCode) << rank->err();
  EXPECT_THAT(rank->err(),
              HasSubstr("[0] error: cannot join the pool: the coordination service cannot listen on port " +
                        std::to_string(taken.port) + ": Address already in use"));
}

}  // namespace
