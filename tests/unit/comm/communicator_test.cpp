// The Gloo communicator with every rank a thread of this process over real
// loopback TCP, rendezvous through the in-process stand-in store: each
// collective for groups of 1, 2, 3 and 4, and its errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <barrier>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.h"
#include "dew/comm.h"
#include "expect_error.h"
#include "sigpipe.h"

namespace {

using dew::error_code_name;
using dew::ErrorCode;
using dew::comm::Communicator;
using dew::comm::GlooOptions;
using dew::comm::KeyValue;
using ::testing::HasSubstr;
using namespace dew::comm::testing;

// Runs body(communicator) on `size` threads, one Gloo rank each.
void spawn(int size, const std::function<void(Communicator&)>& body, const std::string& prefix = "test") {
  KeyValue store = dew::comm::local_key_value();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      GlooOptions options;
      options.rank = rank;
      options.size = size;
      options.store = store;
      options.prefix = prefix;
      auto comm = dew::comm::make_gloo_communicator(options);
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

TEST_P(CommunicatorTest, AllReduceSumsInRankOrderAndAgreesOnEveryRank) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_all_reduce(comm, n, /*rank_order=*/true); });
}

// Past one segment of the two-rank reduce-scatter (256 KiB) and not a
// multiple of it: the same bits as the rank-order sum, float and double.
TEST_P(CommunicatorTest, LargeReduceScattersAndAllReducesSumInRankOrder) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) {
    const std::size_t chunk = 200003;
    std::vector<float> send(chunk * std::size_t(n)), recv(chunk);
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = float(comm.rank() + 1) * 0.37f + float(i % 1000) * 1e-3f;
    ASSERT_TRUE(comm.reduce_scatter(std::span<const float>(send), std::span<float>(recv)).ok());
    for (std::size_t i = 0; i < chunk; i += 997) {
      float expected = 0;
      for (int r = 0; r < n; ++r) {
        expected += float(r + 1) * 0.37f + float((std::size_t(comm.rank()) * chunk + i) % 1000) * 1e-3f;
      }
      ASSERT_EQ(recv[i], expected) << "element " << i;
    }
    std::vector<double> data(chunk * 2 + 1);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = double(comm.rank()) * 0.1 + double(i) * 1e-7;
    ASSERT_TRUE(comm.all_reduce(std::span<double>(data)).ok());
    for (std::size_t i = 0; i < data.size(); i += 1009) {
      double expected = 0;
      for (int r = 0; r < n; ++r) expected += double(r) * 0.1 + double(i) * 1e-7;
      ASSERT_EQ(data[i], expected) << "element " << i;
    }
  });
}

// Three or more ranks run the all-reduce as a chain of 1 MiB segments:
// past three segments and not a multiple of one, every element of a float
// sum has the rank-order bits on every rank (a ring's order would differ);
// so does every element of a reduce-scatter past one segment.
TEST_P(CommunicatorTest, MultiSegmentFloatAllReduceAndReduceScatterHaveRankOrderBitsEverywhere) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) {
    const std::size_t length = 3 * 262144 + 12345;
    const auto value = [](int rank, std::size_t i) {
      return float(rank + 1) * 0.37f + float(i % 1013) * 1e-3f + float(rank * rank) * 1e-5f;
    };
    std::vector<float> data(length);
    for (std::size_t i = 0; i < length; ++i) data[i] = value(comm.rank(), i);
    ASSERT_TRUE(comm.all_reduce(std::span<float>(data)).ok());
    std::size_t wrong = 0, first_wrong = length;
    for (std::size_t i = 0; i < length; ++i) {
      float expected = 0;
      for (int r = 0; r < n; ++r) expected += value(r, i);
      if (data[i] != expected && wrong++ == 0) first_wrong = i;
    }
    EXPECT_EQ(wrong, 0u) << "first at element " << first_wrong << " on rank " << comm.rank();
    // The reduce-scatter's segments (equal, at least 1 MiB past two ranks):
    // a chunk of two and a half, every element in rank order.
    const std::size_t chunk = 655360;
    std::vector<float> send(chunk * std::size_t(n)), mine(chunk);
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = value(comm.rank(), i);
    ASSERT_TRUE(comm.reduce_scatter(std::span<const float>(send), std::span<float>(mine)).ok());
    wrong = 0;
    for (std::size_t i = 0; i < chunk; ++i) {
      float expected = 0;
      for (int r = 0; r < n; ++r) expected += value(r, std::size_t(comm.rank()) * chunk + i);
      if (mine[i] != expected && wrong++ == 0) first_wrong = i;
    }
    EXPECT_EQ(wrong, 0u) << "reduce-scatter: first at element " << first_wrong << " on rank " << comm.rank();
  });
}

