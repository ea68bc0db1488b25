// The pieces both sequence-parallel exchanges are made of (private to
// attention/): buffers kept between calls, a call's geometry, the trades of
// rows between shards and whole sequences, the head split, the local kernel
// runs, and the gather's inputs. Shapes: N devices, this one `rank`; Ls =
// query_length / N and Lks = key_length / N positions per shard. After an
// exchange, a whole sequence is held in "shard order": shard 0's positions,
// then shard 1's, ... (for the chunk-pair layout that is not position order;
// the kernel gets the positions, so masks still hold).
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dew/exchange.h"
#include "mask.h"

namespace dew::attention::detail {

inline std::string str(std::int64_t v) { return std::to_string(v); }

// Buffers of the exchanges: uninitialized (every element is written before
// it is read) and kept mapped between calls in a small per-thread free list.
// The exchanges move tens of MiB per call; fresh allocations are mmap'ed and
// page-faulted in again every call, which on a virtual machine cost as much
// as the copies themselves (perf: ~10 % of a call in page faults).
struct Block {
  std::unique_ptr<std::byte[]> bytes;
  std::size_t size = 0;
};

constexpr std::size_t kKeptBlocks = 16;
inline thread_local std::vector<Block> free_blocks;

inline Block take_block(std::size_t size) {
  auto best = free_blocks.end();
  for (auto it = free_blocks.begin(); it != free_blocks.end(); ++it)
    if (it->size >= size && (best == free_blocks.end() || it->size < best->size)) best = it;
  if (best != free_blocks.end()) {
    Block block = std::move(*best);
    free_blocks.erase(best);
    return block;
  }
  return {std::make_unique_for_overwrite<std::byte[]>(std::max<std::size_t>(size, 1)), size};
}

inline void give_block(Block block) {
  free_blocks.push_back(std::move(block));
  if (free_blocks.size() > kKeptBlocks) {  // drop the smallest
    auto smallest = std::min_element(free_blocks.begin(), free_blocks.end(),
                                     [](const Block& a, const Block& b) { return a.size < b.size; });
    free_blocks.erase(smallest);
  }
}

template <typename T>
class Scratch {
 public:
  explicit Scratch(std::size_t n) : block_(take_block(n * sizeof(T))), size_(n) {}
  ~Scratch() {
    if (block_.bytes) give_block(std::move(block_));
  }
  Scratch(Scratch&& other) noexcept : block_(std::move(other.block_)), size_(other.size_) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Scratch& operator=(Scratch&&) = delete;
  T* data() { return reinterpret_cast<T*>(block_.bytes.get()); }
  const T* data() const { return reinterpret_cast<const T*>(block_.bytes.get()); }
  std::size_t size() const { return size_; }
  operator std::span<T>() { return {data(), size_}; }              // NOLINT: implicit by design
  operator std::span<const T>() const { return {data(), size_}; }  // NOLINT: implicit by design

