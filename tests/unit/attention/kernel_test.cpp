// The blocked kernels against the naive double-precision reference, which is
// itself checked against finite differences: every mask, grouped and
// multi-query heads, sinks, bias, fully masked rows, unequal lengths, shards
// at global positions; and every validation error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>

#include "dew/attention.h"
#include "reference.h"

namespace {

using dew::attention::backward;
using dew::attention::Dims;
using dew::attention::forward;
using dew::attention::Gradients;
using dew::attention::Stats;
using dew::attention::Window;
using dew::attention::testing::Bound;
using dew::attention::testing::Case;
using dew::attention::testing::documents;
using dew::attention::testing::Grads;
using dew::attention::testing::Outputs;
using dew::attention::testing::reference_backward;
using dew::attention::testing::reference_forward;
using dew::attention::testing::relative_error;
using ::testing::HasSubstr;

template <typename T>
struct KernelRun {
  std::vector<T> out, lse, dq, dk, dv, ds;
  Stats forward_stats, backward_stats;
};

// Forward and backward of the kernel in T on the case.
template <typename T>
KernelRun<T> run(const Case& c) {
  Bound<T> bound(c);
  const Dims& d = c.dims;
  KernelRun<T> r;
  r.out.assign(bound.q.size(), T(7));  // garbage the kernel must overwrite
  r.lse.assign(std::size_t(std::int64_t(d.batch) * d.heads * d.query_length), T(7));
  auto f = forward<T>(bound.inputs, r.out.data(), r.lse.data());
  EXPECT_TRUE(f.ok()) << f.error().message;
  if (!f.ok()) return r;
  r.forward_stats = f.value();
  r.dq.assign(bound.q.size(), T(7));
  r.dk.assign(bound.k.size(), T(7));
  r.dv.assign(bound.v.size(), T(7));
  r.ds.assign(c.sinks ? std::size_t(d.heads) : 0, T(7));
  Gradients<T> g{r.dq.data(), r.dk.data(), r.dv.data(), c.sinks ? r.ds.data() : nullptr};
  auto bw = backward<T>(bound.inputs, r.out.data(), r.lse.data(), bound.d_out.data(), g);
  EXPECT_TRUE(bw.ok()) << bw.error().message;
  if (bw.ok()) r.backward_stats = bw.value();
  return r;
}

template <typename T>
void expect_close(const KernelRun<T>& r, const Outputs& fwd, const Grads& grads, double tolerance) {
  EXPECT_LE(relative_error(r.out, fwd.out), tolerance) << "out";
  EXPECT_LE(relative_error(r.lse, fwd.lse), tolerance) << "lse";
  EXPECT_LE(relative_error(r.dq, grads.dq), tolerance) << "dq";
  EXPECT_LE(relative_error(r.dk, grads.dk), tolerance) << "dk";
  EXPECT_LE(relative_error(r.dv, grads.dv), tolerance) << "dv";
  if (!grads.ds.empty() && !r.ds.empty()) {
    EXPECT_LE(relative_error(r.ds, grads.ds), tolerance) << "d sinks";
  }
}

// fp32 within 1e-5 and fp64 within 1e-12 of the reference, forward and
// backward; no NaN anywhere.
void check(const Case& c) {
  const Outputs fwd = reference_forward(c);
  const Grads grads = reference_backward(c, fwd);
  const KernelRun<float> f = run<float>(c);
  expect_close(f, fwd, grads, 1e-5);
  const KernelRun<double> d = run<double>(c);
  expect_close(d, fwd, grads, 1e-12);
  for (const auto* values : {&f.out, &f.dq, &f.dk, &f.dv, &f.ds})
    for (const float x : *values) ASSERT_FALSE(std::isnan(x));
}

Case make_case(int batch, int heads, int kv_heads, std::int64_t lq, std::int64_t lk, int head_dim) {
  Case c;
  c.dims = Dims{batch, heads, kv_heads, lq, lk, head_dim};
  return c;
}

Case filled(Case c, unsigned seed = 1) {
  dew::attention::testing::fill(c, seed);
  return c;
}

// ---------------------------------------------------------------------------
// The reference against central finite differences of sum(out o d_out).

void finite_differences(Case c) {
  c = filled(c, 3);
  const Outputs fwd = reference_forward(c);
  const Grads grads = reference_backward(c, fwd);
  auto loss = [&](const Case& x) {
    const Outputs o = reference_forward(x);
    return std::inner_product(o.out.begin(), o.out.end(), x.d_out.begin(), 0.0);
  };
  const double step = 1e-6;
  auto probe = [&](std::vector<double> Case::*field, const std::vector<double>& analytic, const char* name) {
    for (std::size_t i = 0; i < analytic.size(); ++i) {
      Case plus = c, minus = c;
      (plus.*field)[i] += step;
      (minus.*field)[i] -= step;
      const double numeric = (loss(plus) - loss(minus)) / (2 * step);
      EXPECT_NEAR(analytic[i], numeric, 1e-7 * (1 + std::abs(numeric))) << name << "[" << i << "]";
    }
  };
  probe(&Case::q, grads.dq, "dq");
  probe(&Case::k, grads.dk, "dk");
  probe(&Case::v, grads.dv, "dv");
  if (c.sinks) probe(&Case::s, grads.ds, "d sinks");
}

TEST(AttentionReferenceTest, GradientsMatchFiniteDifferences) {
  Case plain = make_case(1, 2, 1, 5, 7, 3);
  finite_differences(plain);
  Case masked = make_case(2, 4, 2, 6, 6, 3);
  masked.causal = true;
  masked.sinks = true;
  masked.bias = true;
  finite_differences(masked);
  Case window = make_case(1, 2, 2, 7, 5, 2);
  window.window = Window{2, 1};
  window.sinks = true;
  window.query_segments = documents(1, 7, {3, 4});
  window.key_segments = documents(1, 5, {2, 3});
  finite_differences(window);
}

// ---------------------------------------------------------------------------
// Kernel against reference.

TEST(AttentionKernelTest, MultiHead) { check(filled(make_case(2, 3, 3, 37, 37, 8))); }

TEST(AttentionKernelTest, GroupedQuery) { check(filled(make_case(2, 6, 2, 40, 33, 8))); }

TEST(AttentionKernelTest, MultiQuery) { check(filled(make_case(1, 4, 1, 29, 45, 16))); }

TEST(AttentionKernelTest, OneBlockEachAndBlocksOfOne) {
  Case big = filled(make_case(1, 2, 1, 20, 30, 4));
  big.query_block = 128;
  big.key_block = 128;
  check(big);
  Case tiny = filled(make_case(1, 2, 1, 9, 7, 4));
  tiny.causal = true;
  tiny.query_block = 1;
  tiny.key_block = 1;
  check(tiny);
}

TEST(AttentionKernelTest, Causal) {
  Case c = filled(make_case(2, 4, 2, 64, 64, 8));
  c.causal = true;
  check(c);
  // 4 x 4 blocks of 16: 6 above the diagonal are skipped, 4 on it cut.
  const KernelRun<float> r = run<float>(c);
  EXPECT_EQ(r.forward_stats.skipped, 2 * 4 * 6);
  EXPECT_EQ(r.forward_stats.partial, 2 * 4 * 4);
  EXPECT_EQ(r.forward_stats.full, 2 * 4 * 6);
  EXPECT_EQ(r.backward_stats.skipped, r.forward_stats.skipped);
}

TEST(AttentionKernelTest, CausalBottomRightFewerQueries) {
  Case c = filled(make_case(1, 2, 2, 20, 50, 8));
  c.causal = true;
  check(c);
}

TEST(AttentionKernelTest, CausalBottomRightMoreQueriesMasksTheFirstRowsFully) {
  Case c = filled(make_case(1, 2, 1, 50, 20, 8));
  c.causal = true;  // rows 0..29 see no key
  check(c);
  const KernelRun<float> r = run<float>(c);
  for (int i = 0; i < 30; ++i) {
    EXPECT_EQ(r.lse[std::size_t(i)], -std::numeric_limits<float>::infinity());
    for (int e = 0; e < 8; ++e) EXPECT_EQ(r.out[std::size_t(i * 8 + e)], 0.0f);
  }
}

TEST(AttentionKernelTest, SlidingWindowLeftOnly) {
  Case c = filled(make_case(1, 2, 1, 70, 70, 8));
  c.window = Window{5, 0};
  check(c);
  c.causal = true;  // causal and (w, 0) are the same rule
  check(c);
}

TEST(AttentionKernelTest, SlidingWindowBothSides) {
  Case c = filled(make_case(2, 2, 2, 48, 48, 8));
  c.window = Window{7, 7};
  check(c);
  const KernelRun<float> r = run<float>(c);
  EXPECT_GT(r.forward_stats.skipped, 0);
}

TEST(AttentionKernelTest, WindowWiderThanTheSequence) {
  Case c = filled(make_case(1, 2, 1, 33, 33, 8));
  c.window = Window{1000, 0};
  check(c);
  c.window = Window{1000, 1000};
  check(c);
}

TEST(AttentionKernelTest, WindowWithUnequalLengths) {
  Case c = filled(make_case(1, 2, 1, 24, 40, 8));
  c.window = Window{6, 2};
  check(c);
}

TEST(AttentionKernelTest, PackedDocuments) {
  Case c = filled(make_case(2, 4, 2, 60, 60, 8));
  c.query_segments = documents(2, 60, {5, 17, 30, 8});
  c.key_segments = c.query_segments;
  check(c);
  c.causal = true;
  check(c);
  const KernelRun<float> r = run<float>(c);
  EXPECT_GT(r.forward_stats.skipped, 2 * 4 * 6);  // more than causal alone
}

TEST(AttentionKernelTest, DocumentsWithoutAMatchingKeyAreFullyMasked) {
  Case c = filled(make_case(1, 2, 1, 10, 12, 4));
  c.query_segments = {0, 0, 0, 9, 9, 1, 1, 9, 2, 2};
  c.key_segments = {0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2};
  check(c);
  c.sinks = true;
  c = filled(c);
  check(c);
}

TEST(AttentionKernelTest, AdditiveBias) {
  Case c = filled(make_case(2, 2, 1, 30, 26, 8));
  c.bias = true;
  c = filled(c);
  check(c);
  c.causal = true;
  check(c);
}

TEST(AttentionKernelTest, BiasBroadcastOverBatchAndHeads) {
  // One lq x lk matrix for every batch entry and head, through strides of 0.
  Case c = filled(make_case(2, 2, 2, 12, 10, 4));
  c.bias = true;
  c = filled(c);
  for (std::size_t i = 0; i < c.b.size(); ++i) c.b[i] = c.b[i % (12 * 10)];
  const Outputs fwd = reference_forward(c);
  Bound<float> bound(c);
  bound.inputs.bias.batch_stride = 0;
  bound.inputs.bias.head_stride = 0;
  std::vector<float> out(bound.q.size()), lse(std::size_t(2 * 2 * 12));
  ASSERT_TRUE(forward<float>(bound.inputs, out.data(), lse.data()).ok());
  EXPECT_LE(relative_error(out, fwd.out), 1e-5);
}

TEST(AttentionKernelTest, Sinks) {
  Case c = make_case(2, 4, 2, 35, 35, 8);
  c.sinks = true;
  check(filled(c));
  c.causal = true;
  check(filled(c, 2));
}

TEST(AttentionKernelTest, WindowWithSinks) {
  Case c = make_case(1, 4, 1, 50, 50, 8);
  c.window = Window{4, 0};
  c.sinks = true;
  check(filled(c));
  c.window = Window{3, 3};
  check(filled(c, 5));
}

TEST(AttentionKernelTest, LargeSinkDominates) {
  Case c = filled(make_case(1, 2, 1, 20, 20, 4));
  c.sinks = true;
  c = filled(c);
  c.s = {30.0, -30.0};
  check(c);
}

TEST(AttentionKernelTest, NoKeysAtAll) {
  Case c = filled(make_case(1, 2, 1, 5, 0, 4));
  check(c);
  c.sinks = true;
  c = filled(c);
  check(c);
}

TEST(AttentionKernelTest, DefaultBlocksOnLongerRows) {
  Case c = make_case(1, 2, 1, 300, 300, 64);
  c.query_block = 128;
  c.key_block = 128;
  c.causal = true;
  c.sinks = true;
  check(filled(c));
  c.causal = false;
  c.sinks = false;
  c.window = Window{100, 20};
  check(filled(c, 4));
}

TEST(AttentionKernelTest, ExplicitScale) {
  Case c = filled(make_case(1, 2, 1, 20, 20, 8));
  c.scale = 0.9;
  check(c);
}

TEST(AttentionKernelTest, LargeLogitsStayFinite) {
  Case c = make_case(1, 2, 1, 40, 40, 16);
  dew::attention::testing::fill(c, 9, 6.0);  // logits up to ~144
  c.causal = true;
  check(c);
}

// A shard at global positions: the 2N-chunk reorder (device i of N holds
// query chunks i and 2N-1-i), keys whole, computed alone; its rows must equal
// those of the whole-sequence call.
TEST(AttentionKernelTest, ChunkReorderedShardEqualsTheWholeSequenceRows) {
  const std::int64_t length = 64, chunk = 8;  // N = 4: 2N = 8 chunks of 8
  for (const int masking : {0, 1, 2}) {
    Case whole = make_case(2, 4, 2, length, length, 8);
    whole.causal = masking == 0;
    if (masking == 1) whole.window = Window{10, 3};
    if (masking == 2) {
      whole.causal = true;
      whole.query_segments = documents(2, length, {11, 20, 13, 20});
      whole.key_segments = whole.query_segments;
    }
    whole.sinks = true;
    whole = filled(whole);
    const Outputs full = reference_forward(whole);
    const Grads full_grads = reference_backward(whole, full);
    for (int device = 0; device < 4; ++device) {
      std::vector<std::int64_t> rows;
      for (const int which : {device, 7 - device})
        for (std::int64_t i = 0; i < chunk; ++i) rows.push_back(which * chunk + i);
      Case shard = whole;
      shard.dims.query_length = std::int64_t(rows.size());
      shard.query_positions = rows;
      shard.whole_query_length = length;
      shard.whole_key_length = length;
      shard.query_block = 4;
      shard.key_block = 8;
      shard.q.clear();
      shard.d_out.clear();
      if (!whole.query_segments.empty()) shard.query_segments.clear();
      for (int b = 0; b < 2; ++b) {
        for (const std::int64_t row : rows)
          if (!whole.query_segments.empty())
            shard.query_segments.push_back(whole.query_segments[std::size_t(b * length + row)]);
        for (int h = 0; h < 4; ++h)
          for (const std::int64_t row : rows)
            for (int e = 0; e < 8; ++e) {
              const std::size_t at = std::size_t(((b * 4 + h) * length + row) * 8 + e);
              shard.q.push_back(whole.q[at]);
              shard.d_out.push_back(whole.d_out[at]);
            }
      }
      check(shard);  // the kernel against the reference at these positions
      const Outputs part = reference_forward(shard);
      for (int b = 0; b < 2; ++b)
        for (int h = 0; h < 4; ++h)
          for (std::size_t r = 0; r < rows.size(); ++r) {
            const std::size_t from = std::size_t((b * 4 + h) * length + rows[r]);
            const std::size_t to = std::size_t((b * 4 + h) * std::int64_t(rows.size())) + r;
            ASSERT_NEAR(part.lse[to], full.lse[from], 1e-12);
            for (int e = 0; e < 8; ++e) ASSERT_NEAR(part.out[to * 8 + e], full.out[from * 8 + e], 1e-12);
          }
    }
    (void)full_grads;
  }
}

// ---------------------------------------------------------------------------
// Validation: one line naming the value.

std::string forward_error(const std::function<void(Bound<float>&)>& spoil, Case c = make_case(1, 4, 2, 8, 8, 4)) {
  c = filled(c);
  Bound<float> bound(c);
  spoil(bound);
  std::vector<float> out(bound.q.size() + 64), lse(64);
  auto r = forward<float>(bound.inputs, out.data(), lse.data());
  EXPECT_FALSE(r.ok());
  if (r.ok()) return "";
  EXPECT_EQ(r.error().message.find('\n'), std::string::npos);
  return r.error().message;
}

TEST(AttentionValidationTest, Dimensions) {
  EXPECT_THAT(forward_error([](Bound<float>& b) { b.inputs.dims.kv_heads = 3; }),
              HasSubstr("heads 4 is not a multiple of kv_heads 3"));
  EXPECT_THAT(forward_error([](Bound<float>& b) { b.inputs.dims.kv_heads = 0; }), HasSubstr("kv_heads 0"));
  EXPECT_THAT(forward_error([](Bound<float>& b) { b.inputs.dims.heads = -2; }), HasSubstr("heads -2"));
  EXPECT_THAT(forward_error([](Bound<float>& b) { b.inputs.dims.batch = 0; }), HasSubstr("batch 0"));
  EXPECT_THAT(forward_error([](Bound<float>& b) { b.inputs.dims.head_dim = 0; }), HasSubstr("head_dim 0"));
  EXPECT_THAT(forward_error([](Bound<float>& b) { b.inputs.dims.query_length = -1; }), HasSubstr("query_length -1"));
  EXPECT_THAT(forward_error([](Bound<float>& b) { b.inputs.query_block = 0; }), HasSubstr("query_block 0"));
  EXPECT_THAT(forward_error([](Bound<float>& b) { b.inputs.key_block = -3; }), HasSubstr("key_block -3"));
  EXPECT_THAT(forward_error([](Bound<float>& b) { b.inputs.scale = -1; }), HasSubstr("scale -1"));
  EXPECT_THAT(forward_error([](Bound<float>& b) { b.inputs.value = nullptr; }), HasSubstr("null pointer"));
}

TEST(AttentionValidationTest, Window) {
  EXPECT_THAT(forward_error([](Bound<float>& b) {
                b.inputs.mask.window = Window{-1, 0};
              }),
              HasSubstr("window left -1 is not allowed"));
  EXPECT_THAT(forward_error([](Bound<float>& b) {
                b.inputs.mask.window = Window{2, -5};
              }),
              HasSubstr("window right -5 is not allowed"));
  EXPECT_THAT(forward_error([](Bound<float>& b) {
                b.inputs.mask.window = Window{std::int64_t{1} << 41, 0};
              }),
              HasSubstr("window left 2199023255552"));
}

TEST(AttentionValidationTest, PositionsAndSegments) {
  const std::vector<std::int64_t> three = {0, 1, 2};
  const std::vector<std::int64_t> bad = {0, 1, 2, 3, 4, 5, 6, 99};
  const std::vector<std::int32_t> seg = {0, 0, 0, 0, 1, 1, 1, 1};
  EXPECT_THAT(forward_error([&](Bound<float>& b) { b.inputs.mask.positions.query = three; }),
              HasSubstr("positions.query with size 3"));
  EXPECT_THAT(forward_error([&](Bound<float>& b) { b.inputs.mask.positions.key = three; }),
              HasSubstr("positions.key with size 3"));
  EXPECT_THAT(forward_error([&](Bound<float>& b) { b.inputs.mask.positions.query = bad; }),
              HasSubstr("query position 99"));
  EXPECT_THAT(forward_error([&](Bound<float>& b) {
                b.inputs.mask.positions.key = bad;
                b.inputs.mask.positions.whole_key_length = 50;
              }),
              HasSubstr("key position 99 is not allowed; allowed: 0 to whole_key_length - 1 = 49"));
  EXPECT_THAT(forward_error([&](Bound<float>& b) { b.inputs.mask.positions.whole_query_length = -7; }),
              HasSubstr("whole_query_length -7"));
  EXPECT_THAT(forward_error([&](Bound<float>& b) { b.inputs.mask.query_segments = seg; }),
              HasSubstr("segments given for queries only"));
  EXPECT_THAT(forward_error([&](Bound<float>& b) {
                b.inputs.mask.query_segments = std::span<const std::int32_t>(seg).first(5);
                b.inputs.mask.key_segments = seg;
              }),
              HasSubstr("query_segments with size 5"));
}

TEST(AttentionValidationTest, BiasStridesAndBackwardArguments) {
  const std::vector<float> bias(64 * 8, 0.0f);
  EXPECT_THAT(forward_error([&](Bound<float>& b) {
                b.inputs.bias.data = bias.data();
                b.inputs.bias.row_stride = -2;
              }),
              HasSubstr("bias strides -1, -1, -2"));
  Case c = filled(make_case(1, 2, 1, 4, 4, 4));
  Bound<float> bound(c);
  std::vector<float> out(bound.q.size()), lse(8), dq(bound.q.size()), dk(bound.k.size()), dv(bound.v.size()), ds(2);
  ASSERT_TRUE(forward<float>(bound.inputs, out.data(), lse.data()).ok());
  auto r = backward<float>(bound.inputs, out.data(), lse.data(), bound.d_out.data(),
                           Gradients<float>{dq.data(), dk.data(), dv.data(), ds.data()});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("sinks gradient was asked for a call without sinks"));
  r = backward<float>(bound.inputs, out.data(), nullptr, bound.d_out.data(),
                      Gradients<float>{dq.data(), dk.data(), dv.data(), nullptr});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("null pointer"));
}

TEST(AttentionValidationTest, AllowedPairsCountsTheMask) {
  Dims dims{2, 1, 1, 10, 10, 4};
  dew::attention::Mask mask;
  EXPECT_EQ(dew::attention::allowed_pairs(mask, dims), 200);
  mask.causal = true;
  EXPECT_EQ(dew::attention::allowed_pairs(mask, dims), 110);
  mask.window = Window{-1, 0};
  EXPECT_EQ(dew::attention::allowed_pairs(mask, dims), 0);
}

}  // namespace