// In place: recv is this rank's own chunk of send, as NCCL allows.
TEST_P(CommunicatorTest, ReduceScatterInPlaceSumsInRankOrder) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) {
    const std::size_t chunk = 300007;
    const auto value = [](int rank, std::size_t i) { return float(rank + 1) * 0.37f + float(i % 997) * 1e-3f; };
    std::vector<float> data(chunk * std::size_t(n));
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = value(comm.rank(), i);
    const std::span<float> mine(data.data() + std::size_t(comm.rank()) * chunk, chunk);
    ASSERT_TRUE(comm.reduce_scatter(std::span<const float>(data), mine).ok());
    for (std::size_t i = 0; i < chunk; i += 101) {
      float expected = 0;
      for (int r = 0; r < n; ++r) expected += value(r, std::size_t(comm.rank()) * chunk + i);
      ASSERT_EQ(mine[i], expected) << "element " << i;
    }
  });
}

TEST_P(CommunicatorTest, BroadcastFromEveryRoot) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_broadcast(comm, n); });
}

TEST_P(CommunicatorTest, ManyCallsInARowAndGrowingSizes) {
  spawn(GetParam(), [n = GetParam()](Communicator& comm) { check_many_calls(comm, n); });
}

INSTANTIATE_TEST_SUITE_P(Sizes, CommunicatorTest, ::testing::Values(1, 2, 3, 4, 5));

TEST(CommunicatorErrorsTest, SizesThatDoNotFit) { spawn(2, check_size_errors); }

