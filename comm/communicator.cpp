// What every communicator shares: reduce-scatter as an all-to-all of the
// chunks and a sum in rank order, all-reduce as a reduce-scatter and an
// all-gather, and a broadcast through an all-gather for backends without one.
#include <string>
#include <vector>

#include "dew/comm.h"

namespace dew::comm {
namespace {

template <typename T>
Result<Done> reduce_scatter_via_all_to_all(Communicator& comm, std::span<const T> send, std::span<T> recv) {
  const std::size_t n = static_cast<std::size_t>(comm.size());
  // Kept per thread: a fresh buffer of this size (tens of MiB for dK and dV)
  // is mapped and page-faulted in again on every call, which on a virtual
  // machine costs a few percent of a gather's backward.
  thread_local std::vector<T> gathered;
  gathered.resize(send.size());
  auto done = comm.all_to_all<T>(send, gathered);
  if (!done.ok()) return done;
  // Rank by rank over the whole chunk: each element still adds the ranks
  // in rank order (the same bits), but the loop reads memory in order and
  // vectorizes.
  const std::size_t chunk = recv.size();
  std::copy(gathered.begin(), gathered.begin() + static_cast<std::ptrdiff_t>(chunk), recv.begin());
  for (std::size_t r = 1; r < n; ++r) {
    const T* from = gathered.data() + r * chunk;
    for (std::size_t i = 0; i < chunk; ++i) recv[i] += from[i];
  }
  return Done{};
}

// Each element is summed once, in rank order, by the rank that owns its
// chunk, then gathered: every rank ends with the same bits. The data is
// padded with zeros to a multiple of the group's size.
template <typename T>
Result<Done> all_reduce_via_reduce_scatter(Communicator& comm, std::span<T> data) {
  const std::size_t n = static_cast<std::size_t>(comm.size());
  if (n == 1 || data.empty()) return Done{};
  const std::size_t chunk = (data.size() + n - 1) / n;
  // Kept per thread, as reduce_scatter's: no fresh pages on every call.
  thread_local std::vector<T> padded, mine;
  mine.resize(chunk);
  if (data.size() == chunk * n) {  // no padding: straight from and back into data
    auto reduced = comm.reduce_scatter(std::span<const T>(data), std::span<T>(mine));
    if (!reduced.ok()) return reduced;
    return comm.all_gather<T>(std::span<const T>(mine), data);
  }
  padded.assign(chunk * n, T{0});
  std::copy(data.begin(), data.end(), padded.begin());
  auto reduced = comm.reduce_scatter(std::span<const T>(padded), std::span<T>(mine));
  if (!reduced.ok()) return reduced;
  auto gathered = comm.all_gather<T>(std::span<const T>(mine), std::span<T>(padded));
  if (!gathered.ok()) return gathered;
  std::copy(padded.begin(), padded.begin() + static_cast<std::ptrdiff_t>(data.size()), data.begin());
  return Done{};
}

}  // namespace

std::optional<Error> Communicator::check_all_to_all(std::size_t send, std::size_t recv, const char* unit) const {
  const auto n = static_cast<std::size_t>(size());
  if (send == recv && send % n == 0) return std::nullopt;
  return invalid_argument("all_to_all: " + std::to_string(send) + " " + unit + " to send and " + std::to_string(recv) +
                          " to receive are not allowed; allowed: equal counts dividing by " + std::to_string(n) +
                          " ranks");
}

std::optional<Error> Communicator::check_all_gather(std::size_t send, std::size_t recv, const char* unit) const {
  const auto n = static_cast<std::size_t>(size());
  if (recv == send * n) return std::nullopt;
  return invalid_argument("all_gather: " + std::to_string(recv) + " " + unit + " to receive is not allowed; allowed: " +
                          std::to_string(n) + " ranks x " + std::to_string(send) + " sent");
}

std::optional<Error> Communicator::check_reduce_scatter(std::size_t send, std::size_t recv) const {
  const auto n = static_cast<std::size_t>(size());
  if (send == recv * n) return std::nullopt;
  return invalid_argument("reduce_scatter: " + std::to_string(send) +
                          " values to send is not allowed; allowed: " + std::to_string(n) + " ranks x " +
                          std::to_string(recv) + " received = " + std::to_string(recv * n));
}

Result<Done> Communicator::reduce_scatter(std::span<const float> send, std::span<float> recv) {
  if (auto bad = check_reduce_scatter(send.size(), recv.size())) return *bad;
  return reduce_scatter_via_all_to_all<float>(*this, send, recv);
}

Result<Done> Communicator::reduce_scatter(std::span<const double> send, std::span<double> recv) {
  if (auto bad = check_reduce_scatter(send.size(), recv.size())) return *bad;
  return reduce_scatter_via_all_to_all<double>(*this, send, recv);
}

Result<Done> Communicator::all_reduce(std::span<float> data) { return all_reduce_via_reduce_scatter(*this, data); }

Result<Done> Communicator::all_reduce(std::span<double> data) { return all_reduce_via_reduce_scatter(*this, data); }

Result<Done> Communicator::broadcast_bytes(std::span<std::byte> data, int root) {
  const int n = size();
  if (root < 0 || root >= n) {
    return invalid_argument("broadcast: root " + std::to_string(root) + " is not allowed; allowed: a rank from 0 to " +
                            std::to_string(n - 1));
  }
  if (n == 1) return Done{};
  std::vector<std::byte> all(data.size() * static_cast<std::size_t>(n));
  auto gathered = all_gather_bytes(data, all);
  if (!gathered.ok()) return gathered;
  const auto first = all.begin() + static_cast<std::ptrdiff_t>(data.size() * static_cast<std::size_t>(root));
  std::copy(first, first + static_cast<std::ptrdiff_t>(data.size()), data.begin());
  return Done{};
}

}  // namespace dew::comm
