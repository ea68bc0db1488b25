// Real pools of real processes on localhost over the TCP coordination
// service: what a user sees when ranks exchange, fail, crash, stall, vanish,
// or when a stranger knocks on the coordinator's port.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <memory>

#include "auth.h"
#include "dew/exit_status.h"
#include "local_pool.h"
#include "wire.h"

namespace {

using dew::testing::LocalPool;
using dew::testing::RawClient;
using dew::testing::Spawned;
using dew::testing::worker;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

TEST(LocalPool, FourProcessesPutGetGatherAndAgree) {
  LocalPool pool(4, {"exchange"});
  const auto codes = pool.wait_all(30s);
  ASSERT_EQ(codes, std::vector<int>({0, 0, 0, 0})) << pool.describe();
  for (int r = 0; r < 4; ++r) {
    const auto& rank = *pool.ranks[static_cast<std::size_t>(r)];
    EXPECT_THAT(rank.out(), HasSubstr("RESULT rank=" + std::to_string(r) + " size=4 source=dew backend=tcp"));
    EXPECT_THAT(rank.out(), HasSubstr("gets=hello from 0|hello from 1|hello from 2|hello from 3"));
    EXPECT_THAT(rank.out(), HasSubstr("gather=rank 0|rank 1|rank 2|rank 3"));
    EXPECT_THAT(rank.out(), HasSubstr("squares=0,1,4,9"));
    EXPECT_THAT(rank.err(), HasSubstr("[" + std::to_string(r) + "] Joined the pool: process " + std::to_string(r) +
                                      " of 4 (dew, tcp)"));
  }
}

TEST(LocalPool, ARankThatThrowsEndsEveryProcessWithinFiveSeconds) {
  LocalPool pool(4, {"throw", "2"});
  const auto codes = pool.wait_all(20s);
  EXPECT_EQ(codes, std::vector<int>({75, 75, 1, 75})) << pool.describe();
  double first = 1e9, last = 0;
  for (auto& rank : pool.ranks) {
    first = std::min(first, rank->seconds());
    last = std::max(last, rank->seconds());
  }
  EXPECT_LT(last - first, 5.0) << pool.describe();
  // Rank 2's error: printed once, with its rank.
  EXPECT_EQ(dew::testing::occurrences(pool.all_output(), "[2] error: uncaught exception: boom from rank 2"), 1)
      << pool.describe();
  for (int r : {0, 1, 3}) {
    EXPECT_THAT(
        pool.ranks[static_cast<std::size_t>(r)]->err(),
        HasSubstr("[" + std::to_string(r) + "] ending: process 2 failed: uncaught exception: boom from rank 2"));
  }
}

TEST(LocalPool, FailExitsWithItsOwnCodeAndPeersWithTheDocumentedOne) {
  LocalPool pool(4, {"fail", "1", "7"});
  EXPECT_EQ(pool.wait_all(20s), std::vector<int>({75, 7, 75, 75})) << pool.describe();
  EXPECT_EQ(dew::testing::occurrences(pool.all_output(), "[1] error: data loader raised on rank 1"), 1);
  EXPECT_THAT(pool.ranks[0]->err(), HasSubstr("[0] ending: process 1 failed: data loader raised on rank 1"));
}

// A device's broken collective waits for the pool's word of the peer that
// failed (Pool::wait_until_ending), not a fixed 2 s sleep: the wait ends when
// the word comes. The processes here hear it inside their wait (their grace
// keeps them alive until their next pool call), about 0.5 s in. An error of
// their own after the word (the collective it broke) is not a failure of
// theirs: they end as the failed one's peers (75), with no error line (the
// rehearsal's devices once published theirs, a second verdict).
TEST(LocalPool, WaitingForThePoolsWordEndsWhenItComesNotAfterTheBound) {
  LocalPool pool(3, {"wait-ending", "2"});
  EXPECT_EQ(pool.wait_all(30s), std::vector<int>({75, 75, 3})) << pool.describe();
  EXPECT_EQ(dew::testing::occurrences(pool.all_output(), "a collective broke after the word"), 0) << pool.describe();
  for (int r : {0, 1}) {
    const std::string out = pool.ranks[static_cast<std::size_t>(r)]->out();
    const auto at = out.find("ENDING heard=1 after=");
    ASSERT_NE(at, std::string::npos) << pool.describe();
    const int after = std::stoi(out.substr(at + std::string("ENDING heard=1 after=").size()));
    EXPECT_GE(after, 300) << pool.describe();   // it waited for the word...
    EXPECT_LT(after, 5000) << pool.describe();  // ...not for the 10 s bound
  }
}

// A stop is told from a failure by its frame's kind, not its words: a
// failure whose message begins as a stop's does ("stopped by ...") is still
// a failure to every peer (it was once said as a stop, at info level).
TEST(LocalPool, AFailureWhoseMessageReadsLikeAStopIsStillAFailure) {
  LocalPool pool(3, {"fail", "1", "7", "stopped by the data loader: the bucket is gone"});
  EXPECT_EQ(pool.wait_all(20s), std::vector<int>({75, 7, 75})) << pool.describe();
  EXPECT_THAT(pool.ranks[0]->err(),
              HasSubstr("[0] ending: process 1 failed: stopped by the data loader: the bucket is gone"))
      << pool.describe();
  EXPECT_THAT(pool.ranks[2]->err(), ::testing::Not(HasSubstr("process 1 was stopped by"))) << pool.describe();
}

// A before-exit hook whose thread is ended by pthread_exit (Python ends a
// thread that takes its lock while the interpreter finalizes) still lets the
// process end with its own code: the unwinding was once swallowed, and the
// process aborted ("FATAL: exception not rethrown", SIGABRT).
TEST(LocalPool, AHookThreadEndedByPthreadExitStillEndsWithTheFailuresCode) {
  LocalPool pool(2, {"fail-hook-exits-thread", "1", "7"});
  EXPECT_EQ(pool.wait_all(20s), std::vector<int>({75, 7})) << pool.describe();
  EXPECT_THAT(pool.all_output(), ::testing::Not(HasSubstr("exception not rethrown"))) << pool.describe();
}

// A failed process never exits 0 (a launcher would count it a success).
TEST(LocalPool, FailWithCodeZeroStillFails) {
  LocalPool pool(2, {"fail", "1", "0"});
  EXPECT_EQ(pool.wait_all(20s), std::vector<int>({75, 1})) << pool.describe();
}

TEST(LocalPool, AFatalSignalIsPublishedThenReRaised) {
  LocalPool pool(4, {"crash", "3"});
  EXPECT_EQ(pool.wait_all(20s), std::vector<int>({75, 75, 75, 128 + SIGSEGV})) << pool.describe();
  EXPECT_THAT(pool.ranks[3]->err(), HasSubstr("[3] error: fatal signal SEGV"));
  EXPECT_THAT(pool.ranks[1]->err(), HasSubstr("[1] ending: process 3 failed: fatal signal SEGV"));
}

TEST(LocalPool, ProcessZeroFailingStillReachesEveryPeer) {
  LocalPool pool(4, {"throw", "0"});
  EXPECT_EQ(pool.wait_all(20s), std::vector<int>({1, 75, 75, 75})) << pool.describe();
  EXPECT_THAT(pool.ranks[2]->err(), HasSubstr("[2] ending: process 0 failed: uncaught exception: boom from rank 0"));
}

TEST(LocalPool, AKilledRankIsNoticedWithinTheHeartbeatTimeout) {
  LocalPool pool(4, {"steps"}, {{"DEW_HEARTBEAT_TIMEOUT_SECONDS", "2"}});
  ASSERT_TRUE(pool.ranks[0]->wait_for_output("READY", 20s)) << pool.describe();
  pool.ranks[2]->signal(SIGKILL);
  const auto codes = pool.wait_all(4s);
  EXPECT_EQ(codes, std::vector<int>({75, 75, 128 + SIGKILL, 75})) << pool.describe();
  EXPECT_THAT(pool.ranks[3]->err(), HasSubstr("[3] ending: process 2 failed: process 2 lost its connection"));
}

TEST(LocalPool, AFrozenRankIsFoundByHeartbeats) {
  // SIGSTOP keeps rank 2's connection open but silent: only heartbeats tell.
  LocalPool pool(4, {"steps"}, {{"DEW_HEARTBEAT_TIMEOUT_SECONDS", "1"}});
  ASSERT_TRUE(pool.ranks[0]->wait_for_output("READY", 20s)) << pool.describe();
  pool.ranks[2]->signal(SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  for (int r : {0, 1, 3}) EXPECT_EQ(pool.ranks[static_cast<std::size_t>(r)]->wait(5s), 75) << pool.describe();
  const double noticed = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  EXPECT_LT(noticed, 3.0);
  EXPECT_THAT(pool.ranks[1]->err(), HasSubstr("process 2 stopped answering: no heartbeat for 1 s"));
  pool.ranks[2]->signal(SIGKILL);
}

// Process 0 frozen (SIGSTOP) while every rank is in the middle of 4 MiB
// gathers: a rank stuck sending its part into full socket buffers, or
// reading a half-received reply, ends within the heartbeat timeout + 2 s,
// as a peer. Before, one stuck in send never ended (its heartbeat thread
// spun a core waiting for the writer) and one stuck mid-reply ended only at
// the failure grace (60 s).
TEST(LocalPool, AFrozenProcess0DuringLargeGathersEndsEveryRankWithinTheHeartbeatBound) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    LocalPool pool(3, {"gather", std::to_string(4 << 20), "100000"}, {{"DEW_HEARTBEAT_TIMEOUT_SECONDS", "2"}});
    ASSERT_TRUE(pool.ranks[1]->wait_for_output("Joined the pool", 20s)) << pool.describe();
    std::this_thread::sleep_for(std::chrono::milliseconds(300 + 200 * attempt));
    pool.ranks[0]->signal(SIGSTOP);
    const auto stopped = std::chrono::steady_clock::now();
    for (int r : {1, 2}) EXPECT_EQ(pool.ranks[static_cast<std::size_t>(r)]->wait(10s), 75) << pool.describe();
    const double ended = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
    EXPECT_LT(ended, 4.0) << pool.describe();
    EXPECT_THAT(pool.ranks[1]->err(), HasSubstr("[1] ending: process 0 failed: ")) << pool.describe();
    pool.ranks[0]->signal(SIGKILL);
    pool.ranks[0]->wait(5s);
  }
}

