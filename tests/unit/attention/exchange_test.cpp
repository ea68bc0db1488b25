// Both exchanges, every device a thread and a Gloo rank over loopback TCP,
// against whole-sequence attention on one device (the local kernel), forward
// and backward: O, LSE, dQ, dK, dV, d sinks within 1e-5 (fp32) and 1e-12
// (fp64) relative. Plain multi-head; grouped with K = N, K < N, K > N; MQA;
// H=12, K=4, N=3; causal, windows, documents across shard and chunk edges,
// sinks, fully masked rows; N = 1 bit for bit; and the errors.
#include "dew/exchange.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "dew/attention.h"
#include "dew/comm.h"
#include "exchange_harness.h"
#include "reference.h"

namespace {

using namespace dew::attention;
using dew::attention::testing::as;
using dew::attention::testing::Bound;
using dew::attention::testing::Case;
using dew::attention::testing::relative_error;
using namespace dew::attention::testing;
using ::testing::HasSubstr;

template <typename T>
void expect_matches(const Case& c, int n, Exchange exchange, Layout layout, double tolerance) {
  const auto devices = run_exchange<T>(c, n, exchange, layout);
  EXPECT_THAT(mismatches<T>(c, whole_run<T>(c), devices, tolerance), ::testing::IsEmpty())
      << exchange_name(exchange) << " over " << n;
}

// Both exchanges (where each can run) in fp32 and fp64.
void check(const Case& c, int n, Layout layout, bool all_to_all = true, bool gather = true) {
  for (const Exchange e : {Exchange::kAllToAll, Exchange::kGather}) {
    if ((e == Exchange::kAllToAll && !all_to_all) || (e == Exchange::kGather && !gather)) continue;
    expect_matches<float>(c, n, e, layout, 1e-5);
    expect_matches<double>(c, n, e, layout, 1e-12);
  }
}

TEST(ExchangeTest, MultiHead) { check(make(2, 4, 4, 24, 24, 8), 2, Layout::kContiguous); }

TEST(ExchangeTest, GroupedKeyHeadsEqualDevices) { check(make(2, 8, 2, 24, 24, 8), 2, Layout::kContiguous); }

TEST(ExchangeTest, GroupedFewerKeyHeadsThanDevices) {
  check(make(1, 8, 2, 32, 32, 8, 2, true), 4, Layout::kContiguous);
}

TEST(ExchangeTest, GroupedMoreKeyHeadsThanDevices) { check(make(2, 8, 4, 16, 16, 8), 2, Layout::kContiguous); }

TEST(ExchangeTest, MultiQuery) { check(make(2, 4, 1, 32, 32, 8, 3, true), 4, Layout::kContiguous); }

TEST(ExchangeTest, RanksStraddleKeyGroups) { check(make(1, 12, 4, 24, 24, 8, 4, true), 3, Layout::kContiguous); }

TEST(ExchangeTest, CausalOnChunkPairs) {
  Case c = make(2, 4, 2, 32, 32, 8, 5, true);
  c.causal = true;
  check(c, 2, Layout::kChunkPairs);
  check(c, 4, Layout::kChunkPairs);
  check(c, 4, Layout::kContiguous);
}

TEST(ExchangeTest, Windows) {
  Case c = make(1, 4, 2, 32, 32, 8, 6);
  c.window = Window{5, 0};
  check(c, 2, Layout::kChunkPairs);
  c.window = Window{4, 4};
  check(c, 4, Layout::kChunkPairs);
  c.window = Window{100, 0};  // wider than the sequence
  check(c, 2, Layout::kContiguous);
}

TEST(ExchangeTest, DocumentsAcrossShardAndChunkEdges) {
  Case c = make(2, 4, 2, 32, 32, 8, 7);
  c.query_segments = documents(2, 32, {3, 9, 6, 14});
  c.key_segments = c.query_segments;
  c.causal = true;
  check(c, 4, Layout::kChunkPairs);
  check(c, 2, Layout::kContiguous);
}

TEST(ExchangeTest, Bias) {
  Case c = make(2, 4, 2, 16, 16, 8, 14);
  c.bias = true;
  dew::attention::testing::fill(c, 14);
  check(c, 2, Layout::kChunkPairs);
  c.causal = true;
  check(c, 4, Layout::kContiguous);
}

TEST(ExchangeTest, WindowWithSinks) {
  Case c = make(1, 6, 3, 24, 24, 8, 8, true);
  c.window = Window{3, 0};
  check(c, 3, Layout::kChunkPairs);
}

TEST(ExchangeTest, FullyMaskedRows) {
  // Cross attention, causal bottom-right: 16 queries over 8 keys, so the
  // first 8 query rows see nothing.
  Case c = make(1, 4, 2, 16, 8, 8, 9);
  c.causal = true;
  check(c, 2, Layout::kContiguous);
  Case with_sinks = make(1, 4, 2, 16, 8, 8, 10, true);
  with_sinks.causal = true;
  check(with_sinks, 2, Layout::kContiguous);
}

// Heads split over tensor x sequence at once: each of T = 2 tensor shards
// (its own query and key heads) runs its own sequence group of N = 2, both
// groups at the same time.
TEST(ExchangeTest, TensorTimesSequence) {
  Case whole = make(2, 8, 4, 16, 16, 8, 13, true);
  whole.causal = true;
  const Whole<double> expected = whole_run<double>(whole);
  const Dims& d = whole.dims;
  const std::vector<Case> shards = {head_shard(whole, 0, 2), head_shard(whole, 1, 2)};
  for (const Exchange e : {Exchange::kAllToAll, Exchange::kGather}) {
    std::vector<std::vector<Device<double>>> results(2);
    std::thread t0([&] { results[0] = run_exchange<double>(shards[0], 2, e, Layout::kChunkPairs); });
    std::thread t1([&] { results[1] = run_exchange<double>(shards[1], 2, e, Layout::kChunkPairs); });
    t0.join();
    t1.join();
    for (int t = 0; t < 2; ++t)
      for (int r = 0; r < 2; ++r) {
        const Device<double>& dev = results[std::size_t(t)][std::size_t(r)];
        ASSERT_EQ(dev.error, "");
        // This shard's heads of the whole result, at this device's rows.
        std::vector<double> want_out, want_dk;
        for (int b = 0; b < d.batch; ++b)
          for (int h = 0; h < 4; ++h)
            for (const auto p : dev.q_pos)
              for (int e2 = 0; e2 < 8; ++e2)
                want_out.push_back(expected.out[std::size_t(((b * 8 + 4 * t + h) * 16 + p) * 8 + e2)]);
        for (int b = 0; b < d.batch; ++b)
          for (int h = 0; h < 2; ++h)
            for (const auto p : dev.k_pos)
              for (int e2 = 0; e2 < 8; ++e2)
                want_dk.push_back(expected.dk[std::size_t(((b * 4 + 2 * t + h) * 16 + p) * 8 + e2)]);
        EXPECT_LE(relative_error(dev.out, want_out), 1e-12) << exchange_name(e);
        EXPECT_LE(relative_error(dev.dk, want_dk), 1e-12) << exchange_name(e);
        for (int h = 0; h < 4; ++h)
          EXPECT_NEAR(dev.ds[std::size_t(h)], expected.ds[std::size_t(4 * t + h)], 1e-12) << exchange_name(e);
      }
  }
}

TEST(ExchangeTest, OneDeviceIsTheLocalKernelBitForBit) {
  Case c = make(1, 4, 2, 20, 20, 8, 11, true);
  c.causal = true;
  const Whole<float> whole = whole_run<float>(c);
  for (const Exchange e : {Exchange::kAllToAll, Exchange::kGather}) {
    const auto devices = run_exchange<float>(c, 1, e, Layout::kContiguous);
    const Device<float>& dev = devices[0];
    ASSERT_EQ(dev.error, "");
    EXPECT_EQ(dev.out, whole.out) << exchange_name(e);
    EXPECT_EQ(dev.lse, whole.lse) << exchange_name(e);
    EXPECT_EQ(dev.dq, whole.dq) << exchange_name(e);
    EXPECT_EQ(dev.dk, whole.dk) << exchange_name(e);
    EXPECT_EQ(dev.dv, whole.dv) << exchange_name(e);
    EXPECT_EQ(dev.ds, whole.ds) << exchange_name(e);
  }
}

TEST(ExchangeTest, TheTwoExchangesAgree) {
  Case c = make(2, 8, 2, 32, 32, 8, 12, true);
  c.causal = true;
  const auto a = run_exchange<double>(c, 4, Exchange::kAllToAll, Layout::kChunkPairs);
  const auto g = run_exchange<double>(c, 4, Exchange::kGather, Layout::kChunkPairs);
  for (int r = 0; r < 4; ++r) {
    EXPECT_LE(error_of(a[std::size_t(r)].out, g[std::size_t(r)].out), 1e-12);
    EXPECT_LE(error_of(a[std::size_t(r)].dk, g[std::size_t(r)].dk), 1e-12);
  }
}

TEST(ExchangeTest, OneCollectivePerDirection) {
  // Forward: all-to-all Q, K, V out and O, LSE back (2); gather K and V (1).
  // Backward: all-to-all Q, K, V, O, LSE, dO out and dQ, dK, dV back (2);
  // gather K and V, reduce-scatter dK and dV (2). Sinks add one all-gather.
  for (const bool sinks : {false, true}) {
    Case c = make(1, 8, 4, 32, 32, 8, 5, sinks);
    c.causal = true;
    for (const Exchange e : {Exchange::kAllToAll, Exchange::kGather}) {
      const auto devices = run_exchange<double>(c, 4, e, Layout::kChunkPairs);
      for (const auto& dev : devices) {
        ASSERT_EQ(dev.error, "") << exchange_name(e);
        EXPECT_EQ(dev.forward_collectives, e == Exchange::kAllToAll ? 2 : 1) << exchange_name(e);
        EXPECT_EQ(dev.backward_collectives, 2 + (sinks ? 1 : 0)) << exchange_name(e) << (sinks ? " with sinks" : "");
      }
    }
  }
}

TEST(ExchangeTest, ChunkPairPositionsRoundTrip) {
  for (const int n : {1, 2, 3, 4, 8}) {
    std::vector<int> seen(std::size_t(16 * n), 0);
    for (int r = 0; r < n; ++r) {
      auto p = shard_positions(Layout::kChunkPairs, 16 * n, n, r);
      ASSERT_TRUE(p.ok());
      ASSERT_EQ(p.value().size(), 16u);
      EXPECT_EQ(p.value()[0], r * 8);
      EXPECT_EQ(p.value()[8], (2 * n - 1 - r) * 8);
      for (const auto x : p.value()) ++seen[std::size_t(x)];
    }
    for (const int count : seen) EXPECT_EQ(count, 1);
  }
  auto bad = shard_positions(Layout::kChunkPairs, 20, 4, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message,
            "length 20 does not divide by 2 x 4 devices = 8 chunks (the chunk-pair layout; the contiguous layout "
            "takes any length)");
  // Contiguous shards of an uneven length: the first length % N one row longer.
  std::vector<std::size_t> sizes;
  std::int64_t next = 0;
  for (int r = 0; r < 4; ++r) {
    auto p = shard_positions(Layout::kContiguous, 77, 4, r);
    ASSERT_TRUE(p.ok());
    sizes.push_back(p.value().size());
    for (const auto x : p.value()) EXPECT_EQ(x, next++);
  }
  EXPECT_EQ(next, 77);
  EXPECT_EQ(sizes, (std::vector<std::size_t>{20, 19, 19, 19}));
  EXPECT_THAT(shard_positions(Layout::kContiguous, 3, 4, 0).error().message,
              HasSubstr("length 3 is shorter than the 4 devices"));
}

TEST(ExchangeTest, DivisibilityFailuresYieldNoOutput) {
  // Heads that do not divide by N for the all-to-all.
  Case heads = make(1, 6, 2, 16, 16, 8);
  auto devices = run_exchange<float>(heads, 4, Exchange::kAllToAll, Layout::kContiguous);
  for (const auto& dev : devices) {
    EXPECT_THAT(dev.error, HasSubstr("all-to-all: heads 6 do not divide by the 4 devices"));
    for (const float x : dev.out) EXPECT_EQ(x, 7.0f);
  }
  // A length that the chunk-pair layout cannot cut.
  Case length = make(1, 4, 2, 12, 12, 8);
  devices = run_exchange<float>(length, 4, Exchange::kGather, Layout::kChunkPairs);
  for (const auto& dev : devices) {
    EXPECT_THAT(dev.error, HasSubstr("query length 12 does not divide by 2 x 4 devices = 8 chunks"));
  }
  // The all-to-all over an uneven key length (the gather takes it: below).
  Case keys = make(1, 4, 2, 16, 7, 8);
  devices = run_exchange<float>(keys, 2, Exchange::kAllToAll, Layout::kContiguous);
  for (const auto& dev : devices) {
    EXPECT_THAT(dev.error, HasSubstr("all-to-all: query length 16 and key length 7 must both divide by the 2 devices"));
    for (const float x : dev.out) EXPECT_EQ(x, 7.0f);
  }
}

// The gather takes any length: cross attention to a 77-token context, odd
// query lengths, shards that differ by a row.
TEST(ExchangeTest, GatherTakesAnyLength) {
  Case cross = make(1, 4, 2, 16, 77, 8, 15, true);
  check(cross, 2, Layout::kContiguous, /*all_to_all=*/false);
  check(cross, 4, Layout::kContiguous, /*all_to_all=*/false);
  Case odd = make(2, 6, 3, 13, 13, 8, 16);
  odd.causal = true;
  check(odd, 2, Layout::kContiguous, false);
  check(odd, 3, Layout::kContiguous, false);
  Case docs = make(1, 4, 2, 11, 11, 8, 17, true);
  docs.query_segments = documents(1, 11, {4, 7});
  docs.key_segments = docs.query_segments;
  docs.window = Window{3, 0};
  check(docs, 4, Layout::kContiguous, false);
}

}  // namespace
