// One device's run: its place and communicators, its parameter and optimizer
// shards, and every step: gather each bucket over fsdp, the pass, the
// gradients summed over sequence, reduce-scattered over fsdp and summed over
// data, AdamW on the shard.
#include "device.h"

#include <chrono>
#include <cmath>
#include <map>
#include <memory>

#include "dew/attention.h"
#include "dew/comm.h"
#include "dew/exchange.h"
#include "data.h"
#include "layout.h"
#include "model.h"
#include "params.h"

namespace dew::train {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds spent per kind of work in one step.
struct Split {
  std::map<std::string, double> seconds;
  template <typename F>
  auto time(const std::string& what, F&& work) {
    const auto start = Clock::now();
    auto result = work();
    seconds[what] += std::chrono::duration<double>(Clock::now() - start).count();
    return result;
  }
};

// The layout's collectives as the model asks for them.
template <typename T>
class LayoutCollectives final : public Collectives<T> {
 public:
  LayoutCollectives(comm::Communicator* tensor, comm::Communicator* sequence, attention::Exchange exchange,
                    attention::Dims local, attention::Dims whole, Split& split)
      : tensor_(tensor), sequence_(sequence), exchange_(exchange), local_(local), whole_(whole), split_(split) {}

  Result<Done> tensor_sum(std::span<T> data) override {
    if (!tensor_) return Done{};
    return split_.time("all_reduce tensor", [&] { return tensor_->all_reduce(data); });
  }

  Result<Done> attention_forward(const AttentionTensors<T>& in, T* out, T* lse) override {
    if (!sequence_) {
      auto r = attention::forward<T>(inputs(in), out, lse);
      return r.ok() ? Result<Done>(Done{}) : Result<Done>(r.error());
    }
    auto r = split_.time("attention exchange sequence",
                         [&] { return attention::exchange_forward<T>(exchange_, *sequence_, call(in), out, lse); });
    return r.ok() ? Result<Done>(Done{}) : Result<Done>(r.error());
  }

  Result<Done> attention_backward(const AttentionTensors<T>& in, const T* out, const T* lse, const T* d_out,
                                  T* d_query, T* d_key, T* d_value) override {
    const attention::Gradients<T> gradients{d_query, d_key, d_value, nullptr};
    if (!sequence_) {
      auto r = attention::backward<T>(inputs(in), out, lse, d_out, gradients);
      return r.ok() ? Result<Done>(Done{}) : Result<Done>(r.error());
    }
    auto r = split_.time("attention exchange sequence", [&] {
      return attention::exchange_backward<T>(exchange_, *sequence_, call(in), out, lse, d_out, gradients);
    });
    return r.ok() ? Result<Done>(Done{}) : Result<Done>(r.error());
  }

 private:
  // The whole sequence on this device: causal attention of its heads.
  attention::Inputs<T> inputs(const AttentionTensors<T>& in) const {
    attention::Inputs<T> i;
    i.dims = local_;
    i.query = in.query;
    i.key = in.key;
    i.value = in.value;
    i.mask.causal = true;
    return i;
  }
  attention::ShardCall<T> call(const AttentionTensors<T>& in) const {
    attention::ShardCall<T> c;
    c.dims = whole_;
    c.layout = attention::Layout::kContiguous;
    c.query = in.query;
    c.key = in.key;
    c.value = in.value;
    c.causal = true;
    return c;
  }
  comm::Communicator* tensor_;
  comm::Communicator* sequence_;
  attention::Exchange exchange_;
  attention::Dims local_, whole_;
  Split& split_;
};

// One bucket's share on this device: the fsdp shard of its (tensor rank's)
// flat parameters, padded to a multiple of the fsdp size, and AdamW's state.
template <typename T>
struct Shard {
  std::int64_t size = 0;  // the whole flat bucket (this tensor rank's parts)
  std::int64_t chunk = 0;  // one fsdp rank's share of it, padded
  std::vector<T> params, m, v;
};

template <typename T>
std::vector<Shard<T>> initial_shards(const std::vector<std::vector<ParamSpec>>& buckets, const DevicePlace& p,
                                     std::uint64_t seed) {
  std::vector<Shard<T>> shards;
  for (const auto& bucket : buckets) {
    std::vector<T> flat;
    for (const auto& spec : bucket) {
      const auto part = initial_part<T>(spec, p.tensor.rank, p.tensor.size, seed);
      flat.insert(flat.end(), part.begin(), part.end());
    }
    Shard<T> s;
    s.size = std::int64_t(flat.size());
    s.chunk = (s.size + p.fsdp.size - 1) / p.fsdp.size;
    flat.resize(std::size_t(s.chunk * p.fsdp.size), T(0));
    s.params.assign(flat.begin() + s.chunk * p.fsdp.rank, flat.begin() + s.chunk * (p.fsdp.rank + 1));
    s.m.assign(s.params.size(), T(0));
    s.v.assign(s.params.size(), T(0));
    shards.push_back(std::move(s));
  }
  return shards;
}

template <typename T>
void adamw(const WorkerOptions& o, int step, std::span<const T> grad, Shard<T>& s) {
  const double correct1 = 1 - std::pow(o.beta1, step), correct2 = 1 - std::pow(o.beta2, step);
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    s.m[i] = T(o.beta1 * s.m[i] + (1 - o.beta1) * grad[i]);
    s.v[i] = T(o.beta2 * s.v[i] + (1 - o.beta2) * double(grad[i]) * grad[i]);
    const double update = (s.m[i] / correct1) / (std::sqrt(s.v[i] / correct2) + o.epsilon);
    s.params[i] = T(s.params[i] - o.learning_rate * (update + o.weight_decay * s.params[i]));
  }
}

