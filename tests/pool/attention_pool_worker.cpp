// Sequence-parallel attention across the processes of a real pool: every
// process joins (libdew), runs D devices as threads, each a Gloo rank whose
// rendezvous goes through the pool's key-value exchange, and checks both
// exchanges, forward and backward, against whole-sequence attention it
// computes itself (fp32 within 1e-5, fp64 within 1e-12 relative).
//
//   attention_pool_worker D      prints "CASE <name> <exchange> <type>: ok"
//                                or ": MISMATCH ...", then "ALL OK" (exit 0)
//   attention_pool_worker D stall P
//                                the same, but process P prints "STALLING"
//                                before its third exchange and never starts
//                                it, so its peers wait inside a collective
//                                (for tests that then kill P)
#include <chrono>
#include <iostream>
#include <string>
#include <thread>

#include "exchange_harness.h"
#include "pool.h"

namespace {

using namespace dew::attention;
using namespace dew::attention::testing;

struct Named {
  std::string name;
  Case c;
  Layout layout;
};

// Cases whose shapes every group size the tests use (2, 4, 8) can run.
std::vector<Named> cases(int n) {
  std::vector<Named> out;
  const std::int64_t length = 4 * n;  // divides by 2N for the chunk pairs
  out.push_back({"multi-head", make(2, 8, 8, length, length, 8, 1), Layout::kContiguous});
  out.push_back({"gqa-k-equals-n", make(1, 8, n, length, length, 8, 2, true), Layout::kContiguous});
  out.push_back({"gqa-k-below-n", make(1, 8, n / 2, length, length, 8, 3), Layout::kContiguous});
  out.push_back({"gqa-k-above-n", make(1, 16, 2 * n, length, length, 8, 4), Layout::kContiguous});
  out.push_back({"mqa", make(1, 8, 1, length, length, 8, 5, true), Layout::kContiguous});
  Named causal{"causal-chunk-pairs", make(2, 8, 2, length, length, 8, 6, true), Layout::kChunkPairs};
  causal.c.causal = true;
  out.push_back(causal);
  Named window{"window-with-sinks", make(1, 8, 4, length, length, 8, 7, true), Layout::kChunkPairs};
  window.c.window = Window{3, 1};
  out.push_back(window);
  Named docs{"documents", make(2, 8, 2, length, length, 8, 8), Layout::kChunkPairs};
  docs.c.query_segments = documents(2, length, {3, 5, 2, 7});
  docs.c.key_segments = docs.c.query_segments;
  docs.c.causal = true;
  out.push_back(docs);
  Named bias{"bias", make(1, 8, 4, length, length, 8, 9), Layout::kContiguous};
  bias.c.bias = true;
  fill(bias.c, 9);
  out.push_back(bias);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int per_process = argc > 1 ? std::stoi(argv[1]) : 1;
  const int stalling_process = argc > 3 && std::string(argv[2]) == "stall" ? std::stoi(argv[3]) : -1;
  auto pool = dew::runtime::join();
  const int n = pool.size() * per_process;
  std::vector<int> mine;
  for (int d = 0; d < per_process; ++d) mine.push_back(pool.rank() * per_process + d);
  // The Gloo rendezvous over the pool: put and get are safe from threads.
  KeyValue store{
      [&pool](const std::string& key, const std::vector<char>& value) { pool.put(key, {value.begin(), value.end()}); },
      [&pool](const std::string& key) {
        const std::string value = pool.get(key, std::chrono::seconds(60));
        return std::vector<char>(value.begin(), value.end());
      }};
  bool all_ok = true;
  int round = 0;
  for (const Named& named : cases(n)) {
    for (const Exchange exchange : {Exchange::kAllToAll, Exchange::kGather}) {
      auto report = [&](const char* type, const std::vector<std::string>& bad) {
        std::string line = "CASE " + named.name + " " + std::string(exchange_name(exchange)) + " " + type + ": ";
        if (bad.empty()) {
          line += "ok";
        } else {
          all_ok = false;
          line += "MISMATCH";
          for (const auto& b : bad) line += "; " + b;
        }
        std::cout << line << std::endl;
      };
      if (pool.rank() == stalling_process && round == 2) {
        std::cout << "STALLING" << std::endl;
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
      }
      const std::string prefix = "attention/" + std::to_string(round++);
      report("fp32", mismatches<float>(named.c, whole_run<float>(named.c),
                                       run_exchange<float>(named.c, n, exchange, named.layout, store, mine, prefix + "/f"),
                                       1e-5, mine));
      report("fp64", mismatches<double>(named.c, whole_run<double>(named.c),
                                        run_exchange<double>(named.c, n, exchange, named.layout, store, mine, prefix + "/d"),
                                        1e-12, mine));
    }
  }
  pool.agree("attention-done");
  if (all_ok) std::cout << "ALL OK: " << n << " devices (" << pool.size() << " processes x " << per_process << ")" << std::endl;
  return all_ok ? 0 : 1;
}