// A rank paused for less than the heartbeat timeout: its heartbeats arrive
// late but arrive. Process 0 names it as slow, and the agreement held up by
// it says whom it waits for once it has waited DEW_SLOW_SECONDS; the pool
// then goes on. The paused rank does not blame the service for its own pause.
TEST(LocalPool, ASlowRankIsNamedAndTheAgreementItHoldsUpSaysWhomItWaitsFor) {
  LocalPool pool(3, {"steps"}, {{"DEW_HEARTBEAT_TIMEOUT_SECONDS", "4"}, {"DEW_SLOW_SECONDS", "1"}});
  ASSERT_TRUE(pool.ranks[0]->wait_for_output("READY", 20s)) << pool.describe();
  pool.ranks[2]->signal(SIGSTOP);
  std::this_thread::sleep_for(3s);
  pool.ranks[2]->signal(SIGCONT);
  std::this_thread::sleep_for(1s);
  for (auto& rank : pool.ranks) rank->signal(SIGTERM);
  pool.wait_all(10s);
  const std::string zero = pool.ranks[0]->err();
  EXPECT_THAT(zero, ContainsRegex("\\[0\\] coordination service: agreement 'step' \\(round [0-9]+\\) has waited "
                                  "[0-9.]+ s for process 2 \\(2 of 3 processes arrived\\)"))
      << pool.describe();
  EXPECT_THAT(zero, ContainsRegex("\\[0\\] coordination service: process 2 is slow: nothing heard from it for "
                                  "[2-4]\\.[0-9] s \\(heartbeats are due every 1.0 s; it is counted as failed after "
                                  "4.0 s of silence\\)"))
      << pool.describe();
  EXPECT_THAT(pool.all_output(), Not(HasSubstr("stopped answering"))) << pool.describe();
  EXPECT_THAT(pool.ranks[2]->err(), Not(HasSubstr("the coordination service on process 0 is slow"))) << pool.describe();
}