// The communicators of this device, one per axis of size > 1 (made in the
// same order on every device: each is a collective rendezvous).
struct Communicators {
  std::unique_ptr<comm::Communicator> data, fsdp, tensor, sequence;
};

Result<Communicators> make_communicators(runtime::Pool& pool, const mesh::Mesh& m, const DevicePlace& p) {
  Communicators c;
  for (auto [axis, place, slot] : {std::tuple{mesh::Axis::kData, &p.data, &c.data},
                                   std::tuple{mesh::Axis::kFsdp, &p.fsdp, &c.fsdp},
                                   std::tuple{mesh::Axis::kTensor, &p.tensor, &c.tensor},
                                   std::tuple{mesh::Axis::kSequence, &p.sequence, &c.sequence}}) {
    if (place->size == 1) continue;
    auto made = comm::make_axis_communicator(pool, m, axis, p.device);
    if (!made.ok()) return made.error().prefixed(std::string(mesh::kMeshAxes[static_cast<int>(axis)]) + " axis: ");
    *slot = std::move(made.value());
  }
  return c;
}

// Sums this device's bucket gradients over the sequence axis, reduce-
// scatters them over fsdp (to this device's shard) and sums the shard over
// data: the shard of the whole batch's gradient.
template <typename T>
Result<std::vector<T>> reduce_gradients(std::vector<T>& grads, const Shard<T>& s, const DevicePlace& p,
                                        Communicators& c, Split& split) {
  if (c.sequence) {
    if (auto r = split.time("all_reduce sequence", [&] { return c.sequence->all_reduce(std::span<T>(grads)); });
        !r.ok()) {
      return r.error();
    }
  }
  grads.resize(std::size_t(s.chunk * p.fsdp.size), T(0));
  std::vector<T> shard(std::size_t(s.chunk));
  if (c.fsdp) {
    auto r = split.time("reduce_scatter fsdp", [&] {
      return c.fsdp->reduce_scatter(std::span<const T>(grads), std::span<T>(shard));
    });
    if (!r.ok()) return r.error();
  } else {
    shard.assign(grads.begin(), grads.end());
  }
  if (c.data) {
    if (auto r = split.time("all_reduce data", [&] { return c.data->all_reduce(std::span<T>(shard)); }); !r.ok()) {
      return r.error();
    }
  }
  return shard;
}

// This device's whole buckets: each fsdp shard all-gathered.
template <typename T>
Result<std::vector<std::vector<T>>> gather_buckets(const std::vector<Shard<T>>& shards, const DevicePlace& p,
                                                   Communicators& c, Split& split) {
  std::vector<std::vector<T>> whole;
  for (const auto& s : shards) {
    std::vector<T> full(std::size_t(s.chunk * p.fsdp.size));
    if (c.fsdp) {
      auto r = split.time("all_gather fsdp", [&] {
        return c.fsdp->all_gather(std::span<const T>(s.params), std::span<T>(full));
      });
      if (!r.ok()) return r.error();
    } else {
      full = s.params;
    }
    full.resize(std::size_t(s.size));
    whole.push_back(std::move(full));
  }
  return whole;
}

// The mean loss of the step's global batch: every device's share summed over
// sequence, fsdp and data (the tensor ranks hold the same one).
Result<double> global_loss(double local, Communicators& c, Split& split) {
  std::vector<double> value{local};
  for (auto* axis : {c.sequence.get(), c.fsdp.get(), c.data.get()}) {
    if (!axis) continue;
    if (auto r = split.time("all_reduce loss", [&] { return axis->all_reduce(std::span<double>(value)); }); !r.ok()) {
      return r.error();
    }
  }
  return value[0];
}

