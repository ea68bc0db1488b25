// The worker's collectives through Dew's Communicator against Gloo's own
// all-reduce and all-gather on the same sizes, in the same run: ranks are
// threads of this process (as dew worker's CPU devices are), Gloo over
// loopback TCP for both. Prints, per ranks and size, each collective's
// achieved bus bytes/s (what each rank sends: all-reduce 2(R-1)/R x size,
// all-gather and reduce-scatter (R-1)/R x size) and its ratio to Gloo's
// (reduce-scatter against Gloo's all-reduce: Gloo has none of its own):
// the median of each run's ratio (Dew's block and Gloo's block run back to
// back, so a machine that slows down between runs moves both), its
// quartiles, and the same ratio over CPU seconds instead of wall seconds
// (bytes per CPU second: what a machine whose cores are all busy with the
// ranks is bound by). Dew's all-gather is Gloo's allgather itself: its
// ratios show the noise.
//
//   collectives [--ranks 2,4,8] [--sizes 16384,...] (bytes) [--runs N] [--iterations K]
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dew/comm.h"
#include "dew/median.h"
#include "dew/text.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<int> ranks = {2, 4, 8};
  // 16 KiB to 4 MiB; 160 KiB and 705 KiB are bench/worker's model's buckets.
  std::vector<long> sizes = {16384, 164352, 721920, 4194304};
  int runs = 5;
  int iterations = 10;
};

std::vector<long> parse_list(const char* text) {
  std::vector<long> out;
  for (const auto& part : dew::split(text, ',')) out.push_back(std::stol(part));
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--ranks") {
      o.ranks.clear();
      for (long r : parse_list(argv[i + 1])) o.ranks.push_back(int(r));
    } else if (flag == "--sizes") {
      o.sizes = parse_list(argv[i + 1]);
    } else if (flag == "--runs") {
      o.runs = std::atoi(argv[i + 1]);
    } else if (flag == "--iterations") {
      o.iterations = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "collectives: unknown option %s; allowed: --ranks, --sizes, --runs, --iterations\n",
                   flag.c_str());
      std::exit(2);
    }
  }
  return o;
}

// One rank: its Dew communicator and its own Gloo context for the baseline.
struct Rank {
  std::unique_ptr<dew::comm::Communicator> dew;
  std::shared_ptr<gloo::rendezvous::Context> gloo;
};

void gloo_all_reduce(Rank& r, std::vector<float>& data) {
  gloo::AllreduceOptions options(r.gloo);
  options.setOutput(data.data(), data.size());
  options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  options.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
  gloo::allreduce(options);
}

void gloo_all_gather(Rank& r, std::vector<float>& send, std::vector<float>& recv) {
  gloo::AllgatherOptions options(r.gloo);
  options.setInput(send.data(), send.size());
  options.setOutput(recv.data(), recv.size());
  gloo::allgather(options);
}

// Seconds per call, rank 0's clock between two barriers, and the process's
// CPU seconds per call over the same span (every rank's thread and Gloo's
// loop threads: only one side runs at a time).
struct Block {
  double wall = 0, cpu = 0;
};
using Call = std::function<void(Rank&)>;

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) { return double(t.tv_sec) + 1e-6 * double(t.tv_usec); };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// Each side's block starts and ends with a barrier on its own connections:
// a block that began with the other side's barrier ran about 10 % slower
// here, even where both sides make the very same Gloo call.
enum class Side { kDew, kGloo };

void barrier(Rank& r, Side side) {
  if (side == Side::kDew) {
    (void)r.dew->barrier();
    return;
  }
  gloo::BarrierOptions options(r.gloo);
  gloo::barrier(options);
}

Block time_block(Rank& r, int rank, Side side, int iterations, const Call& call) {
  // Every rank times its own block; rank 0's is the one reported.
  barrier(r, side);
  const double cpu = rank == 0 ? cpu_seconds() : 0;
  const auto start = Clock::now();
  for (int k = 0; k < iterations; ++k) call(r);
  barrier(r, side);
  Block block;
  block.wall = std::chrono::duration<double>(Clock::now() - start).count() / iterations;
  if (rank == 0) block.cpu = (cpu_seconds() - cpu) / iterations;
  return block;
}

// One collective timed both ways: name, bus bytes per call, Dew's call and
// Gloo's, on the calling rank's own buffers.
struct Case {
  const char* name;
  double bus, gloo_bus;
  Call dew, gloo;
};

// Rank 0's timings of one case over the runs, and its table row.
struct Timings {
  std::vector<double> dew, gloo, ratios, cpu_ratios;

