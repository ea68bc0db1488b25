// A real pool member for the tests and benchmarks: joins through libdew and
// plays one scenario. Lines the tests read start with a word in capitals.
//
//   pool_worker exchange            put/get, all_gather, agreements
//   pool_worker throw R             rank R throws at step 3 of a step loop
//   pool_worker fail R CODE         rank R calls pool.fail(..., CODE) at step 3
//   pool_worker fail R CODE MESSAGE rank R calls pool.fail(MESSAGE, CODE) at step 3
//   pool_worker crash R             rank R gets SIGSEGV at step 3
//   pool_worker wait-ending R       rank R fails 0.5 s after an agreement; the
//                                   others wait_until_ending(10 s) and print
//                                   ENDING heard=B after=MS, then fail
//                                   with code 9 (they end 75 all the same)
//   pool_worker steps               steps of agree("step") until killed
//   pool_worker stall R SECONDS     rank R sleeps before agree("checkpoint"), patience 2 s
//   pool_worker hold SECONDS        join, print READY, sleep, then exchange
//   pool_worker shared DIR          require_shared_directory(DIR with %r = rank)
//   pool_worker fingerprint         compile_cache_key()
//   pool_worker watchdog MS         one step longer than a StepWatchdog of MS
//   pool_worker race ROUNDS         rank 0 puts a key every 0.3-1.2 ms; the
//                                   others poll each with 1 ms gets and retry
//   pool_worker gather BYTES ROUNDS every rank all_gathers BYTES bytes, ROUNDS times
//   pool_worker rounds BYTES ROUNDS rounds of agree + a BYTES-byte all_gather;
//                                   process 0 prints each round's milliseconds
//   pool_worker join                join and leave (benchmarks)
//   pool_worker start               exit before joining (the benchmarks' baseline)
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

#include "dew/pool.h"

namespace {

using dew::runtime::Pool;
using namespace std::chrono_literals;

void line(const std::string& text) { std::cout << text << std::endl; }

int exchange(Pool& pool) {
  const int r = pool.rank();
  const int n = pool.size();
  pool.put("greeting." + std::to_string(r), "hello from " + std::to_string(r));
  pool.agree("put");
  std::string gets;
  for (int peer = 0; peer < n; ++peer) {
    gets += (peer ? "|" : "") + pool.get("greeting." + std::to_string(peer), 10s);
  }
  std::string gathered;
  const auto all = pool.all_gather("rank " + std::to_string(r) + std::string(static_cast<std::size_t>(r) * 1000, 'x'));
  for (const auto part : all) (gathered += gathered.empty() ? "" : "|") += part.substr(0, part.find('x'));
  // A second gather round must not see the first's bytes.
  const auto again = pool.all_gather(std::to_string(r * r));
  std::string squares;
  for (const auto part : again) (squares += squares.empty() ? "" : ",") += part;
  for (int i = 0; i < 3; ++i) pool.agree("loop");
  line("RESULT rank=" + std::to_string(r) + " size=" + std::to_string(n) +
       " source=" + std::string(dew::runtime::source_name(pool.identity().source)) + " backend=" + pool.backend() +
       " local=" + std::to_string(pool.identity().local_rank) + "/" + std::to_string(pool.identity().local_size) +
       " gets=" + gets + " gather=" + gathered + " squares=" + squares);
  return 0;
}

// The benchmarks time a failure from this line (wall clock: another
// process reads it).
void failing_now() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  line("FAILING at " + std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()));
}

// Steps of one agreement each; `at_step3` runs on `rank` at step 3.
template <typename F>
int steps(Pool& pool, int rank, F at_step3) {
  for (int step = 0;; ++step) {
    if (step == 1 && pool.rank() == 0) line("READY");
    if (step == 3 && pool.rank() == rank) at_step3();
    pool.agree("step");
    std::this_thread::sleep_for(20ms);
  }
}

