// The worker's model on one device, checked against finite differences in
// fp64: every parameter kind's gradient, the loss at the start, the data.
#include "model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "data.h"
#include "dew/attention.h"
#include "layout.h"
#include "ops.h"
#include "params.h"

namespace dew::train {
namespace {

// One device, the whole sequence: attention on the spot, no tensor axis.
class Local final : public Collectives<double> {
 public:
  Local(int batch, int heads, int kv_heads, int length, int head)
      : dims_{batch, heads, kv_heads, length, length, head} {}
  Result<Done> tensor_sum(std::span<double>) override { return Done{}; }
  Result<Done> attention_forward(const AttentionTensors<double>& in, double* out, double* lse) override {
    auto r = attention::forward<double>(inputs(in), out, lse);
    return r.ok() ? Result<Done>(Done{}) : Result<Done>(r.error());
  }
  Result<Done> attention_backward(const AttentionTensors<double>& in, const double* out, const double* lse,
                                  const double* d_out, double* dq, double* dk, double* dv) override {
    auto r = attention::backward<double>(inputs(in), out, lse, d_out, {dq, dk, dv, nullptr});
    return r.ok() ? Result<Done>(Done{}) : Result<Done>(r.error());
  }

 private:
  attention::Inputs<double> inputs(const AttentionTensors<double>& in) const {
    attention::Inputs<double> i;
    i.dims = dims_;
    i.query = in.query;
    i.key = in.key;
    i.value = in.value;
    i.mask.causal = true;
    return i;
  }
  attention::Dims dims_;
};

struct SmallModel {
  WorkerOptions options;
  std::vector<std::vector<ParamSpec>> buckets;
  std::vector<std::vector<double>> params;
  Batch batch;
  DeviceShape shape;
};

SmallModel small() {
  SmallModel s;
  s.options.model = ModelConfig{11, 8, 2, 2, 1, 6, 5};
  s.options.batch = 2;
  s.buckets = model_buckets(s.options.model);
  for (const auto& bucket : s.buckets) {
    std::vector<double> flat;
    for (const auto& spec : bucket) {
      // Gains away from 1, so that their gradients are not special.
      auto part = initial_part<double>(spec, 0, 1, 5);
      if (spec.gain)
        for (std::size_t i = 0; i < part.size(); ++i) part[i] = 1 + 0.1 * double(i % 3);
      flat.insert(flat.end(), part.begin(), part.end());
    }
    s.params.push_back(std::move(flat));
  }
  std::vector<std::int64_t> positions;
  for (int p = 0; p < s.options.model.length; ++p) positions.push_back(p);
  s.batch = batch_of(s.options, 0, 0, 2, positions);
  s.shape = DeviceShape{2, s.options.model.length, 1, positions};
  return s;
}

// The loss and (into grads) its gradient.
double loss_of(const SmallModel& s, const std::vector<std::vector<double>>& params,
               std::vector<std::vector<double>>* grads) {
  const ModelConfig& m = s.options.model;
  Local local(2, m.heads, m.kv_heads, m.length, m.width / m.heads);
  std::vector<std::vector<double>> g;
  std::vector<std::span<const double>> p;
  std::vector<std::span<double>> gv;
  for (const auto& bucket : params) {
    g.emplace_back(bucket.size(), 0.0);
    p.emplace_back(bucket);
  }
  for (auto& x : g) gv.emplace_back(x);
  const double scale = 1.0 / (2 * m.length);
  auto loss = forward_backward<double>(m, s.shape, s.buckets, p, s.batch.tokens, s.batch.targets, scale, gv, local);
  EXPECT_TRUE(loss.ok());
  if (grads) *grads = g;
  return loss.value() * scale;
}

TEST(Model, GradientsMatchFiniteDifferencesForEveryParameter) {
  SmallModel s = small();
  std::vector<std::vector<double>> grads;
  loss_of(s, s.params, &grads);
  for (std::size_t b = 0; b < s.buckets.size(); ++b) {
    const BucketLayout layout = bucket_layout(s.buckets[b], 1);
    for (std::size_t i = 0; i < s.buckets[b].size(); ++i) {
      SCOPED_TRACE(s.buckets[b][i].name);
      // Three elements of each parameter.
      const auto size = local_size(s.buckets[b][i], 1);
      for (std::int64_t k : {std::int64_t(0), size / 2, size - 1}) {
        const std::size_t at = std::size_t(layout.offsets[i] + k);
        auto plus = s.params, minus = s.params;
        const double h = 1e-5;
        plus[b][at] += h;
        minus[b][at] -= h;
        const double numeric = (loss_of(s, plus, nullptr) - loss_of(s, minus, nullptr)) / (2 * h);
        EXPECT_NEAR(grads[b][at], numeric, 1e-7 + 1e-5 * std::abs(numeric)) << "element " << k;
      }
    }
  }
}

TEST(Model, AnUntrainedModelGuessesUniformly) {
  SmallModel s = small();
  // Small weights: the logits start near 0, the loss near ln(vocab).
  EXPECT_NEAR(loss_of(s, s.params, nullptr), std::log(11.0), 0.05);
}

TEST(Data, TheSameTokensWhateverThePartAsked) {
  WorkerOptions o;
  const std::vector<std::int64_t> all = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const Batch whole = batch_of(o, 3, 0, 8, all);
  const Batch part = batch_of(o, 3, 4, 2, {8, 9, 10, 11});
  for (int seq = 0; seq < 2; ++seq)
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(part.tokens[std::size_t(seq * 4 + i)], whole.tokens[std::size_t((4 + seq) * 16 + 8 + i)]);
      EXPECT_EQ(part.targets[std::size_t(seq * 4 + i)], whole.targets[std::size_t((4 + seq) * 16 + 8 + i)]);
    }
  // The rule holds where no token was drawn: next = 3 x token + 1.
  int kept = 0;
  for (std::size_t i = 0; i < whole.tokens.size(); ++i) kept += whole.targets[i] == (3 * whole.tokens[i] + 1) % 64;
  EXPECT_GT(kept, int(whole.tokens.size()) * 7 / 10);
}

TEST(Params, EveryTensorRanksPartIsTheWholesSlice) {
  const ModelConfig m;
  for (const auto& bucket : model_buckets(m)) {
    for (const auto& spec : bucket) {
      SCOPED_TRACE(spec.name);
      const auto whole = initial_part<double>(spec, 0, 1, 9);
      for (int t = 0; t < 2; ++t) {
        const auto part = initial_part<double>(spec, t, 2, 9);
        const int rows = local_rows(spec, 2), cols = local_cols(spec, 2);
        for (int r = 0; r < rows; ++r)
          for (int c = 0; c < cols; ++c) {
            const int row = spec.split == Split::kRows ? t * rows + r : r;
            const int col = spec.split == Split::kColumns ? t * cols + c : c;
            ASSERT_EQ(part[std::size_t(r) * cols + c], whole[std::size_t(row) * spec.cols + col]);
          }
      }
    }
  }
}

// Issue 26: a huge model ended in a bare std::bad_alloc. plan_layout now
// refuses it before anything is allocated, with the estimate and the
// machine's memory; the default model and a sharded big one still pass.
TEST(Layout, AModelTheMachineCannotHoldIsRefusedBeforeAnyAllocation) {
  WorkerOptions huge;
  huge.model.width = 1 << 20;
  huge.model.mlp = 1 << 20;
  auto refused = plan_layout(huge, 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument);
  EXPECT_THAT(refused.error().message, ::testing::MatchesRegex("the model needs about [0-9]+ GiB on each process \\(1 "
                                                               "device: .*\\), more than this machine's [0-9]+ GiB; "
                                                               "allowed: a smaller --width.*"));
  EXPECT_TRUE(plan_layout(WorkerOptions{}, 1).ok());
  // Issue 26: --learning-rate nan trained NaN to the end and exited 0.
  for (double bad : {std::nan(""), 0.0, -1.0, std::numeric_limits<double>::infinity()}) {
    WorkerOptions o;
    o.learning_rate = bad;
    auto refused_rate = plan_layout(o, 1);
    ASSERT_FALSE(refused_rate.ok()) << bad;
    EXPECT_THAT(refused_rate.error().message, ::testing::EndsWith("is not allowed; allowed: a finite number above 0"));
  }
  // Sharding divides the estimate: fsdp=8 over 8 devices holds an eighth of the state each.
  WorkerOptions one, sharded;
  one.model.width = sharded.model.width = 1024;
  sharded.mesh = "fsdp=8";
  sharded.devices_per_process = 8;
  auto m1 = plan_layout(one, 1), m8 = plan_layout(sharded, 1);
  ASSERT_TRUE(m1.ok() && m8.ok());
  EXPECT_LT(estimated_process_bytes(sharded, m8.value()) / 8, estimated_process_bytes(one, m1.value()) / 2);
}

}  // namespace
}  // namespace dew::train
