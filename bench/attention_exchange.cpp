// Each sequence-parallel exchange's time for forward + backward of one
// attention call over a CPU pool (every device a thread and a Gloo rank over
// loopback TCP, OpenBLAS on one thread per device), and for each shape
// whether the rule (choose_exchange) picked the faster one and by how much it
// missed. Both exchanges of a shape run interleaved (A B, B A, ...).
//
//   attention_exchange [--devices N] [--head-dim D] [--runs R] [--lengths L1,L2,...]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attention.h"
#include "communicator.h"
#include "exchange.h"

namespace {

using namespace dew::attention;
using Clock = std::chrono::steady_clock;

struct Shape {
  int heads, kv_heads;
  std::int64_t length;
  bool causal;
};

// Seconds of forward + backward on every rank (the slowest rank's), per run.
std::vector<double> time_exchange(Exchange exchange, const Shape& s, int n, int head_dim, int runs) {
  const Layout layout = s.causal ? Layout::kChunkPairs : Layout::kContiguous;
  const std::int64_t ls = s.length / n;
  std::vector<std::vector<double>> per_rank(static_cast<std::size_t>(n));
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
      GlooOptions options;
      options.rank = rank;
      options.size = n;
      options.store = store;
      auto comm = make_gloo_communicator(options);
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
      for (int r = 0; r <= runs; ++r) {
        (void)comm.value()->barrier();
        const auto start = Clock::now();
        auto f = exchange_forward<float>(exchange, *comm.value(), call, out.data(), lse.data());
        auto b = exchange_backward<float>(exchange, *comm.value(), call, out.data(), lse.data(), d_out.data(),
                                          Gradients<float>{dq.data(), dk.data(), dv.data()});
        (void)comm.value()->barrier();
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        if (!f.ok() || !b.ok()) {
          std::fprintf(stderr, "attention_exchange: %s\n", (!f.ok() ? f.error() : b.error()).message.c_str());
          std::exit(1);
        }
        if (r > 0) per_rank[std::size_t(rank)].push_back(seconds);
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<double> slowest(per_rank[0].size(), 0.0);
  for (const auto& times : per_rank)
    for (std::size_t i = 0; i < times.size(); ++i) slowest[i] = std::max(slowest[i], times[i]);
  return slowest;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int n = 2, head_dim = 64, runs = 3;
  std::vector<std::int64_t> lengths = {1024, 2048};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i], value = argv[i + 1];
    if (arg == "--devices") n = std::atoi(value.c_str());
    else if (arg == "--head-dim") head_dim = std::atoi(value.c_str());
    else if (arg == "--runs") runs = std::atoi(value.c_str());
    else if (arg == "--lengths") {
      lengths.clear();
      for (std::size_t start = 0; start < value.size();) {
        const std::size_t comma = std::min(value.find(',', start), value.size());
        lengths.push_back(std::atoll(value.substr(start, comma - start).c_str()));
        start = comma + 1;
      }
    } else {
      std::fprintf(stderr, "usage: attention_exchange [--devices N] [--head-dim D] [--runs R] [--lengths L1,L2]\n");
      return 2;
    }
  }
  if (n < 1 || head_dim < 1 || runs < 1 || lengths.empty() || argc % 2 == 0) {
    std::fprintf(stderr, "usage: attention_exchange [--devices N] [--head-dim D] [--runs R] [--lengths L1,L2]\n");
    return 2;
  }
  openblas_set_num_threads(1);
  std::printf("sequence-parallel exchanges over a CPU pool: %d thread-ranks, Gloo over loopback TCP, fp32\n", n);
  std::printf("time: forward + backward of one call, slowest rank, median of %d after 1 warm-up; exchanges "
              "interleaved per run\n\n",
              runs);
  std::printf("%-7s %-6s %-9s %12s %12s %-11s %-11s %s\n", "heads", "length", "mask", "all-to-all", "gather",
              "rule", "faster", "miss");
  int right = 0, total = 0;
  double worst = 0;
  const std::vector<std::pair<int, int>> heads = {{16, 8}, {32, 8}, {16, 16}, {4, 4}};
  for (const auto& [h, k] : heads)
    for (const std::int64_t length : lengths)
      for (const bool causal : {false, true}) {
        const Shape shape{h, k, length, causal};
        Call call;
        call.heads = h;
        call.kv_heads = k;
        call.query_length = call.key_length = length;
        call.sequence = n;
        call.head_dim = head_dim;
        call.bytes_per_value = 4;
        call.mask.kind = causal ? MaskKind::kCausal : MaskKind::kNone;
        auto plan = choose_exchange(call);
        if (!plan.ok()) {
          std::printf("%3d/%-3d %-6lld %-9s  %s\n", h, k, static_cast<long long>(length), causal ? "causal" : "none",
                      plan.error().message.c_str());
          continue;
        }
        std::vector<double> a2a, gather;
        for (int r = 0; r < runs; ++r) {  // interleaved: A B, B A, ...
          const bool a_first = r % 2 == 0;
          for (const bool first : {true, false}) {
            const Exchange e = (first == a_first) ? Exchange::kAllToAll : Exchange::kGather;
            const double t = time_exchange(e, shape, n, head_dim, 1)[0];
            (e == Exchange::kAllToAll ? a2a : gather).push_back(t);
          }
        }
        const double ta = median(a2a), tg = median(gather);
        const Exchange faster = ta <= tg ? Exchange::kAllToAll : Exchange::kGather;
        const Exchange picked = plan.value().exchange;
        const double miss = picked == faster ? 0.0 : (picked == Exchange::kAllToAll ? ta / tg : tg / ta) - 1.0;
        ++total;
        right += picked == faster ? 1 : 0;
        worst = std::max(worst, miss);
        std::printf("%3d/%-3d %-6lld %-9s %11.3fs %11.3fs %-11s %-11s %.1f%%\n", h, k,
                    static_cast<long long>(length), causal ? "causal" : "none", ta, tg,
                    std::string(exchange_name(picked)).c_str(), std::string(exchange_name(faster)).c_str(),
                    100.0 * miss);
      }
  std::printf("\nrule picked the faster exchange in %d of %d shapes; largest miss %.1f%%\n", right, total,
              100.0 * worst);
  std::printf("target: right in >= 90%% of shapes, misses <= 10%%: %s\n",
              (right * 10 >= total * 9 && worst <= 0.10) ? "met" : "not met");
  return 0;
}