// Short-timeout gets racing puts: the timeouts expire while (or just after)
// the put that answers them arrives, round after round.
int race(Pool& pool, int rounds) {
  if (pool.rank() == 0) {
    for (int round = 0; round < rounds; ++round) {
      pool.put("race." + std::to_string(round), std::to_string(round));
      std::this_thread::sleep_for(std::chrono::microseconds(300 + (round * 7919) % 900));
    }
  } else {
    long timeouts = 0;
    for (int round = 0; round < rounds; ++round) {
      const std::string key = "race." + std::to_string(round);
      for (;;) {
        try {
          if (pool.get(key, 1ms) != std::to_string(round)) {
            line("RACE wrong value for " + key);
            return 1;
          }
          break;
        } catch (const dew::runtime::PoolError& error) {
          if (error.code() != dew::ErrorCode::kTimeout) throw;
          ++timeouts;
        }
      }
    }
    line("RACE rank " + std::to_string(pool.rank()) + " read " + std::to_string(rounds) + " keys after " +
         std::to_string(timeouts) + " timeouts");
  }
  pool.agree("race done");
  return 0;
}

// A line of /proc/self/status in kB ("VmRSS", "VmHWM").
long status_kb(const std::string& name) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(name + ":", 0) == 0) return std::stol(line.substr(name.size() + 1));
  }
  return -1;
}

// Large all_gathers: each part is the rank's byte repeated; a refusal is
// caught and printed, as a program that falls back would. Prints the
// resident memory before the first round and its peak after the last
// (bench/pool --case gather-memory reads them).
int gather(Pool& pool, std::size_t bytes, int rounds) {
  const long idle_kb = status_kb("VmRSS");
  for (int round = 0; round < rounds; ++round) {
    try {
      const auto parts = pool.all_gather(std::string(bytes, static_cast<char>('a' + pool.rank() % 26)));
      for (int r = 0; r < pool.size(); ++r) {
        const auto& part = parts[static_cast<std::size_t>(r)];
        if (part.size() != bytes || part.find_first_not_of(static_cast<char>('a' + r % 26)) != std::string::npos) {
          line("GATHER wrong part from rank " + std::to_string(r));
          return 1;
        }
      }
    } catch (const dew::runtime::PoolError& error) {
      line(std::string("GATHER refused: ") + error.what());
      return 3;
    }
  }
  line("GATHER ok: " + std::to_string(rounds) + " rounds of " + std::to_string(pool.size()) + " parts of " +
       std::to_string(bytes) + " bytes");
  line("MEMORY idle_kb=" + std::to_string(idle_kb) + " peak_kb=" + std::to_string(status_kb("VmHWM")));
  return 0;
}

