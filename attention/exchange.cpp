// The all-to-all and gather exchanges around the local kernel.
//
// Shapes: N devices, this one `rank`; Ls = query_length / N and Lks =
// key_length / N positions per shard. After an exchange, a whole sequence is
// held in "shard order": shard 0's positions, then shard 1's, ... (for the
// chunk-pair layout that is not position order; the kernel gets the
// positions, so masks still hold).
#include "exchange_parts.h"

namespace dew::attention {

using detail::str;

Result<std::vector<std::int64_t>> shard_positions(Layout layout, std::int64_t length, int devices, int rank) {
  if (devices < 1 || rank < 0 || rank >= devices) {
    return invalid_argument("shard: rank " + str(rank) + " of " + str(devices) + " devices is not allowed");
  }
  if (layout == Layout::kContiguous) {
    // Uneven lengths: the first length % devices devices hold one row more.
    if (length < devices) {
      return invalid_argument("length " + str(length) + " is shorter than the " + str(devices) +
                              " devices; allowed: at least one position per device");
    }
    const std::int64_t base = length / devices, extra = length % devices;
    const std::int64_t start = rank * base + std::min<std::int64_t>(rank, extra);
    std::vector<std::int64_t> positions(std::size_t(base + (rank < extra ? 1 : 0)));
    for (std::size_t i = 0; i < positions.size(); ++i) positions[i] = start + std::int64_t(i);
    return positions;
  }
  const std::int64_t parts = 2 * std::int64_t(devices);
  if (length < 0 || length % parts != 0) {
    return invalid_argument("length " + str(length) + " does not divide by 2 x " + str(devices) + " devices = " +
                            str(parts) + " chunks (the chunk-pair layout; the contiguous layout takes any length)");
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

template <typename T>
Result<Stats> exchange_forward(Exchange exchange, Communicator& comm, const ShardCall<T>& call, T* out, T* lse) {
  auto g = detail::geometry(exchange, comm, call);
  if (!g.ok()) return g.error();
  if (exchange == Exchange::kGather) return detail::gather_forward(comm, call, g.value(), out, lse);
  return detail::all_to_all_forward(comm, call, g.value(), out, lse);
}

template <typename T>
Result<Stats> exchange_backward(Exchange exchange, Communicator& comm, const ShardCall<T>& call, const T* out,
                                const T* lse, const T* d_out, const Gradients<T>& grads) {
  auto g = detail::geometry(exchange, comm, call);
  if (!g.ok()) return g.error();
  if (grads.sinks != nullptr && call.sinks == nullptr) {
    return invalid_argument("exchange: a sinks gradient was asked for a call without sinks");
  }
  if (out == nullptr || lse == nullptr || d_out == nullptr || grads.query == nullptr || grads.key == nullptr ||
      grads.value == nullptr) {
    return invalid_argument(
        "exchange: backward needs out, lse, d_out and the query, key and value gradients (a null pointer "
        "was passed)");
  }

  if (exchange == Exchange::kGather) return detail::gather_backward(comm, call, g.value(), out, lse, d_out, grads);
  return detail::all_to_all_backward(comm, call, g.value(), out, lse, d_out, grads);
}

template Result<Stats> exchange_forward<float>(Exchange, Communicator&, const ShardCall<float>&, float*, float*);
template Result<Stats> exchange_forward<double>(Exchange, Communicator&, const ShardCall<double>&, double*, double*);
template Result<Stats> exchange_backward<float>(Exchange, Communicator&, const ShardCall<float>&, const float*,
                                                const float*, const float*, const Gradients<float>&);
template Result<Stats> exchange_backward<double>(Exchange, Communicator&, const ShardCall<double>&, const double*,
                                                 const double*, const double*, const Gradients<double>&);

}  // namespace dew::attention
