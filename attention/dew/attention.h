// Exact attention on the CPU, forward and backward, and the rule that picks a
// sequence-parallel exchange (namespace dew::attention).
//
//   forward, backward   blocked like FlashAttention: online softmax over key
//                       blocks, key blocks the mask removes entirely skipped,
//                       the block products on OpenBLAS (sgemm/dgemm); float
//                       is the kernel, double the reference path
//   choose_exchange     all-to-all or gather for a sequence-split call, the
//                       reason and the bytes each would send
//   parse_mask_kind     the `--mask` value of `dew attention-plan`
//
// Layout: row-major batch x heads x length x head width. Queries, outputs and
// their gradients have `heads` heads; keys, values and theirs `kv_heads`
// (grouped-query: query head h reads key head h / (heads / kv_heads)).
//
// Masks are evaluated at global positions, so a shard of a split sequence
// (even non-contiguous chunks) attends exactly as the whole sequence does:
// give each local query row and key column its position in the whole
// sequence (Positions). Aligned query position a = query position +
// (key length - query length) over the whole sequences (bottom-right
// alignment); key position k is allowed when every active rule allows it:
//   causal      k <= a
//   window      a - left <= k <= a + right
//   documents   query and key carry the same segment id
// Additive bias and per-head sinks apply on top. A row no key is allowed for
// gets output 0 and log-sum-exp -inf (the sink's logit when there are sinks),
// never NaN.
//
// Threads: a call runs on the calling thread; OpenBLAS may use its own
// threads for a block product (OPENBLAS_NUM_THREADS=1 keeps it to one).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "dew/export.h"
#include "dew/result.h"