// A process stopped or starved longer than its own heartbeat timeout (1 s
// here; the others' 8 s), then going on: when it wakes, the heartbeats that
// came meanwhile are still unread, and it must take them before it judges
// anyone silent. Before, it often counted the service as lost on waking
// (1,024 processes on a loaded machine: a false failure in 1 of 11
// launches). Process 0 the same way, for the processes it serves.
TEST(LocalPool, AProcessThatWasItselfStoppedDoesNotCountItsPeersAsSilent) {
  for (int stopped : {2, 0}) {
    SCOPED_TRACE("process " + std::to_string(stopped) + " stopped");
    LocalPool pool(3, {"steps"}, {{"DEW_HEARTBEAT_TIMEOUT_SECONDS", "8"}},
                   {{stopped, {{"DEW_HEARTBEAT_TIMEOUT_SECONDS", "1"}}}});
    ASSERT_TRUE(pool.ranks[0]->wait_for_output("READY", 20s)) << pool.describe();
    for (int pause = 0; pause < 3; ++pause) {
      pool.ranks[static_cast<std::size_t>(stopped)]->signal(SIGSTOP);
      std::this_thread::sleep_for(1600ms);
      pool.ranks[static_cast<std::size_t>(stopped)]->signal(SIGCONT);
      std::this_thread::sleep_for(800ms);
    }
    for (auto& rank : pool.ranks) EXPECT_TRUE(rank->running()) << pool.describe();
    for (auto& rank : pool.ranks) rank->signal(SIGTERM);
    pool.wait_all(10s);
    EXPECT_THAT(pool.all_output(), Not(HasSubstr("stopped answering"))) << pool.describe();
  }
}

