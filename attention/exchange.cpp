// The all-to-all and gather exchanges around the local kernel.
//
// Shapes: N devices, this one `rank`; Ls = query_length / N and Lks =
// key_length / N positions per shard. After an exchange, a whole sequence is
// held in "shard order": shard 0's positions, then shard 1's, ... (for the
// chunk-pair layout that is not position order; the kernel gets the
// positions, so masks still hold).
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "exchange.h"
#include "mask.h"

namespace dew::attention {
namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

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
thread_local std::vector<Block> free_blocks;

Block take_block(std::size_t size) {
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

void give_block(Block block) {
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
    return Error{"all-to-all: heads " + str(d.heads) + " do not divide by the " + str(g.n) +
                 " devices of the sequence group; allowed: a multiple of " + str(g.n) + " (or the gather)"};
  }
  if (d.query_length < 1 || d.key_length < 1) {
    return Error{"exchange: lengths " + str(d.query_length) + " and " + str(d.key_length) +
                 " are not allowed; allowed: whole numbers >= 1"};
  }
  for (int s = 0; s < g.n; ++s) {
    auto q = shard_positions(call.layout, d.query_length, g.n, s);
    if (!q.ok()) return Error{"query " + q.error().message};
    auto k = shard_positions(call.layout, d.key_length, g.n, s);
    if (!k.ok()) return Error{"key " + k.error().message};
    if (s == g.rank) g.q_mine = q.value();
    g.q_order.insert(g.q_order.end(), q.value().begin(), q.value().end());
    g.k_start.push_back(std::int64_t(g.k_order.size()));
    g.k_count.push_back(std::int64_t(k.value().size()));
    g.k_order.insert(g.k_order.end(), k.value().begin(), k.value().end());
  }
  // The all-to-all trades equal slices; the gather takes uneven shards.
  if (exchange == Exchange::kAllToAll && (d.query_length % g.n != 0 || d.key_length % g.n != 0)) {
    return Error{"all-to-all: query length " + str(d.query_length) + " and key length " + str(d.key_length) +
                 " must both divide by the " + str(g.n) + " devices of the sequence group (or use the gather)"};
  }
  g.ls = std::int64_t(g.q_mine.size());
  g.lks = d.key_length / g.n;
  if (call.bias.data != nullptr &&
      (call.bias.batch_stride < -1 || call.bias.head_stride < -1 || call.bias.row_stride < -1)) {
    return Error{"exchange: bias strides " + str(call.bias.batch_stride) + ", " + str(call.bias.head_stride) + ", " +
                 str(call.bias.row_stride) + " are not allowed; allowed: >= 0, or -1 for the dense layout"};
  }
  if (call.query_segments.empty() != call.key_segments.empty()) {
    return Error{"exchange: segments given for " + std::string(call.query_segments.empty() ? "keys" : "queries") +
                 " only; allowed: both or neither"};
  }
  if (!call.query_segments.empty() &&
      (std::int64_t(call.query_segments.size()) != d.batch * d.query_length ||
       std::int64_t(call.key_segments.size()) != d.batch * d.key_length)) {
    return Error{"exchange: segments of " + str(std::int64_t(call.query_segments.size())) + " and " +
                 str(std::int64_t(call.key_segments.size())) +
                 " ids are not allowed; allowed: batch x whole length = " +
                 str(d.batch * d.query_length) + " and " + str(d.batch * d.key_length)};
  }
  return g;
}

// Segment ids of `positions` (per batch entry), from the whole sequences'.
std::vector<std::int32_t> segments_at(std::span<const std::int32_t> whole, int batch, std::int64_t length,
                                      const std::vector<std::int64_t>& positions) {
  std::vector<std::int32_t> out;
  if (whole.empty()) return out;
  out.reserve(std::size_t(batch) * positions.size());
  for (int b = 0; b < batch; ++b)
    for (const std::int64_t p : positions) out.push_back(whole[std::size_t(b * length + p)]);
  return out;
}

// heads -> sequence: from a shard [B][hs][len][w], send destination d the
// heads [start[d], start[d] + count); returns the whole sequence of the heads
// this device was sent, [B][count][N len][w] in shard order.
template <typename T>
Result<Scratch<T>> to_whole_sequence(Communicator& comm, const T* shard, int batch, int hs, std::int64_t len,
                                         std::int64_t w, const std::vector<int>& start, int count) {
  const int n = comm.size();
  const std::size_t row = std::size_t(len * w);
  const std::size_t chunk = std::size_t(batch) * std::size_t(count) * row;
  Scratch<T> send(chunk * std::size_t(n)), recv(send.size());
  for (int d = 0; d < n; ++d)
    for (int b = 0; b < batch; ++b)
      for (int j = 0; j < count; ++j)
        std::memcpy(send.data() + std::size_t(d) * chunk + std::size_t(b * count + j) * row,
                    shard + std::size_t(b * hs + start[std::size_t(d)] + j) * row, row * sizeof(T));
  auto done = comm.all_to_all<T>(send, recv);
  if (!done.ok()) return done.error();
  Scratch<T> whole(send.size());
  for (int s = 0; s < n; ++s)
    for (int b = 0; b < batch; ++b)
      for (int j = 0; j < count; ++j)
        std::memcpy(whole.data() + (std::size_t(b * count + j) * std::size_t(n) + std::size_t(s)) * row,
                    recv.data() + std::size_t(s) * chunk + std::size_t(b * count + j) * row, row * sizeof(T));
  return whole;
}

// sequence -> heads, the reverse: whole [B][count][N len][w] in shard order;
// source s's slice lands in heads [start[s], start[s] + count) of the shard
// [B][hs][len][w], copied or added (in source order).
template <typename T>
Result<Done> to_shard(Communicator& comm, const T* whole, int batch, int count, std::int64_t len, std::int64_t w,
                      T* shard, int hs, const std::vector<int>& start, bool add) {
  const int n = comm.size();
  const std::size_t row = std::size_t(len * w);
  const std::size_t chunk = std::size_t(batch) * std::size_t(count) * row;
  Scratch<T> send(chunk * std::size_t(n)), recv(send.size());
  for (int d = 0; d < n; ++d)
    for (int b = 0; b < batch; ++b)
      for (int j = 0; j < count; ++j)
        std::memcpy(send.data() + std::size_t(d) * chunk + std::size_t(b * count + j) * row,
                    whole + (std::size_t(b * count + j) * std::size_t(n) + std::size_t(d)) * row, row * sizeof(T));
  auto done = comm.all_to_all<T>(send, recv);
  if (!done.ok()) return done;
  if (add) std::fill(shard, shard + std::size_t(batch) * std::size_t(hs) * row, T(0));
  for (int s = 0; s < n; ++s)
    for (int b = 0; b < batch; ++b)
      for (int j = 0; j < count; ++j) {
        T* to = shard + std::size_t(b * hs + start[std::size_t(s)] + j) * row;
        const T* from = recv.data() + std::size_t(s) * chunk + std::size_t(b * count + j) * row;
        if (add) {
          for (std::size_t e = 0; e < row; ++e) to[e] += from[e];
        } else {
          std::memcpy(to, from, row * sizeof(T));
        }
      }
  return Done{};
}

// Gathers every device's [B][k][rows][w] shard into [B][k][L][w] in shard
// order (g.k_order). Shards may differ by a row: each is padded to the
// largest for the all-gather, and only its own rows are kept.
template <typename T>
Result<Scratch<T>> gather_whole(Communicator& comm, const T* shard, int batch, int k, const Geometry& g,
                                std::int64_t w) {
  const int n = comm.size();
  const std::int64_t most = *std::max_element(g.k_count.begin(), g.k_count.end());
  const std::int64_t mine = g.k_count[std::size_t(g.rank)];
  const std::int64_t length = g.k_start.back() + g.k_count.back();
  const std::size_t row = std::size_t(most * w);
  const std::size_t chunk = std::size_t(batch) * std::size_t(k) * row;
  Scratch<T> padded(mine == most ? 0 : chunk);
  if (mine != most) {
    std::fill(padded.data(), padded.data() + chunk, T(0));
    for (int bk = 0; bk < batch * k; ++bk)
      std::memcpy(padded.data() + std::size_t(bk) * row, shard + std::size_t(bk * mine * w),
                  std::size_t(mine * w) * sizeof(T));
  }
  Scratch<T> recv(chunk * std::size_t(n));
  auto done = comm.all_gather<T>(std::span<const T>(mine == most ? shard : padded.data(), chunk), recv);
  if (!done.ok()) return done.error();
  Scratch<T> whole(std::size_t(batch) * std::size_t(k) * std::size_t(length * w));
  for (int s = 0; s < n; ++s)
    for (int bk = 0; bk < batch * k; ++bk)
      std::memcpy(whole.data() + std::size_t((bk * length + g.k_start[std::size_t(s)]) * w),
                  recv.data() + std::size_t(s) * chunk + std::size_t(bk) * row,
                  std::size_t(g.k_count[std::size_t(s)] * w) * sizeof(T));
  return whole;
}

// The all-to-all's head assignment: device d attends query heads
// [d H/N, (d+1) H/N) and receives key heads [start[d], start[d] + count).
struct HeadSplit {
  int per_device = 0;  // H / N
  int count = 0;       // key heads per device: K' / N
  std::vector<int> q_start, kv_start;
};

HeadSplit head_split(const Dims& d, int n) {
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

void add_stats(Stats& total, const Stats& s) {
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

}  // namespace

Result<std::vector<std::int64_t>> shard_positions(Layout layout, std::int64_t length, int devices, int rank) {
  if (devices < 1 || rank < 0 || rank >= devices) {
    return Error{"shard: rank " + str(rank) + " of " + str(devices) + " devices is not allowed"};
  }
  if (layout == Layout::kContiguous) {
    // Uneven lengths: the first length % devices devices hold one row more.
    if (length < devices) {
      return Error{"length " + str(length) + " is shorter than the " + str(devices) +
                   " devices; allowed: at least one position per device"};
    }
    const std::int64_t base = length / devices, extra = length % devices;
    const std::int64_t start = rank * base + std::min<std::int64_t>(rank, extra);
    std::vector<std::int64_t> positions(std::size_t(base + (rank < extra ? 1 : 0)));
    for (std::size_t i = 0; i < positions.size(); ++i) positions[i] = start + std::int64_t(i);
    return positions;
  }
  const std::int64_t parts = 2 * std::int64_t(devices);
  if (length < 0 || length % parts != 0) {
    return Error{"length " + str(length) + " does not divide by 2 x " + str(devices) + " devices = " + str(parts) +
                 " chunks (the chunk-pair layout; the contiguous layout takes any length)"};
  }
  std::vector<std::int64_t> positions;
  const std::int64_t size = length / parts;
  auto chunk = [&](std::int64_t c) {
    for (std::int64_t i = 0; i < size; ++i) positions.push_back(c * size + i);
  };
  chunk(rank);
  chunk(parts - 1 - rank);
  return positions;
}

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
    auto k = gather_whole(comm, call.key, d.batch, d.kv_heads, g, d.head_dim);
    if (!k.ok()) return k.error();
    auto v = gather_whole(comm, call.value, d.batch, d.kv_heads, g, d.head_dim);
    if (!v.ok()) return v.error();
    return std::unique_ptr<Gathered>(new Gathered{
        std::move(k.value()), std::move(v.value()),
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

template <typename T>
Result<Stats> exchange_forward(Exchange exchange, Communicator& comm, const ShardCall<T>& call, T* out, T* lse) {
  auto geo = geometry(exchange, comm, call);
  if (!geo.ok()) return geo.error();
  const Geometry& g = geo.value();
  const Dims& d = call.dims;
  const std::int64_t w = d.head_dim;

  if (exchange == Exchange::kGather) {
    auto gathered = Gathered<T>::make(comm, call, g);
    if (!gathered.ok()) return gathered.error();
    const Inputs<T> in = gathered.value()->inputs(call, g);
    return forward<T>(in, out, lse);
  }

  const HeadSplit split = head_split(d, g.n);
  auto q = to_whole_sequence(comm, call.query, d.batch, d.heads, g.ls, w, split.q_start, split.per_device);
  if (!q.ok()) return q.error();
  auto k = to_whole_sequence(comm, call.key, d.batch, d.kv_heads, g.lks, w, split.kv_start, split.count);
  if (!k.ok()) return k.error();
  auto v = to_whole_sequence(comm, call.value, d.batch, d.kv_heads, g.lks, w, split.kv_start, split.count);
  if (!v.ok()) return v.error();
  const std::int64_t lq = d.query_length, lk = d.key_length;
  Scratch<T> o(q.value().size()), l(std::size_t(d.batch) * std::size_t(split.per_device) * std::size_t(lq));
  LocalRuns<T> runs{call, g, split, segments_at(call.query_segments, d.batch, lq, g.q_order),
                    segments_at(call.key_segments, d.batch, lk, g.k_order)};
  auto stats = runs.each([&](Inputs<T>& in, int b, int u, int ja) {
    const std::size_t q_at = std::size_t(b * split.per_device + ja) * std::size_t(lq);
    in.query = q.value().data() + q_at * std::size_t(w);
    const std::size_t kv_at = std::size_t(b * split.count + u) * std::size_t(lk * w);
    in.key = k.value().data() + kv_at;
    in.value = v.value().data() + kv_at;
    return forward<T>(in, o.data() + q_at * std::size_t(w), l.data() + q_at);
  });
  if (!stats.ok()) return stats;
  auto back = to_shard(comm, o.data(), d.batch, split.per_device, g.ls, w, out, d.heads, split.q_start, false);
  if (!back.ok()) return back.error();
  if (lse != nullptr) {
    back = to_shard(comm, l.data(), d.batch, split.per_device, g.ls, 1, lse, d.heads, split.q_start, false);
    if (!back.ok()) return back.error();
  }
  return stats;
}

template <typename T>
Result<Stats> exchange_backward(Exchange exchange, Communicator& comm, const ShardCall<T>& call, const T* out,
                                const T* lse, const T* d_out, const Gradients<T>& grads) {
  auto geo = geometry(exchange, comm, call);
  if (!geo.ok()) return geo.error();
  const Geometry& g = geo.value();
  const Dims& d = call.dims;
  const std::int64_t w = d.head_dim;
  if (grads.sinks != nullptr && call.sinks == nullptr) {
    return Error{"exchange: a sinks gradient was asked for a call without sinks"};
  }
  if (out == nullptr || lse == nullptr || d_out == nullptr || grads.query == nullptr || grads.key == nullptr ||
      grads.value == nullptr) {
    return Error{"exchange: backward needs out, lse, d_out and the query, key and value gradients (a null pointer "
                 "was passed)"};
  }

  if (exchange == Exchange::kGather) {
    auto gathered = Gathered<T>::make(comm, call, g);
    if (!gathered.ok()) return gathered.error();
    const Inputs<T> in = gathered.value()->inputs(call, g);
    Scratch<T> dk(gathered.value()->key.size()), dv(gathered.value()->value.size());  // the kernel writes every element
    std::vector<T> ds(grads.sinks ? std::size_t(d.heads) : 0);
    auto stats = backward<T>(in, out, lse, d_out,
                             Gradients<T>{grads.query, dk.data(), dv.data(), grads.sinks ? ds.data() : nullptr});
    if (!stats.ok()) return stats;
    // dK, dV: every device's partial sums for every position; reduce-scatter
    // each shard's positions to it (shards padded to the largest, as in
    // gather_whole; the padding rows are zeros and are not kept).
    const std::int64_t most = *std::max_element(g.k_count.begin(), g.k_count.end());
    const std::int64_t mine = g.k_count[std::size_t(g.rank)];
    const std::size_t row = std::size_t(most * w);
    const std::size_t chunk = std::size_t(d.batch) * std::size_t(d.kv_heads) * row;
    const int rows_of = d.batch * d.kv_heads;
    Scratch<T> send(chunk * std::size_t(g.n));
    Scratch<T> padded(mine == most ? 0 : chunk);
    if (mine != most || *std::min_element(g.k_count.begin(), g.k_count.end()) != most) {
      std::fill(send.data(), send.data() + send.size(), T(0));
    }
    for (auto [whole, target] : {std::pair{&dk, grads.key}, std::pair{&dv, grads.value}}) {
      for (int s = 0; s < g.n; ++s)
        for (int bk = 0; bk < rows_of; ++bk)
          std::memcpy(send.data() + std::size_t(s) * chunk + std::size_t(bk) * row,
                      whole->data() + std::size_t((bk * d.key_length + g.k_start[std::size_t(s)]) * w),
                      std::size_t(g.k_count[std::size_t(s)] * w) * sizeof(T));
      auto done = comm.reduce_scatter(std::span<const T>(send),
                                      std::span<T>(mine == most ? target : padded.data(), chunk));
      if (!done.ok()) return done.error();
      if (mine != most) {
        for (int bk = 0; bk < rows_of; ++bk)
          std::memcpy(target + std::size_t(bk * mine * w), padded.data() + std::size_t(bk) * row,
                      std::size_t(mine * w) * sizeof(T));
      }
    }
    if (grads.sinks != nullptr) {
      std::vector<T> all(std::size_t(d.heads) * std::size_t(g.n));
      auto done = comm.all_gather<T>(ds, all);
      if (!done.ok()) return done.error();
      for (int h = 0; h < d.heads; ++h) {
        T sum = 0;
        for (int s = 0; s < g.n; ++s) sum += all[std::size_t(s * d.heads + h)];
        grads.sinks[h] = sum;
      }
    }
    return stats;
  }

  const HeadSplit split = head_split(d, g.n);
  const int hn = split.per_device;
  auto q = to_whole_sequence(comm, call.query, d.batch, d.heads, g.ls, w, split.q_start, hn);
  if (!q.ok()) return q.error();
  auto k = to_whole_sequence(comm, call.key, d.batch, d.kv_heads, g.lks, w, split.kv_start, split.count);
  if (!k.ok()) return k.error();
  auto v = to_whole_sequence(comm, call.value, d.batch, d.kv_heads, g.lks, w, split.kv_start, split.count);
  if (!v.ok()) return v.error();
  auto o = to_whole_sequence(comm, out, d.batch, d.heads, g.ls, w, split.q_start, hn);
  if (!o.ok()) return o.error();
  auto l = to_whole_sequence(comm, lse, d.batch, d.heads, g.ls, 1, split.q_start, hn);
  if (!l.ok()) return l.error();
  auto dout = to_whole_sequence(comm, d_out, d.batch, d.heads, g.ls, w, split.q_start, hn);
  if (!dout.ok()) return dout.error();
  const std::int64_t lq = d.query_length, lk = d.key_length;
  Scratch<T> dq(q.value().size());  // every head written by one local run
  Scratch<T> dk(k.value().size()), dv(v.value().size());
  std::fill(dk.data(), dk.data() + dk.size(), T(0));  // key heads no local run reads stay 0
  std::fill(dv.data(), dv.data() + dv.size(), T(0));
  std::vector<T> ds(static_cast<std::size_t>(hn), T(0));
  std::vector<T> ds_part(static_cast<std::size_t>(hn));
  LocalRuns<T> runs{call, g, split, segments_at(call.query_segments, d.batch, lq, g.q_order),
                    segments_at(call.key_segments, d.batch, lk, g.k_order)};
  auto stats = runs.each([&](Inputs<T>& in, int b, int u, int ja) -> Result<Stats> {
    const std::size_t q_at = std::size_t(b * hn + ja) * std::size_t(lq);
    in.query = q.value().data() + q_at * std::size_t(w);
    const std::size_t kv_at = std::size_t(b * split.count + u) * std::size_t(lk * w);
    in.key = k.value().data() + kv_at;
    in.value = v.value().data() + kv_at;
    const bool sinks = grads.sinks != nullptr;
    auto r = backward<T>(in, o.value().data() + q_at * std::size_t(w), l.value().data() + q_at,
                         dout.value().data() + q_at * std::size_t(w),
                         Gradients<T>{dq.data() + q_at * std::size_t(w), dk.data() + kv_at, dv.data() + kv_at,
                                      sinks ? ds_part.data() : nullptr});
    if (r.ok() && sinks)
      for (int j = 0; j < in.dims.heads; ++j) ds[std::size_t(ja + j)] += ds_part[std::size_t(j)];
    return r;
  });
  if (!stats.ok()) return stats;
  auto back = to_shard(comm, dq.data(), d.batch, hn, g.ls, w, grads.query, d.heads, split.q_start, false);
  if (!back.ok()) return back.error();
  back = to_shard(comm, dk.data(), d.batch, split.count, g.lks, w, grads.key, d.kv_heads, split.kv_start, true);
  if (!back.ok()) return back.error();
  back = to_shard(comm, dv.data(), d.batch, split.count, g.lks, w, grads.value, d.kv_heads, split.kv_start, true);
  if (!back.ok()) return back.error();
  if (grads.sinks != nullptr) {
    std::vector<T> all(std::size_t(d.heads));
    auto done = comm.all_gather<T>(ds, all);
    if (!done.ok()) return done.error();
    std::copy(all.begin(), all.end(), grads.sinks);
  }
  return stats;
}

template Result<Stats> exchange_forward<float>(Exchange, Communicator&, const ShardCall<float>&, float*, float*);
template Result<Stats> exchange_forward<double>(Exchange, Communicator&, const ShardCall<double>&, double*, double*);
template Result<Stats> exchange_backward<float>(Exchange, Communicator&, const ShardCall<float>&, const float*,
                                                const float*, const float*, const Gradients<float>&);
template Result<Stats> exchange_backward<double>(Exchange, Communicator&, const ShardCall<double>&, const double*,
                                                 const double*, const double*, const Gradients<double>&);

}  // namespace dew::attention
