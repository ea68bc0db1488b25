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
#include <map>
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

// The collectives timed: name, then Dew's and Gloo's way of doing it on
// `floats` values per rank.
struct Rank {
  std::unique_ptr<dew::comm::Communicator> dew;
  std::shared_ptr<gloo::rendezvous::Context> gloo;
};

void gloo_all_reduce(Rank& r, std::vector<float>& data) {
  gloo::AllreduceOptions options(r.gloo);
  options.setOutput(data.data(), data.size());
  options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  options.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
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
using Call = std::function<void(Rank&, int rank)>;

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
  for (int k = 0; k < iterations; ++k) call(r, rank);
  barrier(r, side);
  Block block;
  block.wall = std::chrono::duration<double>(Clock::now() - start).count() / iterations;
  if (rank == 0) block.cpu = (cpu_seconds() - cpu) / iterations;
  return block;
}

void run_ranks(int ranks, const Options& o) {
  auto dew_store = dew::comm::local_key_value();
  auto gloo_store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<Rank> members(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int k = 0; k < ranks; ++k) {
    threads.emplace_back([&, k] {
      dew::comm::GlooOptions options;
      options.rank = k;
      options.size = ranks;
      options.store = dew_store;
      auto made = dew::comm::make_gloo_communicator(options);
      if (!made.ok()) {
        std::fprintf(stderr, "collectives: %s\n", made.error().message.c_str());
        std::exit(1);
      }
      members[std::size_t(k)].dew = std::move(made.value());
      gloo::transport::tcp::attr attr;
      attr.hostname = "127.0.0.1";
      auto context = std::make_shared<gloo::rendezvous::Context>(k, ranks);
      gloo::rendezvous::PrefixStore prefixed("baseline", *gloo_store);
      auto device = gloo::transport::tcp::CreateDevice(attr);
      context->connectFullMesh(prefixed, device);
      members[std::size_t(k)].gloo = context;
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  for (long bytes : o.sizes) {
    const std::size_t floats = std::size_t(bytes / 4 / ranks * ranks);
    const double part = double(ranks - 1) / ranks * double(floats) * 4;
    // name, bus bytes per call, Dew's call, Gloo's call
    struct Case {
      const char* name;
      double bus;
      Call dew, gloo;
    };
    std::vector<std::vector<float>> data(static_cast<std::size_t>(ranks), std::vector<float>(floats, 1.0f));
    std::vector<std::vector<float>> out(static_cast<std::size_t>(ranks), std::vector<float>(floats));
    std::vector<std::vector<float>> chunk(static_cast<std::size_t>(ranks), std::vector<float>(floats / std::size_t(ranks), 1.0f));
    const std::vector<Case> cases = {
        {"all-reduce", 2 * part,
         [&](Rank& r, int k) { (void)r.dew->all_reduce(std::span<float>(data[std::size_t(k)])); },
         [&](Rank& r, int k) { gloo_all_reduce(r, data[std::size_t(k)]); }},
        {"all-gather", part,
         [&](Rank& r, int k) {
           (void)r.dew->all_gather(std::span<const float>(chunk[std::size_t(k)]), std::span<float>(out[std::size_t(k)]));
         },
         [&](Rank& r, int k) { gloo_all_gather(r, chunk[std::size_t(k)], out[std::size_t(k)]); }},
        {"reduce-scatter", part,
         [&](Rank& r, int k) {
           (void)r.dew->reduce_scatter(std::span<const float>(data[std::size_t(k)]),
                                       std::span<float>(chunk[std::size_t(k)]));
         },
         [&](Rank& r, int k) { gloo_all_reduce(r, data[std::size_t(k)]); }},
    };
    for (const auto& c : cases) {
      const double gloo_bus = std::string(c.name) == "reduce-scatter" ? 2 * part : c.bus;
      std::vector<double> dew_times, gloo_times, ratios, cpu_ratios;
      for (int run = 0; run < o.runs + 1; ++run) {  // run 0: warm-up
        std::vector<Block> blocks(2);
        for (int k = 0; k < ranks; ++k) {
          threads.emplace_back([&, k] {
            Rank& r = members[std::size_t(k)];
            // Odd runs time Gloo first: neither side always runs on a warmer machine.
            Block d, g;
            if (run % 2 == 0) {
              d = time_block(r, k, Side::kDew, o.iterations, c.dew);
              g = time_block(r, k, Side::kGloo, o.iterations, c.gloo);
            } else {
              g = time_block(r, k, Side::kGloo, o.iterations, c.gloo);
              d = time_block(r, k, Side::kDew, o.iterations, c.dew);
            }
            if (k == 0) blocks = {d, g};
          });
        }
        for (auto& t : threads) t.join();
        threads.clear();
        if (run == 0) continue;
        dew_times.push_back(blocks[0].wall);
        gloo_times.push_back(blocks[1].wall);
        // Each run's two blocks ran back to back: their ratio is what a
        // machine that speeds up or slows down between runs moves least.
        ratios.push_back((c.bus / blocks[0].wall) / (gloo_bus / blocks[1].wall));
        cpu_ratios.push_back((c.bus / blocks[0].cpu) / (gloo_bus / blocks[1].cpu));
      }
      const double d = dew::median(dew_times), g = dew::median(gloo_times);
      const double dew_rate = c.bus / d / 1e6, gloo_rate = gloo_bus / g / 1e6;
      std::sort(ratios.begin(), ratios.end());
      const auto quartile = [&](std::size_t q) { return ratios[(ratios.size() - 1) * q / 4]; };
      std::printf("%5d %10ld  %-15s %10.1f %10.1f %10.1f %10.1f %6.2f  %4.2f-%4.2f %6.2f\n", ranks, bytes, c.name,
                  d * 1e6, dew_rate, g * 1e6, gloo_rate, dew::median(ratios), quartile(1), quartile(3),
                  dew::median(cpu_ratios));
      std::fflush(stdout);
    }
  }
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