// A rank that leaves instead of joining a large all-reduce: the others end
// with an error naming the collective, not a hang.
TEST(CommunicatorErrorsTest, PeerGoneDuringAllReduceIsAnErrorNotAHang) {
  KeyValue store = dew::comm::local_key_value();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(3);
  const auto start = std::chrono::steady_clock::now();
  // Rank 2 leaves only once every rank is connected: leaving earlier made
  // another rank's connect fail instead (a flake on CI), not its all_reduce.
  std::barrier connected(3);
  for (int rank = 0; rank < 3; ++rank) {
    threads.emplace_back([&, rank] {
      GlooOptions options;
      options.rank = rank;
      options.size = 3;
      options.store = store;
      options.timeout = std::chrono::seconds(20);
      auto comm = dew::comm::make_gloo_communicator(options);
      connected.arrive_and_wait();
      ASSERT_TRUE(comm.ok()) << comm.error().message;
      if (rank == 2) return;  // its connections close with it
      std::vector<float> data(3 * 262144, 1.0f);
      const auto done = comm.value()->all_reduce(std::span<float>(data));
      ASSERT_FALSE(done.ok());
      errors[std::size_t(rank)] = done.error().message;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(errors[std::size_t(rank)], HasSubstr("all_reduce on rank " + std::to_string(rank) + " of 3 failed"));
    EXPECT_EQ(errors[std::size_t(rank)].find('\n'), std::string::npos) << "one line";
  }
}

// A store in a directory, for ranks that are separate processes: put
// writes a file and renames it into place, get polls for it.
KeyValue directory_key_value(const std::filesystem::path& dir) {
  KeyValue kv;
  kv.put = [dir](const std::string& key, const std::vector<char>& value) -> dew::Result<dew::Done> {
    const auto name = dir / std::to_string(std::hash<std::string>{}(key));
    {
      std::ofstream out(name.string() + ".tmp", std::ios::binary);
      out.write(value.data(), std::streamsize(value.size()));
    }
    std::filesystem::rename(name.string() + ".tmp", name);
    return dew::Done{};
  };
  kv.get = [dir](const std::string& key) -> dew::Result<std::vector<char>> {
    const auto name = dir / std::to_string(std::hash<std::string>{}(key));
    for (int tries = 0; tries < 5000; ++tries) {
      std::ifstream in(name, std::ios::binary);
      if (in) return std::vector<char>(std::istreambuf_iterator<char>(in), {});
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return dew::timeout_error("no key " + key);
  };
  return kv;
}

// One rank in a child process with SIGPIPE at its default action, as in a
// user's program. Rank 1 takes part in `rounds` small all-to-alls and exits
// normally; rank 0 goes on with more, so it writes to a peer that has closed
// (Gloo writes with writev, which raises SIGPIPE), and exits 3 at the first
// error, as a failing rank does.
pid_t start_rank(int rank, const std::filesystem::path& dir, int rounds) {
  const pid_t child = fork();
  if (child != 0) return child;
  std::signal(SIGPIPE, SIG_DFL);
  GlooOptions options;
  options.rank = rank;
  options.size = 2;
  options.store = directory_key_value(dir);
  options.timeout = std::chrono::seconds(5);
  auto comm = dew::comm::make_gloo_communicator(options);
  if (!comm.ok()) _exit(11);
  std::vector<std::byte> send(64), recv(64);
  for (int round = 0; round < rounds; ++round) {
    if (!comm.value()->all_to_all_bytes(send, recv).ok()) _exit(3);
  }
  _exit(rank == 0 ? 12 : 0);
}

// The rank that goes on must end with its own exit code, never of SIGPIPE.
TEST(CommunicatorErrorsTest, ARankWritingToAClosedPeerEndsWithItsOwnCodeNotSigpipe) {
  for (int run = 0; run < 50; ++run) {
    char pattern[] = "/tmp/dew-comm-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    const std::filesystem::path dir = pattern;
    const pid_t writer = start_rank(0, dir, 1000000);
    const pid_t peer = start_rank(1, dir, 200);
    int status = 0;
    waitpid(peer, &status, 0);
    waitpid(writer, &status, 0);
    std::filesystem::remove_all(dir);
    ASSERT_FALSE(WIFSIGNALED(status)) << "run " << run << ": rank 0 died of " << strsignal(WTERMSIG(status));
    ASSERT_EQ(WEXITSTATUS(status), 3) << "run " << run;
  }
}

// What Gloo does when a peer has closed, in a child process with SIGPIPE at
// its default action: a writev to the closed connection inside NoSigpipe
// fails with EPIPE and the process exits with its own code (3); afterwards
// the thread's mask is as before and no SIGPIPE is left pending.
TEST(NoSigpipeTest, AWriteToAClosedPeerFailsWithEpipeAndTheProcessExitsWithItsOwnCode) {
  for (int run = 0; run < 50; ++run) {
    const pid_t child = fork();
    if (child == 0) {
      std::signal(SIGPIPE, SIG_DFL);
      int ends[2];
      if (socketpair(AF_UNIX, SOCK_STREAM, 0, ends) != 0) _exit(10);
      ::close(ends[1]);
      char byte = 'x';
      iovec iov{&byte, 1};
      int error = 0;
      {
        const dew::comm::NoSigpipe no_sigpipe;
        if (writev(ends[0], &iov, 1) < 0) error = errno;
        if (writev(ends[0], &iov, 1) < 0) error = errno;
      }
      sigset_t mask, pending;
      pthread_sigmask(SIG_SETMASK, nullptr, &mask);
      sigpending(&pending);
      if (error != EPIPE) _exit(11);
      if (sigismember(&mask, SIGPIPE) || sigismember(&pending, SIGPIPE)) _exit(12);
      _exit(3);
    }
    int status = 0;
    waitpid(child, &status, 0);
    ASSERT_FALSE(WIFSIGNALED(status)) << "run " << run << ": died of " << strsignal(WTERMSIG(status));
    ASSERT_EQ(WEXITSTATUS(status), 3) << "run " << run;
  }
}

// Gloo's device thread writes queued sends when the socket drains: it must
// start with SIGPIPE blocked, and the caller's own mask must be untouched.
TEST(NoSigpipeTest, GloosOwnThreadsStartWithSigpipeBlocked) {
  const auto threads = [] {
    std::set<std::string> names;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
      names.insert(task.path().filename().string());
    }
    return names;
  };
  const auto before = threads();
  KeyValue store = dew::comm::local_key_value();
  GlooOptions options;
  options.store = store;
  auto comm = dew::comm::make_gloo_communicator(options);
  ASSERT_TRUE(comm.ok()) << comm.error().message;
  int started = 0;
  for (const auto& tid : threads()) {
    if (before.count(tid)) continue;
    std::ifstream status("/proc/self/task/" + tid + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("SigBlk:", 0) != 0) continue;
      const unsigned long long blocked = std::stoull(line.substr(7), nullptr, 16);
      EXPECT_NE(blocked & (1ULL << (SIGPIPE - 1)), 0u) << "thread " << tid << ": " << line;
      ++started;
    }
  }
  EXPECT_GE(started, 1) << "Gloo's device thread";
  sigset_t mask;
  pthread_sigmask(SIG_SETMASK, nullptr, &mask);
  EXPECT_FALSE(sigismember(&mask, SIGPIPE)) << "the caller's mask is restored";
}

TEST(CommunicatorErrorsTest, BadRankAndMissingPeer) {
  GlooOptions options;
  options.rank = 2;
  options.size = 2;
  options.store = dew::comm::local_key_value();
  EXPECT_EQ(dew::testing::invalid_argument_of(dew::comm::make_gloo_communicator(options)),
            "gloo: rank 2 of 2 is not allowed; allowed: 0 <= rank < size, size >= 1");
  // Rank 1 never comes: rank 0's rendezvous ends with an error, not a hang.
  options.rank = 0;
  options.store = dew::comm::local_key_value(std::chrono::milliseconds(300));
  const auto r = dew::comm::make_gloo_communicator(options);
  ASSERT_FALSE(r.ok());
  // The store's own kTimeout (rank 1's address never came), carried through
  // Gloo's rendezvous.
  EXPECT_EQ(r.error().code, ErrorCode::kTimeout) << error_code_name(r.error().code) << ": " << r.error().message;
  EXPECT_EQ(r.error().message.find('\n'), std::string::npos) << "one line";
}

// A store's error keeps its code through Gloo's rendezvous (it used to come
// back as kUnavailable, or kTimeout when its text said "timed out").
TEST(CommunicatorErrorsTest, TheStoresErrorCodeComesThroughTheRendezvous) {
  GlooOptions options;
  options.rank = 0;
  options.size = 2;
  options.store =
      KeyValue{[](const std::string&, const std::vector<char>&) -> dew::Result<dew::Done> { return dew::Done{}; },
               [](const std::string& key) -> dew::Result<std::vector<char>> {
                 return dew::Error{ErrorCode::kPermissionDenied, "the pool's secret is wrong for " + key};
               }};
  const auto r = dew::comm::make_gloo_communicator(options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kPermissionDenied) << r.error().message;
  EXPECT_THAT(r.error().message,
              ::testing::HasSubstr("gloo: rank 0 of 2 could not connect: the pool's secret is wrong"));
  options.store.get = [](const std::string&) -> dew::Result<std::vector<char>> {
    return dew::timeout_error("the peer did not answer in time");
  };
  EXPECT_EQ(dew::comm::make_gloo_communicator(options).error().code, ErrorCode::kTimeout);
  // A put the store refuses (the pool ending under it) is said with its code too.
  options.store.put = [](const std::string&, const std::vector<char>&) -> dew::Result<dew::Done> {
    return dew::Error{ErrorCode::kPeerFailed, "process 1 failed: out of memory"};
  };
  const auto refused = dew::comm::make_gloo_communicator(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::kPeerFailed) << refused.error().message;
}

}  // namespace
