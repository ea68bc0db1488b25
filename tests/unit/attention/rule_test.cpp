// The exchange rule: the design page's cases, K' for every grouping, the bytes, each
// reason and each error; and the mask parser.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dew/attention.h"
#include "expect_error.h"

namespace {

using dew::ErrorCode;
using dew::attention::Call;
using dew::attention::choose_exchange;
using dew::attention::Exchange;
using dew::attention::GatherKernel;
using dew::attention::MaskKind;
using dew::attention::MaskSpec;
using dew::attention::parse_mask_kind;
using dew::attention::Plan;
using ::testing::HasSubstr;

Call call(int heads, int kv_heads, std::int64_t length, int sequence, MaskKind mask = MaskKind::kNone, int tensor = 1) {
  Call c;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.query_length = c.key_length = length;
  c.sequence = sequence;
  c.tensor = tensor;
  c.mask.kind = mask;
  return c;
}

Plan plan(const Call& c) {
  auto r = choose_exchange(c);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? r.value() : Plan{};
}

// A bad value (kInvalidArgument) or a call no exchange can run
// (kUnsupported): the code, and the one line that names the value.
std::string error(const Call& c, ErrorCode code = ErrorCode::kInvalidArgument) {
  const auto message = dew::testing::message_of(choose_exchange(c), code);
  EXPECT_EQ(message.find('\n'), std::string::npos);
  return message;
}

TEST(ExchangeRuleTest, SeedUnmaskedGroupedQueryGathers) {
  const Plan p = plan(call(32, 8, 4096, 2));
  EXPECT_EQ(p.exchange, Exchange::kGather);
  EXPECT_DOUBLE_EQ(p.all_to_all.units, 40);
  EXPECT_DOUBLE_EQ(p.gather.units, 16);
  EXPECT_EQ(p.repeated_kv_heads, 8);
  EXPECT_THAT(p.reason, HasSubstr("16 against 40"));
  // Bytes per device at head width 128 in bf16: gather 2 x 8 heads x 2048
  // positions; all-to-all 2 x 16 x 2048 + 2 x 4 x 2048 values.
  EXPECT_EQ(p.gather.bytes, 2LL * 8 * 2048 * 128 * 2);
  EXPECT_EQ(p.all_to_all.bytes, (2LL * 16 * 2048 + 2LL * 4 * 2048) * 128 * 2);
}

TEST(ExchangeRuleTest, SeedMaskedCallsTakeTheAllToAll) {
  for (const MaskKind kind : {MaskKind::kCausal, MaskKind::kWindow, MaskKind::kDocuments}) {
    const Plan p = plan(call(32, 8, 4096, 2, kind));
    EXPECT_EQ(p.exchange, Exchange::kAllToAll);
    EXPECT_THAT(p.reason, HasSubstr("dense bias"));
  }
  // The design page's measured shape: 16 query heads, 8 key heads, causal.
  EXPECT_EQ(plan(call(16, 8, 8192, 2, MaskKind::kCausal)).exchange, Exchange::kAllToAll);
}

TEST(ExchangeRuleTest, MaskedCallsOnABlockSkippingGatherKernelGoByBytes) {
  // Dew's CPU kernel skips masked blocks in the gather too: the bytes decide,
  // as for unmasked calls (and as bench/attention_exchange measured).
  for (const MaskKind kind : {MaskKind::kCausal, MaskKind::kWindow, MaskKind::kDocuments}) {
    Call c = call(32, 8, 4096, 2, kind);
    c.gather_kernel = GatherKernel::kSkipsMaskedBlocks;
    const Plan p = plan(c);
    EXPECT_EQ(p.exchange, Exchange::kGather);
    EXPECT_THAT(p.reason, HasSubstr("skips masked blocks"));
    EXPECT_THAT(p.reason, HasSubstr("the gather sends fewer bytes: 16 against 40"));
  }
  // Multi-head attention over 4 devices: the all-to-all sends 2(16 + 16)/4 =
  // 16 against the gather's 32.
  Call c = call(16, 16, 4096, 4, MaskKind::kCausal);
  c.gather_kernel = GatherKernel::kSkipsMaskedBlocks;
  EXPECT_EQ(plan(c).exchange, Exchange::kAllToAll);
  EXPECT_THAT(plan(c).reason, HasSubstr("the all-to-all sends fewer bytes: 16 against 32"));
  // Only one can run: the kernel does not matter.
  c = call(12, 4, 4096, 8, MaskKind::kCausal);
  c.gather_kernel = GatherKernel::kSkipsMaskedBlocks;
  EXPECT_EQ(plan(c).exchange, Exchange::kGather);
}

TEST(ExchangeRuleTest, GatherKernelNames) {
  EXPECT_EQ(dew::attention::parse_gather_kernel("dense-bias").value(), GatherKernel::kDenseBias);
  EXPECT_EQ(dew::attention::parse_gather_kernel("skips-masked-blocks").value(), GatherKernel::kSkipsMaskedBlocks);
  for (const GatherKernel k : {GatherKernel::kDenseBias, GatherKernel::kSkipsMaskedBlocks})
    EXPECT_EQ(dew::attention::parse_gather_kernel(dew::attention::gather_kernel_name(k)).value(), k);
  EXPECT_EQ(dew::testing::invalid_argument_of(dew::attention::parse_gather_kernel("cudnn")),
            "gather kernel: 'cudnn' is not allowed; allowed: dense-bias (cuDNN-like, the design page's rule) or "
            "skips-masked-blocks (Dew's CPU kernel)");
}

TEST(ExchangeRuleTest, RepeatedKeyHeads) {
  // K = N: no repetition.
  Plan p = plan(call(16, 4, 1024, 4));
  EXPECT_EQ(p.repeated_kv_heads, 4);
  EXPECT_DOUBLE_EQ(p.all_to_all.units, 2.0 * (16 + 4) / 4);
  // K < N: four sequence shards over two key heads repeat each twice.
  p = plan(call(32, 2, 1024, 4));
  EXPECT_EQ(p.repeated_kv_heads, 4);
  EXPECT_DOUBLE_EQ(p.all_to_all.units, 18);
  EXPECT_DOUBLE_EQ(p.gather.units, 4);
  EXPECT_EQ(p.exchange, Exchange::kGather);
  // K > N.
  EXPECT_EQ(plan(call(32, 8, 1024, 2)).repeated_kv_heads, 8);
  // MQA: one key head, repeated to N.
  p = plan(call(8, 1, 1024, 4));
  EXPECT_EQ(p.repeated_kv_heads, 4);
  EXPECT_DOUBLE_EQ(p.all_to_all.units, 6);
  EXPECT_DOUBLE_EQ(p.gather.units, 2);
  // H=12, K=4, N=3: each device's 4 query heads straddle two key heads.
  p = plan(call(12, 4, 1200, 3));
  EXPECT_EQ(p.repeated_kv_heads, 6);
  EXPECT_DOUBLE_EQ(p.all_to_all.units, 12);
  EXPECT_DOUBLE_EQ(p.gather.units, 8);
}

TEST(ExchangeRuleTest, EqualBytesTakeTheExchangeWithFewerCalls) {
  // Multi-head attention over two devices, fp32: 2(16 + 16)/2 = 32 units
  // either way. The gather makes one collective call forward, the all-to-all
  // two.
  Call c = call(16, 16, 4096, 2);
  c.bytes_per_value = 4;
  Plan p = plan(c);
  EXPECT_DOUBLE_EQ(p.all_to_all.units, 32);
  EXPECT_DOUBLE_EQ(p.gather.units, 32);
  EXPECT_EQ(p.all_to_all.bytes, p.gather.bytes);
  EXPECT_EQ(p.exchange, Exchange::kGather);
  EXPECT_THAT(p.reason, HasSubstr("both send 32 units"));
  EXPECT_THAT(p.reason, HasSubstr("the gather makes fewer collective calls: 3 against 4"));
  // fp64 reduces in fp64: no more than the forward counts.
  c.bytes_per_value = 8;
  EXPECT_EQ(plan(c).exchange, Exchange::kGather);
  // The same for a causal call on a block-skipping gather kernel.
  c = call(4, 4, 4096, 2, MaskKind::kCausal);
  c.bytes_per_value = 4;
  c.gather_kernel = GatherKernel::kSkipsMaskedBlocks;
  EXPECT_EQ(plan(c).exchange, Exchange::kGather);
  // bf16 values (the default): the gather's fp32 reduce-scatter of dK and dV
  // would send more than the forward counts, so the all-to-all keeps the tie.
  p = plan(call(16, 16, 4096, 2));
  EXPECT_EQ(p.exchange, Exchange::kAllToAll);
  EXPECT_THAT(p.reason, HasSubstr("reduce-scatter dK and dV in fp32, more than 2 bytes per value"));
  // More key heads than the all-to-all sends: it wins outright.
  p = plan(call(4, 4, 4096, 4));
  EXPECT_EQ(p.exchange, Exchange::kAllToAll);
  EXPECT_THAT(p.reason, HasSubstr("the all-to-all sends fewer bytes: 4 against 8"));
}

TEST(ExchangeRuleTest, TensorShardsCountTheirOwnHeads) {
  Plan p = plan(call(32, 8, 4096, 2, MaskKind::kNone, 2));
  EXPECT_EQ(p.shard_heads, 16);
  EXPECT_EQ(p.shard_kv_heads, 4);
  EXPECT_DOUBLE_EQ(p.all_to_all.units, 20);
  EXPECT_DOUBLE_EQ(p.gather.units, 8);
  // Fewer key heads than tensor shards: each shard needs one.
  p = plan(call(32, 2, 4096, 2, MaskKind::kNone, 4));
  EXPECT_EQ(p.shard_kv_heads, 1);
  EXPECT_EQ(p.repeated_kv_heads, 2);
  // Query heads must divide by tensor x sequence for the all-to-all.
  p = plan(call(16, 8, 4096, 4, MaskKind::kCausal, 8));
  EXPECT_EQ(p.exchange, Exchange::kGather);
  EXPECT_THAT(p.reason, HasSubstr("heads 16 / tensor 8 = 2, do not divide by sequence 4"));
}

TEST(ExchangeRuleTest, WhatOnlyTheGatherTakes) {
  // Cross attention to a 77-token context.
  Call cross = call(16, 16, 4096, 2);
  cross.key_length = 77;
  Plan p = plan(cross);
  EXPECT_EQ(p.exchange, Exchange::kGather);
  EXPECT_THAT(p.reason, HasSubstr("the key length 77 does not divide by sequence 2"));
  EXPECT_EQ(p.gather.bytes, 2LL * 16 * 39 * 128 * 2);  // the larger shard: 39 positions
  // An odd length, unmasked.
  p = plan(call(16, 8, 4097, 2));
  EXPECT_EQ(p.exchange, Exchange::kGather);
  EXPECT_THAT(p.reason, HasSubstr("the query length 4097 does not divide by sequence 2"));
  // Head counts the split does not divide, causal, length dividing by 2N.
  p = plan(call(12, 4, 4096, 8, MaskKind::kCausal));
  EXPECT_EQ(p.exchange, Exchange::kGather);
  EXPECT_FALSE(p.all_to_all.can_run);
}

TEST(ExchangeRuleTest, AllToAllWhenTheGatherCannotBalance) {
  // Causal, 4104 = 8 x 513 positions: divides by N = 8 but not by 2N = 16.
  const Plan p = plan(call(16, 8, 4104, 8, MaskKind::kCausal));
  EXPECT_EQ(p.exchange, Exchange::kAllToAll);
  EXPECT_THAT(p.reason, HasSubstr("2 x sequence = 16 chunks, and 4104 does not divide by 16"));
}

TEST(ExchangeRuleTest, SequenceOneRunsTheLocalKernel) {
  const Plan p = plan(call(32, 8, 4097, 1, MaskKind::kCausal));
  EXPECT_EQ(p.exchange, Exchange::kAllToAll);
  EXPECT_THAT(p.reason, HasSubstr("nothing is exchanged"));
  EXPECT_EQ(p.all_to_all.bytes, 0);
  EXPECT_EQ(p.gather.bytes, 0);
}

TEST(ExchangeRuleTest, NeitherCanRun) {
  const auto neither = ErrorCode::kUnsupported;
  EXPECT_EQ(error(call(12, 4, 4097, 8, MaskKind::kCausal), neither),
            "neither exchange can run: all-to-all: the query heads per tensor shard, heads 12 / tensor 1 = 12, "
            "do not divide by sequence 8; gather: a causal call cuts the query length into 2 x sequence = 16 "
            "chunks, and 4097 does not divide by 16");
  EXPECT_THAT(error(call(16, 8, 4102, 4, MaskKind::kDocuments), neither), HasSubstr("4102 does not divide by 8"));
  EXPECT_THAT(error(call(16, 8, 4096, 2, MaskKind::kNone, 3), neither),
              HasSubstr("neither exchange can run: heads 16 do not divide by tensor 3"));
}

TEST(ExchangeRuleTest, ValuesOutOfRange) {
  EXPECT_THAT(error(call(0, 1, 4096, 2)), HasSubstr("heads: '0' is not allowed"));
  EXPECT_THAT(error(call(8, 0, 4096, 2)), HasSubstr("kv_heads: '0' is not allowed"));
  EXPECT_THAT(error(call(8, 3, 4096, 2)), HasSubstr("kv_heads: 3 does not divide heads 8"));
  EXPECT_THAT(error(call(8, 16, 4096, 2)), HasSubstr("kv_heads: 16 does not divide heads 8"));
  EXPECT_THAT(error(call(8, 8, 0, 2)), HasSubstr("query length: '0' is not allowed"));
  Call c = call(8, 8, 4096, 2);
  c.key_length = -5;
  EXPECT_THAT(error(c), HasSubstr("key length: '-5' is not allowed"));
  EXPECT_THAT(error(call(8, 8, 4096, 0)), HasSubstr("sequence: '0' is not allowed"));
  EXPECT_THAT(error(call(8, 8, 4096, 2, MaskKind::kNone, -1)), HasSubstr("tensor: '-1' is not allowed"));
  c = call(8, 8, 4096, 2);
  c.head_dim = 0;
  EXPECT_THAT(error(c), HasSubstr("head width: '0' is not allowed"));
  c = call(8, 8, 4096, 2);
  c.bytes_per_value = 0;
  EXPECT_THAT(error(c), HasSubstr("bytes per value: '0' is not allowed"));
  c = call(8, 8, 4096, 2, MaskKind::kWindow);
  c.mask.window.left = -3;
  EXPECT_THAT(error(c), HasSubstr("mask: 'window=-3,0' is not allowed"));
}

TEST(MaskKindTest, ParsesEveryForm) {
  auto r = parse_mask_kind("none");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().kind, MaskKind::kNone);
  EXPECT_EQ(parse_mask_kind("causal").value().kind, MaskKind::kCausal);
  EXPECT_EQ(parse_mask_kind("documents").value().kind, MaskKind::kDocuments);
  r = parse_mask_kind("window=128");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().kind, MaskKind::kWindow);
  EXPECT_EQ(r.value().window.left, 128);
  EXPECT_EQ(r.value().window.right, 0);
  r = parse_mask_kind("window=64,32");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().window.left, 64);
  EXPECT_EQ(r.value().window.right, 32);
  for (const char* text : {"none", "causal", "documents", "window=128", "window=64,32", "window=0,0"}) {
    EXPECT_EQ(dew::attention::format_mask_kind(parse_mask_kind(text).value()),
              std::string(text) == "window=0,0" ? "window=0" : text);
  }
}

TEST(MaskKindTest, RefusesEverythingElse) {
  for (const char* text : {"", "Causal", "window", "window=", "window=a", "window=5,", "window=,5", "window=-1",
                           "window=1,2,3", "window=1099511627777", "window=99999999999999", "causal ", "bias"}) {
    EXPECT_EQ(dew::testing::invalid_argument_of(parse_mask_kind(text)),
              "mask: '" + std::string(text) +
                  "' is not allowed; allowed: none, causal, documents, window=W (W positions "
                  "back) or window=LEFT,RIGHT (whole numbers up to 2^40)");
  }
}

}  // namespace