TEST(LocalPool, AStalledRankIsNamedWhenTheAgreementRunsOutOfPatience) {
  LocalPool pool(4, {"stall", "2", "15"}, {{"DEW_FAILURE_GRACE_SECONDS", "1"}});
  const auto codes = pool.wait_all(10s);
  for (int code : codes) EXPECT_NE(code, -1) << "a rank was still running after 10 s\n" << pool.describe();
  // The late rank failed the pool: everyone ends as its peer, naming it;
  // process 0 published it once for the pool (no rank calls it its own error).
  EXPECT_EQ(codes, std::vector<int>({75, 75, 75, 75})) << pool.describe();
  for (int r : {0, 1, 3}) {
    EXPECT_THAT(pool.ranks[static_cast<std::size_t>(r)]->err(),
                HasSubstr("[" + std::to_string(r) +
                          "] ending: process 2 failed: uncaught exception: agreement "
                          "'checkpoint' ran out of patience after 2 s: process 2 never arrived"))
        << pool.describe();
  }
  EXPECT_THAT(pool.all_output(), Not(HasSubstr("error:")));
  EXPECT_THAT(pool.all_output(), Not(HasSubstr("AGREED")));
}

TEST(LocalPool, TheOthersEndWhenProcessZeroDies) {
  LocalPool pool(4, {"steps"});
  ASSERT_TRUE(pool.ranks[0]->wait_for_output("READY", 20s)) << pool.describe();
  pool.ranks[0]->signal(SIGKILL);
  EXPECT_EQ(pool.wait_all(5s), std::vector<int>({128 + SIGKILL, 75, 75, 75})) << pool.describe();
  EXPECT_THAT(pool.ranks[1]->err(),
              HasSubstr("[1] ending: process 0 failed: lost the coordination service on process 0"));
}

