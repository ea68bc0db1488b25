// The gather exchange: queries stay, keys and values are gathered whole on
// every device; the backward reduce-scatters dK and dV (accumulating in T)
// and sums the sinks' gradient over the devices.
#include "exchange_parts.h"

namespace dew::attention::detail {
namespace {

// dK, dV: every device's partial sums for every position; reduce-scatter
// each shard's positions to it (shards padded to the largest, as in
// gather_whole; the padding rows are zeros and are not kept). Both travel in
// one reduce-scatter: destination s's chunk is its dK rows, then its dV rows.
template <typename T>
Result<Done> reduce_scatter_key_value(Communicator& comm, const Dims& d, const Geometry& g, const Scratch<T>& dk,
                                      const Scratch<T>& dv, T* grad_key, T* grad_value) {
  const std::int64_t w = d.head_dim;
  const std::int64_t most = *std::max_element(g.k_count.begin(), g.k_count.end());
  const std::int64_t mine = g.k_count[std::size_t(g.rank)];
  const std::size_t row = std::size_t(most * w);
  const std::size_t rows_of = std::size_t(d.batch) * std::size_t(d.kv_heads);
  const std::size_t part = rows_of * row, chunk = 2 * part;
  Scratch<T> send(chunk * std::size_t(g.n)), mine_sum(chunk);
  const std::pair<const Scratch<T>*, T*> tensors[] = {{&dk, grad_key}, {&dv, grad_value}};
  for (std::size_t s = 0; s < std::size_t(g.n); ++s)
    for (std::size_t i = 0; i < 2; ++i)
      for (std::size_t bk = 0; bk < rows_of; ++bk) {
        T* to = send.data() + s * chunk + i * part + bk * row;
        const std::int64_t count = g.k_count[s];
        std::memcpy(
            to,
            tensors[i].first->data() + (bk * std::size_t(d.key_length) + std::size_t(g.k_start[s])) * std::size_t(w),
            std::size_t(count * w) * sizeof(T));
        std::fill(to + count * w, to + row, T(0));
      }
  auto done = comm.reduce_scatter(std::span<const T>(send), std::span<T>(mine_sum));
  if (!done.ok()) return done;
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t bk = 0; bk < rows_of; ++bk)
      std::memcpy(tensors[i].second + bk * std::size_t(mine * w), mine_sum.data() + i * part + bk * row,
                  std::size_t(mine * w) * sizeof(T));
  return Done{};
}

// The sinks' gradient: every device's partial sum per head, added over the
// devices in rank order.
template <typename T>
Result<Done> sum_sinks_gradient(Communicator& comm, const Dims& d, const Geometry& g, const std::vector<T>& ds,
                                T* grad_sinks) {
  std::vector<T> all(std::size_t(d.heads) * std::size_t(g.n));
  auto done = comm.all_gather<T>(ds, all);
  if (!done.ok()) return done;
  for (int h = 0; h < d.heads; ++h) {
    T sum = 0;
    for (int s = 0; s < g.n; ++s) sum += all[std::size_t(s * d.heads + h)];
    grad_sinks[h] = sum;
  }
  return Done{};
}

}  // namespace

template <typename T>
Result<Stats> gather_forward(Communicator& comm, const ShardCall<T>& call, const Geometry& g, T* out, T* lse) {
  auto gathered = Gathered<T>::make(comm, call, g);
  if (!gathered.ok()) return gathered.error();
  const Inputs<T> in = gathered.value()->inputs(call, g);
  return forward<T>(in, out, lse);
}

template <typename T>
Result<Stats> gather_backward(Communicator& comm, const ShardCall<T>& call, const Geometry& g, const T* out,
                              const T* lse, const T* d_out, const Gradients<T>& grads) {
  const Dims& d = call.dims;
  auto gathered = Gathered<T>::make(comm, call, g);
  if (!gathered.ok()) return gathered.error();
  const Inputs<T> in = gathered.value()->inputs(call, g);
  Scratch<T> dk(gathered.value()->key.size()), dv(gathered.value()->value.size());  // the kernel writes every element
  std::vector<T> ds(grads.sinks ? std::size_t(d.heads) : 0);
  auto stats = backward<T>(in, out, lse, d_out,
                           Gradients<T>{grads.query, dk.data(), dv.data(), grads.sinks ? ds.data() : nullptr});
  if (!stats.ok()) return stats;
  auto done = reduce_scatter_key_value(comm, d, g, dk, dv, grads.key, grads.value);
  if (!done.ok()) return done.error();
  if (grads.sinks != nullptr) {
    done = sum_sinks_gradient(comm, d, g, ds, grads.sinks);
    if (!done.ok()) return done.error();
  }
  return stats;
}

template Result<Stats> gather_forward<float>(Communicator&, const ShardCall<float>&, const Geometry&, float*, float*);
template Result<Stats> gather_forward<double>(Communicator&, const ShardCall<double>&, const Geometry&, double*,
                                              double*);
template Result<Stats> gather_backward<float>(Communicator&, const ShardCall<float>&, const Geometry&, const float*,
                                              const float*, const float*, const Gradients<float>&);
template Result<Stats> gather_backward<double>(Communicator&, const ShardCall<double>&, const Geometry&, const double*,
                                               const double*, const double*, const Gradients<double>&);

}  // namespace dew::attention::detail