 private:
  Block block_;
  std::size_t size_;
};

struct Geometry {
  int n = 1, rank = 0;
  std::int64_t ls = 0, lks = 0;                // this device's query rows; key rows per shard (all-to-all)
  std::vector<std::int64_t> k_count, k_start;  // each shard's key rows and where they start in k_order
  std::vector<std::int64_t> q_order, k_order;  // whole sequences in shard order
  std::vector<std::int64_t> q_mine;            // this device's query positions
};

template <typename T>
Result<Geometry> geometry(Exchange exchange, const Communicator& comm, const ShardCall<T>& call) {
  if (auto error = detail::check_dims(call.dims)) return *error;
  const Dims& d = call.dims;
  Geometry g;
  g.n = comm.size();
  g.rank = comm.rank();
  if (exchange == Exchange::kAllToAll && d.heads % g.n != 0) {
    return invalid_argument("all-to-all: heads " + str(d.heads) + " do not divide by the " + str(g.n) +
                            " devices of the sequence group; allowed: a multiple of " + str(g.n) + " (or the gather)");
  }
  if (d.query_length < 1 || d.key_length < 1) {
    return invalid_argument("exchange: lengths " + str(d.query_length) + " and " + str(d.key_length) +
                            " are not allowed; allowed: whole numbers >= 1");
  }
  for (int s = 0; s < g.n; ++s) {
    auto q = shard_positions(call.layout, d.query_length, g.n, s);
    if (!q.ok()) return invalid_argument("query " + q.error().message);
    auto k = shard_positions(call.layout, d.key_length, g.n, s);
    if (!k.ok()) return invalid_argument("key " + k.error().message);
    if (s == g.rank) g.q_mine = q.value();
    g.q_order.insert(g.q_order.end(), q.value().begin(), q.value().end());
    g.k_start.push_back(std::int64_t(g.k_order.size()));
    g.k_count.push_back(std::int64_t(k.value().size()));
    g.k_order.insert(g.k_order.end(), k.value().begin(), k.value().end());
  }
  // The all-to-all trades equal slices; the gather takes uneven shards.
  if (exchange == Exchange::kAllToAll && (d.query_length % g.n != 0 || d.key_length % g.n != 0)) {
    return invalid_argument("all-to-all: query length " + str(d.query_length) + " and key length " + str(d.key_length) +
                            " must both divide by the " + str(g.n) +
                            " devices of the sequence group (or use the gather)");
  }
  g.ls = std::int64_t(g.q_mine.size());
  g.lks = d.key_length / g.n;
  if (call.bias.data != nullptr &&
      (call.bias.batch_stride < -1 || call.bias.head_stride < -1 || call.bias.row_stride < -1)) {
    return invalid_argument("exchange: bias strides " + str(call.bias.batch_stride) + ", " +
                            str(call.bias.head_stride) + ", " + str(call.bias.row_stride) +
                            " are not allowed; allowed: >= 0, or -1 for the dense layout");
  }
  if (call.query_segments.empty() != call.key_segments.empty()) {
    return invalid_argument("exchange: segments given for " +
                            std::string(call.query_segments.empty() ? "keys" : "queries") +
                            " only; allowed: both or neither");
  }
  if (!call.query_segments.empty() && (std::int64_t(call.query_segments.size()) != d.batch * d.query_length ||
                                       std::int64_t(call.key_segments.size()) != d.batch * d.key_length)) {
    return invalid_argument("exchange: segments of " + str(std::int64_t(call.query_segments.size())) + " and " +
                            str(std::int64_t(call.key_segments.size())) +
                            " ids are not allowed; allowed: batch x whole length = " + str(d.batch * d.query_length) +
                            " and " + str(d.batch * d.key_length));
  }
  return g;
}

// Segment ids of `positions` (per batch entry), from the whole sequences'.
inline std::vector<std::int32_t> segments_at(std::span<const std::int32_t> whole, int batch, std::int64_t length,
                                             const std::vector<std::int64_t>& positions) {
  std::vector<std::int32_t> out;
  if (whole.empty()) return out;
  out.reserve(std::size_t(batch) * positions.size());
  for (int b = 0; b < batch; ++b)
    for (const std::int64_t p : positions) out.push_back(whole[std::size_t(b * length + p)]);
  return out;
}

// The one all-to-all behind both trades below: part i sends each device d
// batch x count rows of row() values, from source(i, d, b, j), and hands
// the row it receives from device s to sink(i, s, b, j, row). One collective
// for all parts: on a CPU pool their number, not their bytes, dominates.
template <typename T, typename Part, typename Source, typename Sink>
Result<Done> trade_rows(Communicator& comm, int batch, std::initializer_list<Part> parts, Source&& source,
                        Sink&& sink) {
  const std::size_t n = std::size_t(comm.size());
  std::size_t chunk = 0;
  for (const Part& p : parts) chunk += std::size_t(batch) * std::size_t(p.count) * p.row();
  Scratch<T> send(chunk * n), recv(send.size());
  T* to = send.data();
  for (std::size_t d = 0; d < n; ++d)
    for (std::size_t i = 0; i < parts.size(); ++i)
      for (int b = 0; b < batch; ++b)
        for (int j = 0; j < parts.begin()[i].count; ++j, to += parts.begin()[i].row())
          std::memcpy(to, source(i, d, b, j), parts.begin()[i].row() * sizeof(T));
  auto done = comm.all_to_all<T>(send, recv);
  if (!done.ok()) return done;
  const T* from = recv.data();
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t i = 0; i < parts.size(); ++i)
      for (int b = 0; b < batch; ++b)
        for (int j = 0; j < parts.begin()[i].count; ++j, from += parts.begin()[i].row()) sink(i, s, b, j, from);
  return Done{};
}

