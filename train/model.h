// One device's forward and backward pass through the transformer, given its
// share of the parameters (its tensor rank's parts, each bucket gathered
// whole over fsdp), its tokens, and the layout's collectives: the tensor
// axis's sums and the attention call (local, or exchanged over the sequence
// axis). Private to train/.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dew/result.h"
#include "dew/train.h"
#include "params.h"

namespace dew::train {

// Queries, keys and values of this device in attention's layout: local batch
// x heads x local positions x head width (this tensor rank's heads).
template <typename T>
struct AttentionTensors {
  const T* query = nullptr;
  const T* key = nullptr;
  const T* value = nullptr;
};

// What the model asks of the layout in the middle of a pass.
template <typename T>
class Collectives {
 public:
  virtual ~Collectives() = default;
  // Sums `data` over the tensor axis (Megatron's all-reduce), in place.
  virtual Result<Done> tensor_sum(std::span<T> data) = 0;
  // Causal attention at global positions: out (as the query), lse (batch x
  // heads x positions).
  virtual Result<Done> attention_forward(const AttentionTensors<T>& in, T* out, T* lse) = 0;
  virtual Result<Done> attention_backward(const AttentionTensors<T>& in, const T* out, const T* lse, const T* d_out,
                                          T* d_query, T* d_key, T* d_value) = 0;
};

// The shape of one device's pass.
struct DeviceShape {
  int batch = 1;      // sequences this device holds
  int positions = 1;  // positions of each it holds (its sequence shard)
  int tensor_size = 1;
  std::vector<std::int64_t> global_positions;  // positions entries: where each sits in the whole sequence
};

// Forward and backward: adds this device's gradients into `gradients` (one
// span per bucket, laid out as the parameters) and returns the sum of its
// tokens' losses. Gradients are of the loss scaled by `scale` (1 / the
// global batch's tokens), so that summing them over the devices gives the
// gradient of the mean loss.
template <typename T>
Result<double> forward_backward(const ModelConfig& model, const DeviceShape& shape,
                                const std::vector<std::vector<ParamSpec>>& buckets,
                                const std::vector<std::span<const T>>& params, std::span<const int> tokens,
                                std::span<const int> targets, T scale, const std::vector<std::span<T>>& gradients,
                                Collectives<T>& collectives);

}  // namespace dew::train