TEST(LocalPool, StrangersAreRefusedAndThePoolGoesOn) {
  namespace wire = dew::runtime::wire;
  ASSERT_TRUE(dew::runtime::auth::ready());
  LocalPool pool(4, {"hold", "3"});
  ASSERT_TRUE(pool.ranks[0]->wait_for_output("READY", 20s)) << pool.describe();

  {  // A client with a wrong MAC: refused with the reason, then closed.
    RawClient client(pool.port);
    ASSERT_TRUE(client.connected());
    auto challenge = client.read_frame();
    ASSERT_TRUE(challenge && challenge->type == wire::Type::kChallenge);
    const std::string nonce = dew::runtime::auth::random_nonce();
    client.send_bytes(wire::encode({wire::Type::kHello,
                                    {wire::encode_u64(1), wire::encode_u64(4), nonce,
                                     dew::runtime::auth::hello_mac("not the secret", challenge->items[0], 1, 4)}}));
    auto answer = client.read_frame();
    ASSERT_TRUE(answer.has_value());
    EXPECT_EQ(answer->type, wire::Type::kRefused);
    EXPECT_THAT(answer->items[0], HasSubstr("wrong MAC"));
    std::string rest;
    EXPECT_TRUE(client.read_until_closed(rest));
  }
  {  // A request before any hello: refused.
    RawClient client(pool.port);
    client.read_frame();
    client.send_bytes(wire::encode({wire::Type::kGet, {wire::encode_u64(1), "greeting.0", wire::encode_u64(10)}}));
    auto answer = client.read_frame();
    ASSERT_TRUE(answer.has_value());
    EXPECT_EQ(answer->type, wire::Type::kRefused);
  }
  {  // Garbage: closed.
    RawClient client(pool.port);
    client.send_bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    std::string got;
    EXPECT_TRUE(client.read_until_closed(got));
  }
  {  // An oversized frame (2 GiB announced): closed without waiting for it.
    RawClient client(pool.port);
    client.send_bytes(std::string("\x7f\xff\xff\xff\x05", 5));
    std::string got;
    EXPECT_TRUE(client.read_until_closed(got));
  }
  {  // Truncated: a frame that stops half-way, then the client hangs up.
    RawClient client(pool.port);
    client.send_bytes(std::string("\x00\x00\x00\x40\x05\x00\x00", 7));
  }
  // A real process with the wrong secret: refused with a line saying why.
  Spawned stranger({worker(), "join"}, {{"DEW_PROCESS_ID", "1"},
                                        {"DEW_PROCESS_COUNT", "4"},
                                        {"DEW_COORDINATOR_ADDRESS", "127.0.0.1:" + std::to_string(pool.port)},
                                        {"DEW_POOL_SECRET", std::string(64, '0')},
                                        {"DEW_JOIN_TIMEOUT_SECONDS", "5"}});
  EXPECT_NE(stranger.wait(20s), 0);
  EXPECT_THAT(stranger.err(), HasSubstr("refused process 1: wrong MAC"));

  // The pool's own ranks went on working.
  EXPECT_EQ(pool.wait_all(30s), std::vector<int>({0, 0, 0, 0})) << pool.describe();
  for (auto& rank : pool.ranks) EXPECT_THAT(rank->out(), HasSubstr("gather=rank 0|rank 1|rank 2|rank 3"));
  EXPECT_THAT(pool.ranks[0]->err(), HasSubstr("refused a connection from 127.0.0.1"));
  // One line for the first stranger; the rest within the second are counted.
  EXPECT_THAT(pool.ranks[0]->err(), HasSubstr("more notices about outside connections held back"));
  EXPECT_LE(dew::testing::occurrences(pool.ranks[0]->err(), "coordination service: "), 3) << pool.ranks[0]->err();
}

TEST(LocalPool, AnUnsharedDirectoryIsRefusedNamingWhoSeesWhat) {
  const auto base = std::filesystem::temp_directory_path() / ("dew-shared-" + std::to_string(getpid()));
  for (int r = 0; r < 4; ++r) std::filesystem::create_directories(base / std::to_string(r));
  std::filesystem::create_directories(base / "one");
  {
    LocalPool pool(4, {"shared", (base / "%r").string()});
    EXPECT_EQ(pool.wait_all(30s), std::vector<int>({3, 3, 3, 3})) << pool.describe();
    EXPECT_THAT(pool.ranks[0]->out(), HasSubstr("is not one directory shared by all 4 processes"));
    EXPECT_THAT(pool.ranks[0]->out(), HasSubstr("process 0 sees the tokens of processes 0"));
    EXPECT_THAT(pool.ranks[0]->out(), HasSubstr("process 3 sees the tokens of processes 3"));
  }
  {
    LocalPool pool(4, {"shared", (base / "one").string()});
    EXPECT_EQ(pool.wait_all(30s), std::vector<int>({0, 0, 0, 0})) << pool.describe();
    EXPECT_THAT(pool.ranks[2]->out(), HasSubstr("SHARED ok"));
    // The tokens are cleaned up.
    EXPECT_TRUE(std::filesystem::is_empty(base / "one"));
  }
  std::filesystem::remove_all(base);
}

