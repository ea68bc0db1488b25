// The attention kernel's GFLOP/s, forward and backward, causal and not,
// against OpenBLAS SGEMM's GFLOP/s measured in the same run, all on one
// thread (openblas_set_num_threads(1)). Target: kernel >= 50% of SGEMM.
// Each timed pass follows an SGEMM 2048^3 and the ratio is taken per pair,
// so load from other work on the host touches both sides alike.
//
//   attention_kernel [--length L] [--heads H] [--kv-heads K] [--head-dim D]
//                    [--runs N] [--query-block B] [--key-block B]
//
// FLOPs: forward 4 x head_dim per allowed (query, key) pair and head (the two
// block products); backward 2.5 x forward (FlashAttention's convention: it
// recomputes the logits). Causal counts only the allowed pairs, L(L+1)/2.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dew/attention.h"
#include "dew/median.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& e : x) e = u(gen);
  return x;
}

// SGEMM C = A B, n x n x n, median GFLOP/s of `runs` after one warm-up.
double sgemm_gflops(int n, int runs) {
  const auto a = random_values(std::size_t(n) * n, 1), b = random_values(std::size_t(n) * n, 2);
  std::vector<float> c(std::size_t(n) * n);
  std::vector<double> rates;
  for (int r = runs > 0 ? 0 : 1; r <= std::max(runs, 1); ++r) {
    const auto start = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double s = seconds_since(start);
    if (r > 0) rates.push_back(2.0 * n * n * double(n) / s / 1e9);
  }
  return dew::median(rates);
}

// SGEMM in the attention's own shape: S = Q K^T, (m x d) (n x d)^T.
double sgemm_qk_gflops(int m, int n, int d, int runs) {
  const auto a = random_values(std::size_t(m) * d, 3), b = random_values(std::size_t(n) * d, 4);
  std::vector<float> c(std::size_t(m) * n);
  std::vector<double> rates;
  for (int r = 0; r <= runs; ++r) {
    const auto start = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, d, 1.0f, a.data(), d, b.data(), d, 0.0f, c.data(), n);
    const double s = seconds_since(start);
    if (r > 0) rates.push_back(2.0 * m * n * double(d) / s / 1e9);
  }
  return dew::median(rates);
}

struct Options {
  std::int64_t length = 4096;
  int heads = 4;
  int kv_heads = 2;
  int head_dim = 128;
  int runs = 3;
  int query_block = 128;
  int key_block = 256;
};

// Medians over the runs of each pass's GFLOP/s and of its ratio to an SGEMM
// 2048^3 timed right before it (interleaved, so a busy host slows both).
struct Rates {
  double forward = 0, backward = 0, forward_ratio = 0, backward_ratio = 0, sgemm = 0;
};

