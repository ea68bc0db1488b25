// Each sequence-parallel exchange's time for forward + backward of one
// attention call over a CPU pool (every device a thread and a Gloo rank over
// loopback TCP, OpenBLAS on one thread per device), and for each shape
// whether the rule (choose_exchange) picked the faster one and by how much it
// missed. Both exchanges of a shape run interleaved (A B, B A, ...).
//
//   attention_exchange [--devices N1,N2] [--head-dims D1,D2] [--heads H/K,...] [--lengths L1,L2,...] [--runs R]
//                      [--min-ms M] [--backend gloo|nccl]
//
// --backend nccl (built where /usr/local/cuda has NCCL) makes every rank an
// NCCL rank on its own GPU (rank r on GPU r: N GPUs for N devices) instead of
// a Gloo rank; the attention kernel still runs on the CPU, so the collectives
// copy host <-> GPU around NCCL (comm/dew/nccl.h). This is the issue's
// grid over NCCL (benchmark c).
//
// A run of an exchange is as many back-to-back calls as fill M milliseconds
// (250 by default), timed together and divided: a 25 ms call timed once is
// mostly scheduler and loopback noise, and the rule is scored against
// differences of a few percent.
//
// Two rules are scored: the design page's (the gather kernel runs masks as a dense
// bias, so masked calls take the all-to-all) and the one for the kernel that
// ran here, Dew's CPU kernel, which skips masked blocks in both exchanges.
#include <cblas.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dew/attention.h"
#include "dew/comm.h"
#include "dew/exchange.h"
#include "dew/median.h"
#ifdef DEW_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "dew/nccl.h"
#endif

