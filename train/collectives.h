// The layout's collectives as one device's step uses them: the
// communicators per axis, the model's tensor sums and attention calls, the
// fsdp gathers of each bucket, the gradients' reduction and the global loss,
// each timed into the step's split. Private to train/.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "dew/attention.h"
#include "dew/axes.h"
#include "dew/exchange.h"
#include "layout.h"
#include "model.h"
#include "stall_watch.h"

namespace dew::train {

using Clock = std::chrono::steady_clock;

// Seconds spent per kind of collective in one step; the stall watch hears
// when a device enters and leaves each.
struct StepSplit {
  StallWatch* watch = nullptr;
  int local_device = 0;
  std::map<std::string, double> seconds;
  template <typename F>
  auto time(const std::string& what, F&& work) {
    if (watch) watch->collective_begins(local_device, what);
    const auto start = Clock::now();
    auto result = work();
    seconds[what] += std::chrono::duration<double>(Clock::now() - start).count();
    // A collective cut short by a dead peer leaves the device waiting on
    // the pool's word of it, not stalled.
    if (watch && result.ok()) watch->collective_ends(local_device);
    return result;
  }
};

// The layout's collectives as the model asks for them.
template <typename T>
class LayoutCollectives final : public Collectives<T> {
 public:
  LayoutCollectives(comm::Communicator* tensor, comm::Communicator* sequence, attention::Exchange exchange,
                    attention::Dims local, attention::Dims whole, StepSplit& split)
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

  Result<Done> attention_backward(const AttentionTensors<T>& in, const T* out, const T* lse, const T* d_out, T* d_query,
                                  T* d_key, T* d_value) override {
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
  StepSplit& split_;
};

// One bucket's share on this device: the fsdp shard of its (tensor rank's)
// flat parameters, padded to a multiple of the fsdp size, and AdamW's state.
template <typename T>
struct Shard {
  std::int64_t size = 0;   // the whole flat bucket (this tensor rank's parts)
  std::int64_t chunk = 0;  // one fsdp rank's share of it, padded
  std::vector<T> params, m, v;
};

// The communicators of this device, one per axis of size > 1 (made in the
// same order on every device: each is a collective rendezvous).
struct Communicators {
  std::unique_ptr<comm::Communicator> data, fsdp, tensor, sequence;
};

inline Result<Communicators> make_communicators(runtime::Pool& pool, const mesh::Mesh& m, const DevicePlace& p) {
  Communicators c;
  for (auto [axis, place, slot] :
       {std::tuple{mesh::Axis::kData, &p.data, &c.data}, std::tuple{mesh::Axis::kFsdp, &p.fsdp, &c.fsdp},
        std::tuple{mesh::Axis::kTensor, &p.tensor, &c.tensor},
        std::tuple{mesh::Axis::kSequence, &p.sequence, &c.sequence}}) {
    if (place->size == 1) continue;
    auto made = axes::make_axis_communicator(pool, m, axis, p.device);
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
                                        Communicators& c, StepSplit& split) {
  if (c.sequence) {
    if (auto r = split.time("all_reduce sequence", [&] { return c.sequence->all_reduce(std::span<T>(grads)); });
        !r.ok()) {
      return r.error();
    }
  }
  grads.resize(std::size_t(s.chunk * p.fsdp.size), T(0));
  std::vector<T> shard(std::size_t(s.chunk));
  if (c.fsdp) {
    auto r = split.time("reduce_scatter fsdp",
                        [&] { return c.fsdp->reduce_scatter(std::span<const T>(grads), std::span<T>(shard)); });
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
                                                   Communicators& c, StepSplit& split) {
  std::vector<std::vector<T>> whole;
  for (const auto& s : shards) {
    std::vector<T> full(std::size_t(s.chunk * p.fsdp.size));
    if (c.fsdp) {
      auto r = split.time("all_gather fsdp",
                          [&] { return c.fsdp->all_gather(std::span<const T>(s.params), std::span<T>(full)); });
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
inline Result<double> global_loss(double local, Communicators& c, StepSplit& split) {
  std::vector<double> value{local};
  for (auto* axis : {c.sequence.get(), c.fsdp.get(), c.data.get()}) {
    if (!axis) continue;
    if (auto r = split.time("all_reduce loss", [&] { return axis->all_reduce(std::span<double>(value)); }); !r.ok()) {
      return r.error();
    }
  }
  return value[0];
}

}  // namespace dew::train