namespace dew::attention {

struct DEW_API Dims {
  int batch = 1;
  int heads = 1;     // query heads H
  int kv_heads = 1;  // key/value heads K, H % K == 0
  std::int64_t query_length = 0;
  std::int64_t key_length = 0;
  int head_dim = 1;
};

// Keys within [a - left, a + right] of the aligned query position a.
struct DEW_API Window {
  std::int64_t left = 0;
  std::int64_t right = 0;
};

// Where the local rows and columns sit in the whole sequences. Empty spans
// mean 0..n-1; a length of -1 means the local one.
struct DEW_API Positions {
  std::span<const std::int64_t> query;  // query_length entries, each in [0, whole_query_length)
  std::span<const std::int64_t> key;    // key_length entries, each in [0, whole_key_length)
  std::int64_t whole_query_length = -1;
  std::int64_t whole_key_length = -1;
};

struct DEW_API Mask {
  bool causal = false;
  std::optional<Window> window;
  // Packed documents: a segment id per local query row and key column, batch
  // x length each (both given or both empty).
  std::span<const std::int32_t> query_segments;
  std::span<const std::int32_t> key_segments;
  Positions positions;
};

// Additive bias, element (b, h, i, j) at data[b * batch_stride + h *
// head_stride + i * row_stride + j] over local rows i and columns j; a stride
// of 0 broadcasts, -1 means the dense layout (batch x heads x query_length x
// key_length).
template <typename T>
struct DEW_API Bias {
  const T* data = nullptr;
  std::int64_t batch_stride = -1;
  std::int64_t head_stride = -1;
  std::int64_t row_stride = -1;
};

template <typename T>
struct DEW_API Inputs {
  Dims dims;
  const T* query = nullptr;  // batch x heads x query_length x head_dim
  const T* key = nullptr;    // batch x kv_heads x key_length x head_dim
  const T* value = nullptr;  // as key
  Mask mask;
  Bias<T> bias;
  // One learnable logit per query head in every row's softmax denominator
  // (gpt-oss): a key with that logit and a value of zero. nullptr: none.
  const T* sinks = nullptr;
  // Logits are scale * q.k (+ bias); 0 means 1 / sqrt(head_dim).
  double scale = 0;
  // Rows and columns per block.
  int query_block = 128;
  int key_block = 256;
};

// Blocks of one call, each a (batch, head, query block, key block): how many
// the mask removed entirely (never computed), how many it cut (evaluated per
// element), and how many it left whole.
struct DEW_API Stats {
  std::int64_t skipped = 0;
  std::int64_t partial = 0;
  std::int64_t full = 0;
};

// out: batch x heads x query_length x head_dim. lse (may be nullptr): batch x
// heads x query_length, log of the softmax denominator, sink included.
template <typename T>
DEW_API Result<Stats> forward(const Inputs<T>& inputs, T* out, T* lse);

// Gradients of a loss L given d_out = dL/d out; each is overwritten. d_sinks
// (heads entries) may be nullptr and must be when there are no sinks.
template <typename T>
struct DEW_API Gradients {
  T* query = nullptr;
  T* key = nullptr;
  T* value = nullptr;
  T* sinks = nullptr;
};

// out and lse exactly as forward returned them for these inputs.
template <typename T>
DEW_API Result<Stats> backward(const Inputs<T>& inputs, const T* out, const T* lse, const T* d_out,
                               const Gradients<T>& gradients);

// The number of (query row, key column) pairs the mask allows, summed over
// the batch, for one head (for counting FLOPs); 0 for an invalid mask.
DEW_API std::int64_t allowed_pairs(const Mask& mask, const Dims& dims);

// ---------------------------------------------------------------------------
// The rule: which exchange a sequence-parallel call runs (the design page's
// sequence_parallel_attention).

enum class MaskKind { kNone, kCausal, kWindow, kDocuments };

struct DEW_API MaskSpec {
  MaskKind kind = MaskKind::kNone;
  Window window;  // kWindow only
};

// "none", "causal", "documents", "window=W" (left W, right 0) or
// "window=L,R"; anything else is an error naming it.
DEW_API Result<MaskSpec> parse_mask_kind(std::string_view text);
DEW_API std::string format_mask_kind(const MaskSpec& mask);

// How the kernel behind the gather treats a mask. The design page's rule sends
// masked calls to the all-to-all because cuDNN runs the gather's mask for its
// reordered rows as a dense bias over every logit (kDenseBias, the default).
// Dew's CPU kernel evaluates masks at global positions and skips fully
// masked blocks in both exchanges (kSkipsMaskedBlocks): then a masked call
// does the same work either way and, like an unmasked one, takes the
// exchange that sends fewer bytes.
enum class GatherKernel { kDenseBias, kSkipsMaskedBlocks };

// "dense-bias" or "skips-masked-blocks"; anything else is an error naming it.
DEW_API Result<GatherKernel> parse_gather_kernel(std::string_view text);
DEW_API std::string_view gather_kernel_name(GatherKernel kernel);

struct DEW_API Call {
  int heads = 0;                  // query heads H, all tensor shards together
  int kv_heads = 0;               // key/value heads K
  std::int64_t query_length = 0;  // whole sequence
  std::int64_t key_length = 0;    // whole sequence; cross attention when it differs
  int sequence = 1;               // N, the mesh's sequence axis
  int tensor = 1;                 // T, the mesh's tensor axis
  MaskSpec mask;
  int head_dim = 128;
  int bytes_per_value = 2;  // bf16
  GatherKernel gather_kernel = GatherKernel::kDenseBias;
};

enum class Exchange { kAllToAll, kGather };
DEW_API std::string_view exchange_name(Exchange exchange);  // "all-to-all", "gather"

struct DEW_API ExchangeCost {
  bool can_run = false;
  std::string why_not;  // when it cannot run
  // Per device, one forward call: in units of length x head width x (N-1)/N
  // (the design page's count over one tensor shard's heads: all-to-all 2(H + K')/N,
  // gather 2K), and in bytes (the device that sends most).
  double units = 0;
  // A double: the largest calls the rule allows send up to ~2^103 bytes, past
  // any 64-bit integer (exact below 2^53, which covers every real call).
  double bytes = 0;
};

struct DEW_API Plan {
  Exchange exchange = Exchange::kAllToAll;
  std::string reason;
  int shard_heads = 0;        // H: query heads per tensor shard
  int shard_kv_heads = 0;     // K: key heads one tensor shard needs
  int repeated_kv_heads = 0;  // K': K repeated as far as the all-to-all's split needs
  ExchangeCost all_to_all;
  ExchangeCost gather;
};

// Errors (with the numbers) for values out of range and shapes neither
// exchange can run.
DEW_API Result<Plan> choose_exchange(const Call& call);

}  // namespace dew::attention
