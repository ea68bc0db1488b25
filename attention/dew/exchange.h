// The two sequence-parallel exchanges (namespace dew::attention): each
// device of a sequence group holds a shard of every sequence's positions and
// calls the same function at the same time; the result equals whole-sequence
// attention (attention.h) on one device, forward and backward.
//
//   all-to-all (DeepSpeed Ulysses): trade the shard of positions for a slice
//     of the heads, attend the whole sequence for those heads, trade back.
//     Key/value heads are repeated only as far as the split needs (K').
//   gather: queries stay, keys and values are gathered whole; the backward
//     reduce-scatters dK and dV (accumulating in T: fp32 for float).
//
// Each direction packs its tensors into one collective: per forward +
// backward the all-to-all makes 4 (Q, K, V out, O and LSE back; Q, K, V, O,
// LSE, dO out, dQ, dK, dV back) and the gather 3 (K and V gathered in the
// forward and again in the backward, dK and dV reduce-scattered), plus one
// all-gather of the sinks' gradient when there are sinks. On a CPU pool the
// number of collectives weighs more than their bytes.
//
// How the sequence is cut (Layout) is the caller's: contiguous shards, or the
// 2N-chunk balance (device r holds chunks r and 2N-1-r), which evens out a
// causal call's work. Masks are evaluated at global positions either way.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "dew/attention.h"
#include "dew/comm.h"
#include "dew/export.h"

namespace dew::attention {

// The exchanges run over any communicator (comm/: Gloo, NCCL).
using comm::Communicator;

enum class Layout { kContiguous, kChunkPairs };

// The global positions device `rank` of `devices` holds, in its local order;
// contiguous shards take any length >= N (the first length % N devices hold
// one row more; only the gather runs on uneven shards), the chunk pairs need
// it to divide by 2N; otherwise an error.
DEW_API Result<std::vector<std::int64_t>> shard_positions(Layout layout, std::int64_t length, int devices, int rank);

// Rows `positions` (in that order) of a batch x heads x length x width
// tensor: a device's shard of a whole input, or its part of a whole result.
template <typename T>
std::vector<T> take_rows(std::span<const T> whole, int batch, int heads, std::int64_t length, std::int64_t width,
                         std::span<const std::int64_t> positions) {
  std::vector<T> out;
  out.reserve(static_cast<std::size_t>(batch) * static_cast<std::size_t>(heads) * positions.size() *
              static_cast<std::size_t>(width));
  for (std::int64_t bh = 0; bh < std::int64_t(batch) * heads; ++bh)
    for (const std::int64_t p : positions) {
      const auto first = whole.begin() + (bh * length + p) * width;
      out.insert(out.end(), first, first + width);
    }
  return out;
}

// Heads [first, first + count) of a batch x heads x per_head tensor: a
// tensor shard's heads (per_head = length x width, or length x length for a
// dense bias).
template <typename T>
std::vector<T> take_heads(std::span<const T> whole, int batch, int heads, int first, int count, std::int64_t per_head) {
  std::vector<T> out;
  out.reserve(static_cast<std::size_t>(batch) * static_cast<std::size_t>(count) * static_cast<std::size_t>(per_head));
  for (int b = 0; b < batch; ++b) {
    const auto from = whole.begin() + (std::int64_t(b) * heads + first) * per_head;
    out.insert(out.end(), from, from + std::int64_t(count) * per_head);
  }
  return out;
}

template <typename T>
struct DEW_API ShardCall {
  // batch; heads and kv_heads of this tensor shard (H, K); the WHOLE query
  // and key lengths; head width.
  Dims dims;
  Layout layout = Layout::kContiguous;
  const T* query = nullptr;  // batch x H x (query_length / N) x head_dim, this device's positions
  const T* key = nullptr;    // batch x K x (key_length / N) x head_dim
  const T* value = nullptr;
  bool causal = false;
  std::optional<Window> window;
  // Packed documents over the WHOLE sequences (batch x query_length and
  // batch x key_length), the same on every device; both or neither.
  std::span<const std::int32_t> query_segments;
  std::span<const std::int32_t> key_segments;
  // Additive bias over the WHOLE sequences (rows: query positions, columns:
  // key positions; strides as in attention.h, -1 for batch x H x
  // query_length x key_length), readable on every device; each device reads
  // the part its kernel needs.
  Bias<T> bias;
  const T* sinks = nullptr;  // H
  double scale = 0;
  int query_block = 128;
  int key_block = 256;
};

// out: batch x H x (query_length / N) x head_dim; lse: batch x H x
// (query_length / N), the shard's rows.
template <typename T>
DEW_API Result<Stats> exchange_forward(Exchange exchange, Communicator& comm, const ShardCall<T>& call, T* out, T* lse);

// Gradients of this device's shards (query, key, value as the inputs); the
// sinks' gradient (H entries) is the whole one, the same on every device.
template <typename T>
DEW_API Result<Stats> exchange_backward(Exchange exchange, Communicator& comm, const ShardCall<T>& call, const T* out,
                                        const T* lse, const T* d_out, const Gradients<T>& gradients);

}  // namespace dew::attention