// The service's round trip at scale: an agreement then a small all_gather,
// ROUNDS times after one uncounted round; process 0 prints every round's
// time (bench/pool --case round reads them) and its memory.
int rounds(Pool& pool, std::size_t bytes, int count) {
  const std::string part(bytes, static_cast<char>('a' + pool.rank() % 26));
  std::string times;
  for (int round = -1; round < count; ++round) {
    const auto start = std::chrono::steady_clock::now();
    pool.agree("round");
    const auto parts = pool.all_gather(part);
    const auto took = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (parts.size() != static_cast<std::size_t>(pool.size()) || parts.back().size() != bytes) {
      line("ROUNDS wrong gather in round " + std::to_string(round));
      return 1;
    }
    if (round >= 0) times += (times.empty() ? "" : ",") + std::to_string(took);
  }
  if (pool.rank() == 0) {
    line("ROUNDS ms=" + times);
    line("MEMORY idle_kb=0 peak_kb=" + std::to_string(status_kb("VmHWM")));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: pool_worker SCENARIO [ARGS]\n";
    return 2;
  }
  const std::string scenario = argv[1];
  auto arg = [&](int i) { return i < argc ? std::stoi(argv[i]) : 0; };
  if (scenario == "watchdog") {
    // The watchdog needs no pool: it fails the process on its own.
    dew::runtime::StepWatchdog watchdog(std::chrono::milliseconds(arg(2)));
    {
      auto step = watchdog.step();
      std::this_thread::sleep_for(50ms);
    }
    line("STEP 1 done");
    auto step = watchdog.step();
    std::this_thread::sleep_for(std::chrono::milliseconds(arg(2) * 10));
    line("STEP 2 done (the watchdog missed it)");
    return 0;
  }
  if (scenario == "start") return 0;
  Pool pool = dew::runtime::join();
  if (scenario == "exchange") return exchange(pool);
  if (scenario == "join") {
    line(std::string("SECRET ") + (std::getenv("DEW_POOL_SECRET") ? "still in the environment" : "gone"));
    return 0;
  }
  if (scenario == "race") return race(pool, arg(2));
  if (scenario == "rounds") return rounds(pool, static_cast<std::size_t>(std::stoll(argv[2])), arg(3));
  if (scenario == "gather") return gather(pool, static_cast<std::size_t>(std::stoll(argv[2])), arg(3));
  if (scenario == "throw") {
    steps(pool, arg(2), [&] {
      failing_now();
      throw std::runtime_error("boom from rank " + std::to_string(pool.rank()));
    });
  }
  if (scenario == "fail") {
    const std::string message =
        argc > 4 ? std::string(argv[4]) : "data loader raised on rank " + std::to_string(pool.rank());
    steps(pool, arg(2), [&] {
      failing_now();
      pool.fail(message, arg(3));
    });
  }
  if (scenario == "fail-hook-exits-thread") {
    // As Python does to a thread that takes its lock while the interpreter
    // finalizes: the before-exit hook's thread ends by pthread_exit.
    dew::runtime::set_before_exit([](int) { pthread_exit(nullptr); });
    steps(pool, arg(2), [&] {
      failing_now();
      pool.fail("data loader raised on rank " + std::to_string(pool.rank()), arg(3));
    });
  }
  if (scenario == "wait-ending") {
    pool.agree("ready");
    if (pool.rank() == arg(2)) {
      std::this_thread::sleep_for(500ms);
      pool.fail("failed while its peers waited", 3);
    }
    const auto asked = std::chrono::steady_clock::now();
    const bool heard = pool.wait_until_ending(10s);
    const auto after = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - asked);
    line("ENDING heard=" + std::to_string(heard) + " after=" + std::to_string(after.count()));
    // An error of its own now is the failure's consequence (a collective
    // broken by it): the process still ends as the failed one's peer.
    pool.fail("a collective broke after the word", 9);
  }
  if (scenario == "crash") {
    // A real SIGSEGV, sent rather than caused: UBSan would stop a null store
    // first, and the handler is the same either way.
    steps(pool, arg(2), [&] {
      failing_now();
      kill(getpid(), SIGSEGV);
    });
  }
  if (scenario == "steps") steps(pool, -1, [] {});
  if (scenario == "stall") {
    if (pool.rank() == arg(2)) std::this_thread::sleep_for(std::chrono::seconds(arg(3)));
    pool.agree("checkpoint", 2s);
    line("AGREED");
    return 0;
  }
  if (scenario == "hold") {
    pool.agree("ready");
    if (pool.rank() == 0) line("READY");
    std::this_thread::sleep_for(std::chrono::seconds(arg(2)));
    return exchange(pool);
  }
  if (scenario == "shared") {
    std::string dir = argc > 2 ? argv[2] : ".";
    if (auto at = dir.find("%r"); at != std::string::npos) dir.replace(at, 2, std::to_string(pool.rank()));
    try {
      pool.require_shared_directory(dir);
      line("SHARED ok");
      return 0;
    } catch (const dew::runtime::PoolError& error) {
      line(std::string("SHARED refused: ") + error.what());
      return 3;
    }
  }
  if (scenario == "fingerprint") {
    // The pool alone (no topology library): the fingerprint a test gives.
    const char* given = std::getenv("DEW_ACCELERATOR_FINGERPRINT");
    const auto key = pool.compile_cache_key(given ? given : "platform=cpu\n");
    line("KEY " + key.value_or("none"));
    return 0;
  }
  std::cerr << "pool_worker: unknown scenario '" << scenario << "'\n";
  return 2;
}