// One tensor's part of a heads -> sequence trade: from a shard
// [B][hs][len][w], destination d is sent heads [start[d], start[d] + count).
template <typename T>
struct ToWhole {
  const T* shard;
  int hs;
  std::int64_t len, w;
  const std::vector<int>& start;
  int count;
  std::size_t row() const { return std::size_t(len * w); }
};

// heads -> sequence for several tensors in one all-to-all: returns, per part,
// the whole sequence of the heads this device was sent, [B][count][N len][w]
// in shard order.
template <typename T>
Result<std::vector<Scratch<T>>> to_whole_sequences(Communicator& comm, int batch,
                                                   std::initializer_list<ToWhole<T>> parts) {
  const std::size_t n = std::size_t(comm.size());
  std::vector<Scratch<T>> wholes;
  wholes.reserve(parts.size());
  for (const ToWhole<T>& p : parts) wholes.emplace_back(std::size_t(batch) * std::size_t(p.count) * p.row() * n);
  auto done = trade_rows<T>(
      comm, batch, parts,
      [&](std::size_t i, std::size_t d, int b, int j) {
        const ToWhole<T>& p = parts.begin()[i];
        return p.shard + std::size_t(b * p.hs + p.start[d] + j) * p.row();
      },
      [&](std::size_t i, std::size_t s, int b, int j, const T* row) {
        const ToWhole<T>& p = parts.begin()[i];
        std::memcpy(wholes[i].data() + (std::size_t(b * p.count + j) * n + s) * p.row(), row, p.row() * sizeof(T));
      });
  if (!done.ok()) return done.error();
  return wholes;
}

// One tensor's part of the reverse trade, sequence -> heads: whole [B][count]
// [N len][w] in shard order; source s's slice lands in heads [start[s],
// start[s] + count) of the shard [B][hs][len][w], copied or added (in source
// order).
template <typename T>
struct ToShard {
  const T* whole;
  int count;
  std::int64_t len, w;
  T* shard;
  int hs;
  const std::vector<int>& start;
  bool add;
  std::size_t row() const { return std::size_t(len * w); }
};

template <typename T>
Result<Done> to_shards(Communicator& comm, int batch, std::initializer_list<ToShard<T>> parts) {
  const std::size_t n = std::size_t(comm.size());
  for (const ToShard<T>& p : parts)
    if (p.add) std::fill(p.shard, p.shard + std::size_t(batch) * std::size_t(p.hs) * p.row(), T(0));
  return trade_rows<T>(
      comm, batch, parts,
      [&](std::size_t i, std::size_t d, int b, int j) {
        const ToShard<T>& p = parts.begin()[i];
        return p.whole + (std::size_t(b * p.count + j) * n + d) * p.row();
      },
      [&](std::size_t i, std::size_t s, int b, int j, const T* row) {
        const ToShard<T>& p = parts.begin()[i];
        T* to = p.shard + std::size_t(b * p.hs + p.start[s] + j) * p.row();
        if (p.add) {
          for (std::size_t e = 0; e < p.row(); ++e) to[e] += row[e];
        } else {
          std::memcpy(to, row, p.row() * sizeof(T));
        }
      });
}