TEST(LocalPool, CompileCacheKeyIsSharedOnlyWhenEveryFingerprintMatches) {
  {
    LocalPool pool(4, {"fingerprint"});
    EXPECT_EQ(pool.wait_all(30s), std::vector<int>({0, 0, 0, 0})) << pool.describe();
    const auto key = dew::testing::lines_starting_with(pool.ranks[0]->out(), "KEY ");
    ASSERT_EQ(key.size(), 1u);
    EXPECT_EQ(key[0].size(), 4u + 64u) << key[0];
    for (auto& rank : pool.ranks) EXPECT_THAT(rank->out(), HasSubstr(key[0]));
  }
  {
    LocalPool pool(4, {"fingerprint"}, {},
                   {{2, {{"DEW_ACCELERATOR_FINGERPRINT", "platform=cuda\ngpu.0=H100 sm_90\n"}}}});
    EXPECT_EQ(pool.wait_all(30s), std::vector<int>({0, 0, 0, 0})) << pool.describe();
    for (auto& rank : pool.ranks) EXPECT_THAT(rank->out(), HasSubstr("KEY none"));
    EXPECT_THAT(pool.ranks[0]->err(), HasSubstr("compile cache off"));
    // Both sides of the difference.
    EXPECT_THAT(pool.ranks[0]->err(), HasSubstr("process 2 differs from process 0: gpu.0=H100 sm_90, platform=cuda "
                                                "against process 0's "));
    EXPECT_THAT(pool.ranks[0]->err(), HasSubstr("platform=cpu"));
  }
}

TEST(StepWatchdog, EndsAStepThatOutlivesItsBound) {
  // Not joined, but started as rank 3 (srun, dew launch): the line says so;
  // a bound under a second is printed in milliseconds, not as "0s".
  Spawned process({worker(), "watchdog", "300"}, {{"SLURM_PROCID", "3"}, {"SLURM_STEP_NODELIST", "n[1-2]"}});
  EXPECT_EQ(process.wait(20s), 124) << process.err();
  EXPECT_THAT(process.out(), HasSubstr("STEP 1 done"));
  EXPECT_THAT(process.out(), Not(HasSubstr("STEP 2 done")));
  EXPECT_THAT(process.err(),
              HasSubstr("[3] error: step 2 ran longer than its bound of 300 ms (StepWatchdog, DEW_WATCHDOG)"));
}