  void add(const Case& c, const Block& d, const Block& g) {
    dew.push_back(d.wall);
    gloo.push_back(g.wall);
    // Each run's two blocks ran back to back: their ratio is what a
    // machine that speeds up or slows down between runs moves least.
    ratios.push_back((c.bus / d.wall) / (c.gloo_bus / g.wall));
    cpu_ratios.push_back((c.bus / d.cpu) / (c.gloo_bus / g.cpu));
  }

  void print(int ranks, long bytes, const Case& c) {
    const double d = dew::median(dew), g = dew::median(gloo);
    std::sort(ratios.begin(), ratios.end());
    const auto quartile = [&](std::size_t q) { return ratios[(ratios.size() - 1) * q / 4]; };
    std::printf("%5d %10ld  %-15s %10.1f %10.1f %10.1f %10.1f %6.2f  %4.2f-%4.2f %6.2f\n", ranks, bytes, c.name,
                d * 1e6, c.bus / d / 1e6, g * 1e6, c.gloo_bus / g / 1e6, dew::median(ratios), quartile(1), quartile(3),
                dew::median(cpu_ratios));
    std::fflush(stdout);
  }
};

// What one rank's thread does for every size: its buffers, the three cases
// (Gloo's all-reduce moves 2 x part: against reduce-scatter, bus rates are
// compared), each timed over the runs, Dew first in even runs and Gloo
// first in odd ones, so neither side always runs on a warmer machine.
void rank_loop(Rank& r, int k, int ranks, const Options& o) {
  for (long bytes : o.sizes) {
    const std::size_t floats = std::size_t(bytes / 4 / ranks * ranks);
    const double part = double(ranks - 1) / ranks * double(floats) * 4;
    std::vector<float> data(floats, 1.0f), out(floats), chunk(floats / std::size_t(ranks), 1.0f);
    const std::vector<Case> cases = {
        {"all-reduce", 2 * part, 2 * part, [&](Rank& m) { (void)m.dew->all_reduce(std::span<float>(data)); },
         [&](Rank& m) { gloo_all_reduce(m, data); }},
        {"all-gather", part, part,
         [&](Rank& m) { (void)m.dew->all_gather(std::span<const float>(chunk), std::span<float>(out)); },
         [&](Rank& m) { gloo_all_gather(m, chunk, out); }},
        {"reduce-scatter", part, 2 * part,
         [&](Rank& m) { (void)m.dew->reduce_scatter(std::span<const float>(data), std::span<float>(chunk)); },
         [&](Rank& m) { gloo_all_reduce(m, data); }},
    };
    for (const auto& c : cases) {
      Timings timings;
      for (int run = 0; run < o.runs + 1; ++run) {  // run 0: warm-up
        Block d, g;
        if (run % 2 == 0) {
          d = time_block(r, k, Side::kDew, o.iterations, c.dew);
          g = time_block(r, k, Side::kGloo, o.iterations, c.gloo);
        } else {
          g = time_block(r, k, Side::kGloo, o.iterations, c.gloo);
          d = time_block(r, k, Side::kDew, o.iterations, c.dew);
        }
        if (k == 0 && run > 0) timings.add(c, d, g);
      }
      if (k == 0) timings.print(ranks, bytes, c);
    }
  }
}

// The ranks are threads that live for the whole run, as the worker's
// devices do: what a collective keeps per thread is made once, not once
// per run.
void run_ranks(int ranks, const Options& o) {
  auto dew_store = dew::comm::local_key_value();
  auto gloo_store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::thread> threads;
  for (int k = 0; k < ranks; ++k) {
    threads.emplace_back([&, k] {
      Rank r;
      dew::comm::GlooOptions options;
      options.rank = k;
      options.size = ranks;
      options.store = dew_store;
      auto made = dew::comm::make_gloo_communicator(options);
      if (!made.ok()) {
        std::fprintf(stderr, "collectives: %s\n", made.error().message.c_str());
        std::exit(1);
      }
      r.dew = std::move(made.value());
      gloo::transport::tcp::attr attr;
      attr.hostname = "127.0.0.1";
      r.gloo = std::make_shared<gloo::rendezvous::Context>(k, ranks);
      gloo::rendezvous::PrefixStore prefixed("baseline", *gloo_store);
      auto device = gloo::transport::tcp::CreateDevice(attr);
      r.gloo->connectFullMesh(prefixed, device);
      rank_loop(r, k, ranks, o);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::printf("Collectives over thread ranks, Gloo TCP on loopback; medians of %d runs x %d calls\n", o.runs,
              o.iterations);
  std::printf("%5s %10s  %-15s %10s %10s %10s %10s %6s  %9s %6s\n", "ranks", "bytes", "collective", "dew us",
              "dew MB/s", "gloo us", "gloo MB/s", "ratio", "q1-q3", "cpu");
  for (int ranks : o.ranks) run_ranks(ranks, o);
  return 0;
}
