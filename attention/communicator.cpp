// The reduce-scatter every communicator shares: an all-to-all of the chunks,
// then a sum in rank order.
#include <string>
#include <vector>

#include "communicator.h"

namespace dew::attention {
namespace {

template <typename T>
Result<Done> reduce_scatter_via_all_to_all(Communicator& comm, std::span<const T> send, std::span<T> recv) {
  const std::size_t n = static_cast<std::size_t>(comm.size());
  if (send.size() != recv.size() * n) {
    return Error{"reduce_scatter: " + std::to_string(send.size()) + " values to send is not allowed; allowed: " +
                 std::to_string(n) + " ranks x " + std::to_string(recv.size()) + " received = " +
                 std::to_string(recv.size() * n)};
  }
  // Kept per thread: a fresh buffer of this size (tens of MiB for dK and dV)
  // is mapped and page-faulted in again on every call, which on a virtual
  // machine costs a few percent of a gather's backward.
  thread_local std::vector<T> gathered;
  gathered.resize(send.size());
  auto done = comm.all_to_all<T>(send, gathered);
  if (!done.ok()) return done;
  const std::size_t chunk = recv.size();
  for (std::size_t i = 0; i < chunk; ++i) {
    T sum = gathered[i];
    for (std::size_t r = 1; r < n; ++r) sum += gathered[r * chunk + i];
    recv[i] = sum;
  }
  return Done{};
}

}  // namespace

Result<Done> Communicator::reduce_scatter(std::span<const float> send, std::span<float> recv) {
  return reduce_scatter_via_all_to_all<float>(*this, send, recv);
}

Result<Done> Communicator::reduce_scatter(std::span<const double> send, std::span<double> recv) {
  return reduce_scatter_via_all_to_all<double>(*this, send, recv);
}

}  // namespace dew::attention