// mpirun inside a Slurm allocation: every process inherits the allocation's
// SLURM_PROCID=0, and the pool would join by Open MPI's rank, so the line of
// a failure before joining names that rank, not [0] (the rank precedence is
// identity's, dew/slurm_step.h).
TEST(StepWatchdog, AFailureBeforeJoiningUnderMpirunInAnAllocationNamesOpenMpisRank) {
  Spawned process({worker(), "watchdog", "300"}, {{"SLURM_PROCID", "0"},
                                                  {"SLURM_NTASKS", "1"},
                                                  {"SLURM_STEP_NODELIST", "n1"},
                                                  {"OMPI_COMM_WORLD_RANK", "2"},
                                                  {"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_EQ(process.wait(20s), 124) << process.err();
  EXPECT_THAT(process.err(), HasSubstr("[2] error: step 2 ran longer than its bound"));
  EXPECT_THAT(process.err(), Not(HasSubstr("[0] error")));
}

TEST(LocalPool, ASecretThatIsNot64HexDigitsIsRefusedBeforeJoining) {
  Spawned process({worker(), "join"}, {{"DEW_PROCESS_ID", "1"},
                                       {"DEW_PROCESS_COUNT", "2"},
                                       {"DEW_COORDINATOR_ADDRESS", "127.0.0.1:1"},
                                       {"DEW_POOL_SECRET", "abc"}});
  EXPECT_EQ(process.wait(20s), dew::kJoinFailedExitCode) << process.err();
  EXPECT_THAT(process.err(), HasSubstr("[1] error: cannot join the pool: DEW_POOL_SECRET has 3 characters; allowed: 64 "
                                       "hex digits"));
}

TEST(LocalPool, MalformedVariablesAreNamed) {
  Spawned process({worker(), "join"},
                  {{"DEW_PROCESS_ID", "4"}, {"DEW_PROCESS_COUNT", "4"}, {"DEW_COORDINATOR_ADDRESS", "127.0.0.1:1"}});
  EXPECT_NE(process.wait(20s), 0);
  EXPECT_THAT(process.err(), HasSubstr("DEW_PROCESS_ID=4 is not below DEW_PROCESS_COUNT=4"));
}

// DEW_LOG_LEVEL=debug shows the join's steps, each line behind "[rank] ";
// the default shows none of them; a bad value is one line naming the allowed.
TEST(LocalPool, DebugLevelShowsTheJoinsSteps) {
  LocalPool debug(2, {"join"}, {{"DEW_LOG_LEVEL", "debug"}});
  ASSERT_EQ(debug.wait_all(30s), std::vector<int>({0, 0})) << debug.describe();
  const std::string one = debug.ranks[1]->err();
  EXPECT_THAT(one, HasSubstr("[1] join: identity from dew: DEW_PROCESS_ID and DEW_PROCESS_COUNT are set"));
  EXPECT_THAT(one, HasSubstr("[1] join: coordinator 127.0.0.1:" + std::to_string(debug.port) +
                             " from DEW_COORDINATOR_ADDRESS"));
  EXPECT_THAT(one, HasSubstr("[1] join: connecting to the coordination service at 127.0.0.1:"));
  EXPECT_THAT(debug.ranks[0]->err(), HasSubstr("[0] join: the coordination service listens on port "));

  LocalPool quiet(2, {"join"});
  ASSERT_EQ(quiet.wait_all(30s), std::vector<int>({0, 0})) << quiet.describe();
  EXPECT_THAT(quiet.all_output(), Not(HasSubstr("join: ")));
  EXPECT_THAT(quiet.ranks[1]->err(), HasSubstr("[1] Joined the pool: process 1 of 2 (dew, tcp)"));

  LocalPool errors_only(2, {"join"}, {{"DEW_LOG_LEVEL", "error"}});
  ASSERT_EQ(errors_only.wait_all(30s), std::vector<int>({0, 0})) << errors_only.describe();
  EXPECT_THAT(errors_only.all_output(), Not(HasSubstr("Joined the pool")));
}

// The secret admits anyone who has it: once a process joined, it is gone
// from its environment, so its children (a shell, a subprocess) lack it.
TEST(LocalPool, ThePoolSecretLeavesTheEnvironmentOnceJoined) {
  LocalPool pool(2, {"join"});
  ASSERT_EQ(pool.wait_all(30s), std::vector<int>({0, 0})) << pool.describe();
  for (const auto& rank : pool.ranks) EXPECT_THAT(rank->out(), HasSubstr("SECRET gone")) << pool.describe();
}

TEST(LocalPool, ABadLogLevelIsOneLineNamingTheAllowedValues) {
  Spawned process({worker(), "join"}, {{"DEW_LOG_LEVEL", "loud"}});
  EXPECT_NE(process.wait(20s), 0);  // join() throws: the worker leaves it uncaught
  EXPECT_THAT(process.err(), HasSubstr("DEW_LOG_LEVEL: 'loud' is not allowed; allowed: trace, debug, info, warn, "
                                       "error or off"));
}

}  // namespace

namespace {

// Open MPI's mpirun serves PMIx to its processes (its own PMIx server; our
// client is Debian's libpmix), so a pool under mpirun takes the PMIx path.
TEST(MpirunPool, JoinsThroughOpenMpisPmixServer) {
  if (dew::testing::run({"sh", "-c", "command -v mpirun"}).exit_code != 0) {
    GTEST_SKIP() << "mpirun not installed (openmpi-bin, from scripts/install-deps)";
  }
  const auto run =
      dew::testing::run({"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", worker(), "exchange"}, {},
                        std::chrono::seconds(60));
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_EQ(dew::testing::occurrences(run.out, "size=4 source=pmix backend=pmix+tcp"), 4) << run.out;
  EXPECT_EQ(dew::testing::occurrences(run.out, "gather=rank 0|rank 1|rank 2|rank 3 squares=0,1,4,9"), 4) << run.out;
  EXPECT_THAT(run.err, HasSubstr("[3] Joined the pool: process 3 of 4 (pmix, pmix+tcp)"));

  const auto failed =
      dew::testing::run({"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", worker(), "throw", "2"}, {},
                        std::chrono::seconds(60));
  EXPECT_NE(failed.exit_code, 0);
  EXPECT_LT(failed.seconds, 10.0);
  EXPECT_EQ(dew::testing::occurrences(failed.out + failed.err, "[2] error: uncaught exception: boom from rank 2"), 1)
      << failed.err;
}

}  // namespace