// Gathers every device's [B][k][rows][w] shards of several tensors (same
// shape) in ONE all-gather into [B][k][L][w] each, in shard order
// (g.k_order). Shards may differ by a row: each is padded to the largest for
// the all-gather, and only its own rows are kept.
template <typename T>
Result<std::vector<Scratch<T>>> gather_whole(Communicator& comm, std::initializer_list<const T*> shards, int batch,
                                             int k, const Geometry& g, std::int64_t w) {
  const std::size_t n = std::size_t(comm.size());
  const std::int64_t most = *std::max_element(g.k_count.begin(), g.k_count.end());
  const std::int64_t mine = g.k_count[std::size_t(g.rank)];
  const std::int64_t length = g.k_start.back() + g.k_count.back();
  const std::size_t row = std::size_t(most * w), rows = std::size_t(batch) * std::size_t(k);
  const std::size_t part = rows * row, chunk = part * shards.size();
  Scratch<T> send(chunk), recv(chunk * n);
  T* to = send.data();
  for (const T* shard : shards)
    for (std::size_t bk = 0; bk < rows; ++bk, to += row) {
      std::memcpy(to, shard + bk * std::size_t(mine * w), std::size_t(mine * w) * sizeof(T));
      std::fill(to + mine * w, to + row, T(0));
    }
  auto done = comm.all_gather<T>(send, recv);
  if (!done.ok()) return done.error();
  std::vector<Scratch<T>> wholes;
  wholes.reserve(shards.size());
  for (std::size_t i = 0; i < shards.size(); ++i) {
    wholes.emplace_back(rows * std::size_t(length * w));
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t bk = 0; bk < rows; ++bk)
        std::memcpy(wholes[i].data() + (bk * std::size_t(length) + std::size_t(g.k_start[s])) * std::size_t(w),
                    recv.data() + s * chunk + i * part + bk * row, std::size_t(g.k_count[s] * w) * sizeof(T));
  }
  return wholes;
}

// The all-to-all's head assignment: device d attends query heads
// [d H/N, (d+1) H/N) and receives key heads [start[d], start[d] + count).
struct HeadSplit {
  int per_device = 0;  // H / N
  int count = 0;       // key heads per device: K' / N
  std::vector<int> q_start, kv_start;
};

inline HeadSplit head_split(const Dims& d, int n) {
  HeadSplit split;
  split.per_device = d.heads / n;
  const int group = d.heads / d.kv_heads;
  std::vector<int> lo;
  for (int dev = 0; dev < n; ++dev) {
    const int first = dev * split.per_device, last = first + split.per_device - 1;
    lo.push_back(first / group);
    split.count = std::max(split.count, last / group - first / group + 1);
    split.q_start.push_back(first);
  }
  for (int dev = 0; dev < n; ++dev) split.kv_start.push_back(std::min(lo[std::size_t(dev)], d.kv_heads - split.count));
  return split;
}

// The dense bias [nb][nh][rows][columns] of batch entries [b0, b0 + nb) and
// heads [h0, h0 + nh) at these whole-sequence positions; empty without bias.
template <typename T>
std::vector<T> local_bias(const ShardCall<T>& call, int b0, int nb, int h0, int nh,
                          const std::vector<std::int64_t>& rows, const std::vector<std::int64_t>& columns) {
  std::vector<T> out;
  const Bias<T>& bias = call.bias;
  if (bias.data == nullptr) return out;
  const Dims& d = call.dims;
  const std::int64_t rs = bias.row_stride == -1 ? d.key_length : bias.row_stride;
  const std::int64_t hs = bias.head_stride == -1 ? d.query_length * d.key_length : bias.head_stride;
  const std::int64_t bs = bias.batch_stride == -1 ? d.heads * d.query_length * d.key_length : bias.batch_stride;
  out.reserve(std::size_t(nb) * std::size_t(nh) * rows.size() * columns.size());
  for (int b = b0; b < b0 + nb; ++b)
    for (int h = h0; h < h0 + nh; ++h)
      for (const std::int64_t r : rows) {
        const T* row = bias.data + b * bs + h * hs + r * rs;
        for (const std::int64_t c : columns) out.push_back(row[c]);
      }
  return out;
}

inline void add_stats(Stats& total, const Stats& s) {
  total.skipped += s.skipped;
  total.partial += s.partial;
  total.full += s.full;
}

// The local kernel over whole sequences for the all-to-all: one call per
// (batch entry, local key head) with the query heads that read it, since the
// local heads need not group as the kernel's H / K does.
template <typename T>
struct LocalRuns {
  const ShardCall<T>& call;
  const Geometry& g;
  const HeadSplit& split;
  std::vector<std::int32_t> q_seg, k_seg;  // whole sequences, shard order