// The exchange every attention call of the run takes, and the rule's reason.
Result<attention::Plan> plan_exchange(const WorkerOptions& o, const DevicePlace& p) {
  attention::Call call;
  call.heads = o.model.heads;
  call.kv_heads = o.model.kv_heads;
  call.query_length = call.key_length = o.model.length;
  call.sequence = p.sequence.size;
  call.tensor = p.tensor.size;
  call.mask.kind = attention::MaskKind::kCausal;
  call.head_dim = o.model.width / o.model.heads;
  call.bytes_per_value = o.dtype == Dtype::kFloat64 ? 8 : 4;
  call.gather_kernel = attention::GatherKernel::kSkipsMaskedBlocks;
  return attention::choose_exchange(call);
}

template <typename T>
Result<DeviceResult> train_typed(runtime::Pool& pool, const mesh::Mesh& m, const WorkerOptions& o, int device,
                                 const std::function<void(const StepRecord&)>& progress) {
  auto place = place_of(m, o, device);
  if (!place.ok()) return place.error();
  const DevicePlace& p = place.value();
  auto comms = make_communicators(pool, m, p);
  if (!comms.ok()) return comms.error();
  DeviceResult result;
  auto plan = plan_exchange(o, p);
  if (!plan.ok()) return plan.error();
  const attention::Exchange exchange = plan.value().exchange;
  if (p.sequence.size > 1) {
    result.exchange = std::string(attention::exchange_name(exchange));
    result.exchange_reason = plan.value().reason;
  }
  const auto buckets = model_buckets(o.model);
  auto shards = initial_shards<T>(buckets, p, o.seed);
  for (const auto& s : shards) result.state_bytes += std::int64_t(3 * s.params.size() * sizeof(T));
  const int head = o.model.width / o.model.heads;
  const int heads = o.model.heads / p.tensor.size, kv_heads = o.model.kv_heads / p.tensor.size;
  const auto positions = std::int64_t(p.positions.size());
  const attention::Dims local{p.sequences, heads, kv_heads, positions, positions, head};
  const attention::Dims whole{p.sequences, heads, kv_heads, o.model.length, o.model.length, head};
  DeviceShape shape{p.sequences, int(positions), p.tensor.size, p.positions};
  const T scale = T(1.0 / (double(o.batch) * o.model.length));
  for (int step = 0; step < o.steps; ++step) {
    Split split;
    const auto start = Clock::now();
    auto params = gather_buckets(shards, p, comms.value(), split);
    if (!params.ok()) return params.error();
    const Batch batch = batch_of(o, step, p.first_sequence, p.sequences, p.positions);
    std::vector<std::vector<T>> grads;
    std::vector<std::span<const T>> param_views;
    std::vector<std::span<T>> grad_views;
    for (const auto& whole_bucket : params.value()) {
      grads.emplace_back(whole_bucket.size(), T(0));
      param_views.emplace_back(whole_bucket);
    }
    for (auto& g : grads) grad_views.emplace_back(g);
    LayoutCollectives<T> collectives(comms.value().tensor.get(), comms.value().sequence.get(), exchange, local,
                                     whole, split);
    auto loss = forward_backward<T>(o.model, shape, buckets, param_views, batch.tokens, batch.targets, scale,
                                    grad_views, collectives);
    if (!loss.ok()) return loss.error().prefixed("step " + std::to_string(step + 1) + ": ");
    for (std::size_t b = 0; b < shards.size(); ++b) {
      auto shard = reduce_gradients(grads[b], shards[b], p, comms.value(), split);
      if (!shard.ok()) return shard.error();
      adamw<T>(o, step + 1, shard.value(), shards[b]);
    }
    auto mean = global_loss(loss.value() * double(scale), comms.value(), split);
    if (!mean.ok()) return mean.error();
    StepRecord record;
    record.step = step + 1;
    record.loss = mean.value();
    record.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    double collective = 0;
    for (const auto& [what, seconds] : split.seconds) collective += seconds;
    record.split = split.seconds;
    record.split["compute"] = std::max(0.0, record.seconds - collective);
    if (progress) progress(record);
    result.steps.push_back(std::move(record));
  }
  return result;
}

}  // namespace

Result<DeviceResult> train_device(runtime::Pool& pool, const mesh::Mesh& mesh, const WorkerOptions& options,
                                  int device, const std::function<void(const StepRecord&)>& progress) {
  return options.dtype == Dtype::kFloat64 ? train_typed<double>(pool, mesh, options, device, progress)
                                          : train_typed<float>(pool, mesh, options, device, progress);
}

}  // namespace dew::train