namespace {

using namespace dew::attention;
using namespace dew::comm;
using Clock = std::chrono::steady_clock;

struct Shape {
  int heads, kv_heads;
  std::int64_t length;
  bool causal;
};

enum class Backend { kGloo, kNccl };

// This rank's communicator of the group of n, rendezvousing through `store`.
dew::Result<std::unique_ptr<Communicator>> connect(Backend backend, int rank, int n, const KeyValue& store) {
#ifdef DEW_HAVE_NCCL
  if (backend == Backend::kNccl) {
    NcclOptions options;
    options.rank = rank;
    options.size = n;
    options.device = rank;
    options.store = store;
    return make_nccl_communicator(options);
  }
#else
  (void)backend;
#endif
  GlooOptions options;
  options.rank = rank;
  options.size = n;
  options.store = store;
  return make_gloo_communicator(options);
}

struct Times {
  std::vector<double> all_to_all, gather;  // per counted run, the slowest rank's
};

// Calls per counted run: enough to fill min_seconds at the warm-up's pace
// (the slowest rank's, so that every rank computes the same count and makes
// the same collective calls).
int calls_per_run(double warm_up_seconds, double min_seconds) {
  return int(std::clamp(std::ceil(min_seconds / std::max(warm_up_seconds, 1e-6)), 1.0, 1000.0));
}

// Seconds of forward + backward of one call of each exchange, the slowest
// rank's per run. One Gloo group for the shape: a warm-up call of each
// exchange (maps the buffers and sets the calls per run), then `runs`
// counted runs of each, interleaved A B, B A, ...
Times time_shape(const Shape& s, int n, int head_dim, int runs, double min_seconds, Backend backend) {
  const Layout layout = s.causal ? Layout::kChunkPairs : Layout::kContiguous;
  const std::int64_t ls = s.length / n;
  // Per exchange, indexed by slot(): the warm-up's seconds and each counted run's.
  auto slot = [](Exchange e) { return e == Exchange::kAllToAll ? 0 : 1; };
  struct RankTimes {
    double warm_up[2] = {0, 0};
    std::vector<double> runs[2];
  };
  std::vector<RankTimes> per_rank(static_cast<std::size_t>(n));
  std::barrier warmed_up(n);
  KeyValue store = local_key_value();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      std::mt19937 gen(unsigned(rank + 1));
      std::uniform_real_distribution<float> u(-1, 1);
      auto fill = [&](std::size_t count) {
        std::vector<float> x(count);
        for (float& e : x) e = u(gen);
        return x;
      };
      const std::size_t nq = std::size_t(s.heads) * std::size_t(ls) * std::size_t(head_dim);
      const std::size_t nk = std::size_t(s.kv_heads) * std::size_t(ls) * std::size_t(head_dim);
      auto q = fill(nq), k = fill(nk), v = fill(nk), d_out = fill(nq);
      std::vector<float> out(nq), lse(std::size_t(s.heads) * std::size_t(ls)), dq(nq), dk(nk), dv(nk);
      auto comm = connect(backend, rank, n, store);
      if (!comm.ok()) {
        std::fprintf(stderr, "attention_exchange: %s\n", comm.error().message.c_str());
        std::exit(1);
      }
      ShardCall<float> call;
      call.dims = Dims{1, s.heads, s.kv_heads, s.length, s.length, head_dim};
      call.layout = layout;
      call.query = q.data();
      call.key = k.data();
      call.value = v.data();
      call.causal = s.causal;
      int calls[2] = {1, 1};  // by slot(); 1 for the warm-up
      for (int r = 0; r <= runs; ++r) {
        const bool a_first = r % 2 == 0;
        for (const bool first : {true, false}) {
          const Exchange e = (first == a_first) ? Exchange::kAllToAll : Exchange::kGather;
          const int count = calls[slot(e)];
          (void)comm.value()->barrier();
          const auto start = Clock::now();
          for (int c = 0; c < count; ++c) {
            auto f = exchange_forward<float>(e, *comm.value(), call, out.data(), lse.data());
            auto b = exchange_backward<float>(e, *comm.value(), call, out.data(), lse.data(), d_out.data(),
                                              Gradients<float>{dq.data(), dk.data(), dv.data()});
            if (!f.ok() || !b.ok()) {
              std::fprintf(stderr, "attention_exchange: %s\n", (!f.ok() ? f.error() : b.error()).message.c_str());
              std::exit(1);
            }
          }
          (void)comm.value()->barrier();
          const double seconds = std::chrono::duration<double>(Clock::now() - start).count() / count;
          RankTimes& mine = per_rank[std::size_t(rank)];
          if (r > 0)
            mine.runs[slot(e)].push_back(seconds);
          else
            mine.warm_up[slot(e)] = seconds;
        }
        if (r == 0) {
          warmed_up.arrive_and_wait();
          for (int i : {0, 1}) {
            double slowest = 0;
            for (const RankTimes& other : per_rank) slowest = std::max(slowest, other.warm_up[i]);
            calls[i] = calls_per_run(slowest, min_seconds);
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  Times times{std::vector<double>(std::size_t(runs), 0.0), std::vector<double>(std::size_t(runs), 0.0)};
  for (const RankTimes& rank : per_rank)
    for (std::size_t i = 0; i < std::size_t(runs); ++i) {
      times.all_to_all[i] = std::max(times.all_to_all[i], rank.runs[slot(Exchange::kAllToAll)][i]);
      times.gather[i] = std::max(times.gather[i], rank.runs[slot(Exchange::kGather)][i]);
    }
  return times;
}

// "1,2,3" -> {1, 2, 3}; false on anything but positive whole numbers.
bool parse_list(const std::string& text, std::vector<std::int64_t>& out) {
  out.clear();
  for (std::size_t start = 0; start <= text.size();) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    if (item.empty() || item.size() > 9 || item.find_first_not_of("0123456789") != std::string::npos) return false;
    out.push_back(std::atoll(item.c_str()));
    if (out.back() < 1) return false;
    start = comma + 1;
  }
  return !out.empty();
}

// "16/8,4/4" -> {{16, 8}, {4, 4}}; false unless every K divides its H.
bool parse_heads(const std::string& text, std::vector<std::pair<int, int>>& out) {
  out.clear();
  for (std::size_t start = 0; start <= text.size();) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    const std::size_t slash = item.find('/');
    std::vector<std::int64_t> h, k;
    if (slash == std::string::npos || !parse_list(item.substr(0, slash), h) || !parse_list(item.substr(slash + 1), k) ||
        h.size() != 1 || k.size() != 1 || h[0] > 4096 || h[0] % k[0] != 0)
      return false;
    out.emplace_back(int(h[0]), int(k[0]));
    start = comma + 1;
  }
  return !out.empty();
}

// How a rule did over the grid.
// A shape is decided when every counted run (the exchanges interleaved)
// agrees on which exchange is faster; otherwise the medians differ by less
// than this host's run-to-run noise, and either pick is as good.
struct Score {
  int right = 0, total = 0, decided = 0, right_decided = 0;
  double worst = 0, worst_decided = 0;
  double add(Exchange picked, Exchange faster, bool is_decided, double ta, double tg) {
    const double miss = picked == faster ? 0.0 : (picked == Exchange::kAllToAll ? ta / tg : tg / ta) - 1.0;
    ++total;
    right += picked == faster ? 1 : 0;
    decided += is_decided ? 1 : 0;
    right_decided += is_decided && picked == faster ? 1 : 0;
    worst = std::max(worst, miss);
    if (is_decided) worst_decided = std::max(worst_decided, miss);
    return miss;
  }
  void print(const char* name) const {
    std::printf(
        "%s: picked the faster exchange in %d of %d shapes (%.0f%%); largest miss %.1f%%; target (>= 90%% "
        "right, misses <= 10%%) %s\n",
        name, right, total, 100.0 * right / std::max(total, 1), 100.0 * worst,
        (right * 10 >= total * 9 && worst <= 0.10) ? "met" : "not met");
    std::printf(
        "%*s  where every run decided (%d shapes; the rest are ties within noise): %d right (%.0f%%), largest "
        "miss %.1f%%\n",
        int(std::string(name).size()), "", decided, right_decided, 100.0 * right_decided / std::max(decided, 1),
        100.0 * worst_decided);
  }
};

struct Options {
  std::vector<std::int64_t> devices = {2}, head_dims = {64}, lengths = {1024, 2048}, runs_list = {3},
                            min_ms_list = {250};
  std::vector<std::pair<int, int>> heads = {{16, 8}, {32, 8}, {16, 16}, {4, 4}};
  Backend backend = Backend::kGloo;
};

constexpr const char* kUsage =
    "usage: attention_exchange [--devices N1,N2] [--head-dims D1,D2] [--heads H/K,...] [--lengths L1,L2,...] "
    "[--runs R] [--min-ms M] [--backend gloo|nccl]\n";

// One option and its value; false (after one line on stderr) when refused.
bool take_option(const std::string& arg, const std::string& value, Options& o) {
  if (arg == "--backend") {
#ifdef DEW_HAVE_NCCL
    const char* allowed = "gloo, nccl";
    const bool known = value == "gloo" || value == "nccl";
#else
    const char* allowed = "gloo (this build has no NCCL: /usr/local/cuda lacked the CUDA runtime or NCCL)";
    const bool known = value == "gloo";
#endif
    if (!known) {
      std::fprintf(stderr, "attention_exchange: --backend %s is not allowed; allowed: %s\n%s", value.c_str(), allowed,
                   kUsage);
      return false;
    }
    o.backend = value == "nccl" ? Backend::kNccl : Backend::kGloo;
    return true;
  }
  if (arg == "--heads") {
    if (parse_heads(value, o.heads)) return true;
    std::fprintf(stderr,
                 "attention_exchange: --heads %s is not allowed; allowed: H/K pairs, comma separated, K "
                 "dividing H (e.g. 16/8,4/4)\n%s",
                 value.c_str(), kUsage);
    return false;
  }
  std::vector<std::int64_t>* target = arg == "--devices"     ? &o.devices
                                      : arg == "--head-dims" ? &o.head_dims
                                      : arg == "--lengths"   ? &o.lengths
                                      : arg == "--runs"      ? &o.runs_list
                                      : arg == "--min-ms"    ? &o.min_ms_list
                                                             : nullptr;
  const bool one_value_only = target == &o.runs_list || target == &o.min_ms_list;
  if (target != nullptr && parse_list(value, *target) && !(one_value_only && target->size() != 1)) return true;
  std::fprintf(stderr,
               "attention_exchange: %s %s is not allowed; allowed: positive whole numbers, comma "
               "separated (--runs, --min-ms: one)\n%s",
               arg.c_str(), value.c_str(), kUsage);
  return false;
}

// One NCCL rank per GPU: said before the grid, not from inside it.
bool enough_gpus(const Options& o) {
#ifdef DEW_HAVE_NCCL
  if (o.backend != Backend::kNccl) return true;
  int gpus = 0;
  const cudaError_t status = cudaGetDeviceCount(&gpus);
  const std::int64_t most = *std::max_element(o.devices.begin(), o.devices.end());
  if (status == cudaSuccess && gpus >= most) return true;
  std::fprintf(stderr,
               "attention_exchange: --backend nccl with --devices %lld needs %lld GPUs (one NCCL rank per "
               "GPU); this machine has %s\n",
               static_cast<long long>(most), static_cast<long long>(most),
               status != cudaSuccess ? (std::string("none: ") + cudaGetErrorString(status)).c_str()
                                     : std::to_string(gpus).c_str());
  return false;
#else
  (void)o;
  return true;
#endif
}

void print_header(const Options& o, int runs, double min_seconds) {
  std::printf("sequence-parallel exchanges over a CPU pool: N thread-ranks, %s, fp32, batch 1\n",
              o.backend == Backend::kNccl ? "NCCL ranks (rank r on GPU r; the kernel on the CPU, host <-> GPU copies)"
                                          : "Gloo over loopback TCP");
  std::printf(
      "time: forward + backward of one call, slowest rank, median of %d runs after 1 warm-up, a run being as "
      "many back-to-back calls as fill %.0f ms; exchanges interleaved per run\n",
      runs, 1000.0 * min_seconds);
  std::printf(
      "rules: 'design' = the design page's (gather kernel dense-bias: masked calls take the all-to-all); "
      "'cpu' = for Dew's CPU kernel (skips-masked-blocks: bytes decide)\n");
  // Under a true tie each interleaved run picks a winner by a coin toss, so
  // all R agree by chance with probability 2 / 2^R: the '?' test's false
  // "decided" rate.
  std::printf(
      "faster: by median; '?' where the counted runs disagree on which is faster (a tie within noise; a true "
      "tie passes as decided with chance 2/2^%d = %.0f%%)\n\n",
      runs, 100.0 * 2.0 / std::ldexp(1.0, runs));
  std::printf("%-2s %-4s %-6s %-6s %-7s %11s %11s %-11s %-11s %7s %-11s %7s\n", "N", "D", "heads", "length", "mask",
              "all-to-all", "gather", "faster", "design rule", "miss", "cpu rule", "miss");
}

// One shape of the grid: both exchanges timed, one row, each rule scored.
void run_shape(const Shape& shape, int n, int head_dim, int runs, double min_seconds, Backend backend, Score& design,
               Score& cpu) {
  Call call;
  call.heads = shape.heads;
  call.kv_heads = shape.kv_heads;
  call.query_length = call.key_length = shape.length;
  call.sequence = n;
  call.head_dim = head_dim;
  call.bytes_per_value = 4;
  call.mask.kind = shape.causal ? MaskKind::kCausal : MaskKind::kNone;
  auto design_plan = choose_exchange(call);
  call.gather_kernel = GatherKernel::kSkipsMaskedBlocks;
  auto cpu_plan = choose_exchange(call);
  const char* mask = shape.causal ? "causal" : "none";
  if (!design_plan.ok() || !cpu_plan.ok()) {
    std::printf("%-2d %-4d %3d/%-3d %-6lld %-7s %s\n", n, head_dim, shape.heads, shape.kv_heads,
                static_cast<long long>(shape.length), mask,
                (!design_plan.ok() ? design_plan : cpu_plan).error().message.c_str());
    return;
  }
  const Times times = time_shape(shape, n, head_dim, runs, min_seconds, backend);
  const double ta = dew::median(times.all_to_all), tg = dew::median(times.gather);
  const Exchange faster = ta <= tg ? Exchange::kAllToAll : Exchange::kGather;
  int a2a_wins = 0;
  for (std::size_t r = 0; r < times.all_to_all.size(); ++r) a2a_wins += times.all_to_all[r] <= times.gather[r] ? 1 : 0;
  const bool decided = a2a_wins == 0 || a2a_wins == runs;
  const Exchange by_design = design_plan.value().exchange, by_cpu = cpu_plan.value().exchange;
  const double design_miss = design.add(by_design, faster, decided, ta, tg);
  const double cpu_miss = cpu.add(by_cpu, faster, decided, ta, tg);
  std::printf("%-2d %-4d %3d/%-3d %-6lld %-7s %10.4fs %10.4fs %-11s %-11s %6.1f%% %-11s %6.1f%%\n", n, head_dim,
              shape.heads, shape.kv_heads, static_cast<long long>(shape.length), mask, ta, tg,
              (std::string(exchange_name(faster)) + (decided ? "" : "?")).c_str(),
              std::string(exchange_name(by_design)).c_str(), 100.0 * design_miss,
              std::string(exchange_name(by_cpu)).c_str(), 100.0 * cpu_miss);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (argc % 2 == 0) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!take_option(argv[i], argv[i + 1], o)) return 2;
  }
  if (!enough_gpus(o)) return 2;
  const int runs = int(o.runs_list[0]);
  const double min_seconds = double(o.min_ms_list[0]) / 1000.0;
  openblas_set_num_threads(1);
  print_header(o, runs, min_seconds);
  Score design, cpu;
  for (const std::int64_t n : o.devices)
    for (const std::int64_t head_dim : o.head_dims)
      for (const auto& [h, k] : o.heads)
        for (const std::int64_t length : o.lengths)
          for (const bool causal : {false, true})
            run_shape(Shape{h, k, length, causal}, int(n), int(head_dim), runs, min_seconds, o.backend, design, cpu);
  std::printf("\n");
  design.print("design rule");
  cpu.print("cpu rule   ");
  return 0;
}
