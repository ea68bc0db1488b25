// The all-to-all exchange (DeepSpeed Ulysses): each device trades its shard
// of the positions for a slice of the heads, attends the whole sequence for
// those heads and trades back. Key/value heads are repeated only as far as
// the split needs.
#include "exchange_parts.h"

namespace dew::attention::detail {

template <typename T>
Result<Stats> all_to_all_forward(Communicator& comm, const ShardCall<T>& call, const Geometry& g, T* out, T* lse) {
  const Dims& d = call.dims;
  const std::int64_t w = d.head_dim;
  const HeadSplit split = head_split(d, g.n);
  const int hn = split.per_device;
  auto qkv = to_whole_sequences<T>(comm, d.batch,
                                   {{call.query, d.heads, g.ls, w, split.q_start, hn},
                                    {call.key, d.kv_heads, g.lks, w, split.kv_start, split.count},
                                    {call.value, d.kv_heads, g.lks, w, split.kv_start, split.count}});
  if (!qkv.ok()) return qkv.error();
  const Scratch<T>& q = qkv.value()[0];
  const Scratch<T>& k = qkv.value()[1];
  const Scratch<T>& v = qkv.value()[2];
  const std::int64_t lq = d.query_length, lk = d.key_length;
  Scratch<T> o(q.size()), l(std::size_t(d.batch) * std::size_t(hn) * std::size_t(lq));
  LocalRuns<T> runs{call, g, split, segments_at(call.query_segments, d.batch, lq, g.q_order),
                    segments_at(call.key_segments, d.batch, lk, g.k_order)};
  auto stats = runs.each([&](Inputs<T>& in, int b, int u, int ja) {
    const std::size_t q_at = std::size_t(b * hn + ja) * std::size_t(lq);
    in.query = q.data() + q_at * std::size_t(w);
    const std::size_t kv_at = std::size_t(b * split.count + u) * std::size_t(lk * w);
    in.key = k.data() + kv_at;
    in.value = v.data() + kv_at;
    return forward<T>(in, o.data() + q_at * std::size_t(w), l.data() + q_at);
  });
  if (!stats.ok()) return stats;
  const ToShard<T> to_out{o.data(), hn, g.ls, w, out, d.heads, split.q_start, false};
  auto back = lse == nullptr
                  ? to_shards<T>(comm, d.batch, {to_out})
                  : to_shards<T>(comm, d.batch, {to_out, {l.data(), hn, g.ls, 1, lse, d.heads, split.q_start, false}});
  if (!back.ok()) return back.error();
  return stats;
}

template <typename T>
Result<Stats> all_to_all_backward(Communicator& comm, const ShardCall<T>& call, const Geometry& g, const T* out,
                                  const T* lse, const T* d_out, const Gradients<T>& grads) {
  const Dims& d = call.dims;
  const std::int64_t w = d.head_dim;
  const HeadSplit split = head_split(d, g.n);
  const int hn = split.per_device;
  auto traded = to_whole_sequences<T>(comm, d.batch,
                                      {{call.query, d.heads, g.ls, w, split.q_start, hn},
                                       {call.key, d.kv_heads, g.lks, w, split.kv_start, split.count},
                                       {call.value, d.kv_heads, g.lks, w, split.kv_start, split.count},
                                       {out, d.heads, g.ls, w, split.q_start, hn},
                                       {lse, d.heads, g.ls, 1, split.q_start, hn},
                                       {d_out, d.heads, g.ls, w, split.q_start, hn}});
  if (!traded.ok()) return traded.error();
  const Scratch<T>& q = traded.value()[0];
  const Scratch<T>& k = traded.value()[1];
  const Scratch<T>& v = traded.value()[2];
  const Scratch<T>& o = traded.value()[3];
  const Scratch<T>& l = traded.value()[4];
  const Scratch<T>& dout = traded.value()[5];
  const std::int64_t lq = d.query_length, lk = d.key_length;
  Scratch<T> dq(q.size());  // every head written by one local run
  Scratch<T> dk(k.size()), dv(v.size());
  std::fill(dk.data(), dk.data() + dk.size(), T(0));  // key heads no local run reads stay 0
  std::fill(dv.data(), dv.data() + dv.size(), T(0));
  std::vector<T> ds(static_cast<std::size_t>(hn), T(0));
  std::vector<T> ds_part(static_cast<std::size_t>(hn));
  LocalRuns<T> runs{call, g, split, segments_at(call.query_segments, d.batch, lq, g.q_order),
                    segments_at(call.key_segments, d.batch, lk, g.k_order)};
  auto stats = runs.each([&](Inputs<T>& in, int b, int u, int ja) -> Result<Stats> {
    const std::size_t q_at = std::size_t(b * hn + ja) * std::size_t(lq);
    in.query = q.data() + q_at * std::size_t(w);
    const std::size_t kv_at = std::size_t(b * split.count + u) * std::size_t(lk * w);
    in.key = k.data() + kv_at;
    in.value = v.data() + kv_at;
    const bool sinks = grads.sinks != nullptr;
    auto r = backward<T>(in, o.data() + q_at * std::size_t(w), l.data() + q_at, dout.data() + q_at * std::size_t(w),
                         Gradients<T>{dq.data() + q_at * std::size_t(w), dk.data() + kv_at, dv.data() + kv_at,
                                      sinks ? ds_part.data() : nullptr});
    if (r.ok() && sinks)
      for (int j = 0; j < in.dims.heads; ++j) ds[std::size_t(ja + j)] += ds_part[std::size_t(j)];
    return r;
  });
  if (!stats.ok()) return stats;
  auto back = to_shards<T>(comm, d.batch,
                           {{dq.data(), hn, g.ls, w, grads.query, d.heads, split.q_start, false},
                            {dk.data(), split.count, g.lks, w, grads.key, d.kv_heads, split.kv_start, true},
                            {dv.data(), split.count, g.lks, w, grads.value, d.kv_heads, split.kv_start, true}});
  if (!back.ok()) return back.error();
  if (grads.sinks != nullptr) {
    std::vector<T> all(std::size_t(d.heads));
    auto done = comm.all_gather<T>(ds, all);
    if (!done.ok()) return done.error();
    std::copy(all.begin(), all.end(), grads.sinks);
  }
  return stats;
}

template Result<Stats> all_to_all_forward<float>(Communicator&, const ShardCall<float>&, const Geometry&, float*,
                                                 float*);
template Result<Stats> all_to_all_forward<double>(Communicator&, const ShardCall<double>&, const Geometry&, double*,
                                                  double*);
template Result<Stats> all_to_all_backward<float>(Communicator&, const ShardCall<float>&, const Geometry&, const float*,
                                                  const float*, const float*, const Gradients<float>&);
template Result<Stats> all_to_all_backward<double>(Communicator&, const ShardCall<double>&, const Geometry&,
                                                   const double*, const double*, const double*,
                                                   const Gradients<double>&);

}  // namespace dew::attention::detail