  template <typename F>
  Result<Stats> each(F&& body) const {
    const Dims& d = call.dims;
    const int group = d.heads / d.kv_heads;
    const int mine = split.q_start[std::size_t(g.rank)], kv0 = split.kv_start[std::size_t(g.rank)];
    Stats total;
    for (int b = 0; b < d.batch; ++b)
      for (int u = 0; u < split.count; ++u) {
        int ja = split.per_device, jb = 0;
        for (int j = 0; j < split.per_device; ++j)
          if ((mine + j) / group == kv0 + u) ja = std::min(ja, j), jb = std::max(jb, j + 1);
        if (ja >= jb) continue;
        Inputs<T> in;
        in.dims = Dims{1, jb - ja, 1, d.query_length, d.key_length, d.head_dim};
        in.mask.causal = call.causal;
        in.mask.window = call.window;
        if (!q_seg.empty()) {
          in.mask.query_segments = std::span<const std::int32_t>(q_seg).subspan(std::size_t(b * d.query_length),
                                                                                std::size_t(d.query_length));
          in.mask.key_segments =
              std::span<const std::int32_t>(k_seg).subspan(std::size_t(b * d.key_length), std::size_t(d.key_length));
        }
        in.mask.positions = {g.q_order, g.k_order, d.query_length, d.key_length};
        in.sinks = call.sinks == nullptr ? nullptr : call.sinks + mine + ja;
        in.scale = call.scale;
        in.query_block = call.query_block;
        in.key_block = call.key_block;
        const std::vector<T> bias = local_bias(call, b, 1, mine + ja, jb - ja, g.q_order, g.k_order);
        if (!bias.empty()) in.bias.data = bias.data();
        auto stats = body(in, b, u, ja);
        if (!stats.ok()) return stats;
        add_stats(total, stats.value());
      }
    return total;
  }
};

// The gather's kernel inputs: keys and values gathered whole, the segment
// ids and bias at this device's query rows and the gathered key order. Held
// together because Inputs points into them; the same for forward and
// backward.
template <typename T>
struct Gathered {
  Scratch<T> key, value;
  std::vector<std::int32_t> query_segments, key_segments;
  std::vector<T> bias;

  static Result<std::unique_ptr<Gathered>> make(Communicator& comm, const ShardCall<T>& call, const Geometry& g) {
    const Dims& d = call.dims;
    auto kv = gather_whole<T>(comm, {call.key, call.value}, d.batch, d.kv_heads, g, d.head_dim);
    if (!kv.ok()) return kv.error();
    return std::unique_ptr<Gathered>(new Gathered{std::move(kv.value()[0]), std::move(kv.value()[1]),
                                                  segments_at(call.query_segments, d.batch, d.query_length, g.q_mine),
                                                  segments_at(call.key_segments, d.batch, d.key_length, g.k_order),
                                                  local_bias(call, 0, d.batch, 0, d.heads, g.q_mine, g.k_order)});
  }

  Inputs<T> inputs(const ShardCall<T>& call, const Geometry& g) const {
    const Dims& d = call.dims;
    Inputs<T> in;
    in.dims = Dims{d.batch, d.heads, d.kv_heads, g.ls, d.key_length, d.head_dim};
    in.query = call.query;
    in.key = key.data();
    in.value = value.data();
    in.mask.causal = call.causal;
    in.mask.window = call.window;
    in.mask.query_segments = query_segments;
    in.mask.key_segments = key_segments;
    in.mask.positions = {g.q_mine, g.k_order, d.query_length, d.key_length};
    in.sinks = call.sinks;
    in.scale = call.scale;
    in.query_block = call.query_block;
    in.key_block = call.key_block;
    if (!bias.empty()) in.bias.data = bias.data();
    return in;
  }
};

// The two exchanges (gather.cpp, all_to_all.cpp), after exchange.cpp has
// checked the call and worked out its geometry.
template <typename T>
Result<Stats> gather_forward(Communicator& comm, const ShardCall<T>& call, const Geometry& g, T* out, T* lse);
template <typename T>
Result<Stats> gather_backward(Communicator& comm, const ShardCall<T>& call, const Geometry& g, const T* out,
                              const T* lse, const T* d_out, const Gradients<T>& grads);
template <typename T>
Result<Stats> all_to_all_forward(Communicator& comm, const ShardCall<T>& call, const Geometry& g, T* out, T* lse);
template <typename T>
Result<Stats> all_to_all_backward(Communicator& comm, const ShardCall<T>& call, const Geometry& g, const T* out,
                                  const T* lse, const T* d_out, const Gradients<T>& grads);

}  // namespace dew::attention::detail