Rates measure(const Options& o, bool causal) {
  using namespace dew::attention;
  Inputs<float> in;
  in.dims = Dims{1, o.heads, o.kv_heads, o.length, o.length, o.head_dim};
  const std::size_t nq = std::size_t(o.heads) * std::size_t(o.length) * std::size_t(o.head_dim);
  const std::size_t nk = std::size_t(o.kv_heads) * std::size_t(o.length) * std::size_t(o.head_dim);
  const auto q = random_values(nq, 5), k = random_values(nk, 6), v = random_values(nk, 7), dout = random_values(nq, 8);
  in.query = q.data();
  in.key = k.data();
  in.value = v.data();
  in.mask.causal = causal;
  in.query_block = o.query_block;
  in.key_block = o.key_block;
  std::vector<float> out(nq), lse(std::size_t(o.heads) * std::size_t(o.length)), dq(nq), dk(nk), dv(nk);
  const double pairs = double(allowed_pairs(in.mask, in.dims));
  const double forward_flops = 4.0 * o.head_dim * pairs * o.heads;
  std::vector<double> f, b, fr_ratio, br_ratio, gemm;
  for (int r = 0; r <= o.runs; ++r) {
    const double g1 = sgemm_gflops(2048, 0);
    auto start = Clock::now();
    auto fr = forward<float>(in, out.data(), lse.data());
    const double fs = seconds_since(start);
    const double g2 = sgemm_gflops(2048, 0);
    start = Clock::now();
    auto br =
        backward<float>(in, out.data(), lse.data(), dout.data(), Gradients<float>{dq.data(), dk.data(), dv.data()});
    const double bs = seconds_since(start);
    if (!fr.ok() || !br.ok()) {
      std::fprintf(stderr, "attention_kernel: %s\n", (!fr.ok() ? fr.error() : br.error()).message.c_str());
      std::exit(1);
    }
    if (r == 0) continue;  // warm-up
    f.push_back(forward_flops / fs / 1e9);
    b.push_back(2.5 * forward_flops / bs / 1e9);
    fr_ratio.push_back(f.back() / g1);
    br_ratio.push_back(b.back() / g2);
    gemm.push_back(g1);
    gemm.push_back(g2);
  }
  return {dew::median(f), dew::median(b), dew::median(fr_ratio), dew::median(br_ratio), dew::median(gemm)};
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return false;
    const long long value = std::atoll(argv[++i]);
    if (value < 1) return false;
    if (arg == "--length")
      o.length = value;
    else if (arg == "--heads")
      o.heads = int(value);
    else if (arg == "--kv-heads")
      o.kv_heads = int(value);
    else if (arg == "--head-dim")
      o.head_dim = int(value);
    else if (arg == "--runs")
      o.runs = int(value);
    else if (arg == "--query-block")
      o.query_block = int(value);
    else if (arg == "--key-block")
      o.key_block = int(value);
    else
      return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) {
    std::fprintf(stderr,
                 "usage: attention_kernel [--length L] [--heads H] [--kv-heads K] [--head-dim D] [--runs N] "
                 "[--query-block B] [--key-block B] (whole numbers >= 1)\n");
    return 2;
  }
  openblas_set_num_threads(1);
  std::printf("attention kernel against OpenBLAS SGEMM, one thread\n");
  std::printf("openblas:  %s, threads %d\n", openblas_get_config(), openblas_get_num_threads());
  std::printf("shape:     batch 1, heads %d, kv heads %d, length %lld, head dim %d, blocks %d x %d, fp32\n", o.heads,
              o.kv_heads, static_cast<long long>(o.length), o.head_dim, o.query_block, o.key_block);
  std::printf("runs:      median of %d after 1 uncounted warm-up; each pass right after an SGEMM 2048^3\n", o.runs);
  const double sgemm = sgemm_gflops(2048, o.runs);
  const double qk = sgemm_qk_gflops(int(o.length), int(o.length), o.head_dim, o.runs);
  std::printf("sgemm:     alone: 2048^3 %.1f GFLOP/s; in Q K^T's shape %lld x %lld x %d %.1f GFLOP/s\n", sgemm,
              static_cast<long long>(o.length), static_cast<long long>(o.length), o.head_dim, qk);
  std::printf("\n%-8s %-9s %10s %16s %22s\n", "mask", "pass", "GFLOP/s", "sgemm GFLOP/s", "ratio (interleaved)");
  bool met = true;
  for (const bool causal : {false, true}) {
    const Rates r = measure(o, causal);
    std::printf("%-8s %-9s %10.1f %16.1f %21.0f%%\n", causal ? "causal" : "none", "forward", r.forward, r.sgemm,
                100.0 * r.forward_ratio);
    std::printf("%-8s %-9s %10.1f %16.1f %21.0f%%\n", causal ? "causal" : "none", "backward", r.backward, r.sgemm,
                100.0 * r.backward_ratio);
    met = met && r.forward_ratio >= 0.5 && r.backward_ratio >= 0.5;
  }
  std::printf("target: every pass >= 50%% of SGEMM: %s\n", met ? "met" : "not met");
  return 0;
}
