// Collectives over one group of devices (one mesh axis group), for the
// sequence-parallel exchanges (namespace dew::attention).
//
//   Communicator        all_to_all, all_gather, reduce_scatter (fp32/fp64
//                       accumulation in rank order), barrier
//   make_gloo_communicator   one Gloo rank over TCP, its rendezvous through a
//                       key-value store given as two functions (put, get)
//   make_nccl_communicator   (nccl_communicator.h, built where CUDA is) one
//                       NCCL rank on one GPU, its unique id through the store
//   local_key_value     an in-process store, for ranks that are threads of
//                       one process and no pool (tests, benchmarks)
//
// Across processes the store is the runtime pool's key-value exchange:
// pool_key_value(pool, timeout), or make_axis_communicator for a mesh axis's
// group (axis_communicator.h).
//
// Every call is collective: every rank of the group makes it, in the same
// order, with the same sizes. Failures (a peer gone, a timeout, sizes that do
// not fit) come back as one-line errors, never as exceptions.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dew/result.h"

namespace dew::attention {

struct Done {};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // send holds size() equal chunks; chunk i goes to rank i, and recv's chunk
  // i comes from rank i. Both spans have the same length in bytes.
  virtual Result<Done> all_to_all_bytes(std::span<const std::byte> send, std::span<std::byte> recv) = 0;
  // recv (size() x send's length) holds every rank's send, in rank order.
  virtual Result<Done> all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv) = 0;
  virtual Result<Done> barrier() = 0;

  template <typename T>
  Result<Done> all_to_all(std::span<const T> send, std::span<T> recv) {
    const auto n = static_cast<std::size_t>(size());
    if (send.size() != recv.size() || send.size() % n != 0) {
      return Error{"all_to_all: " + std::to_string(send.size()) + " values to send and " +
                   std::to_string(recv.size()) + " to receive are not allowed; allowed: equal counts dividing by " +
                   std::to_string(n) + " ranks"};
    }
    return all_to_all_bytes(std::as_bytes(send), std::as_writable_bytes(recv));
  }
  template <typename T>
  Result<Done> all_gather(std::span<const T> send, std::span<T> recv) {
    return all_gather_bytes(std::as_bytes(send), std::as_writable_bytes(recv));
  }
  // send holds size() equal chunks; recv (one chunk) becomes the sum over the
  // ranks of their chunk rank(), added in rank order in T (float: fp32
  // accumulation). Sends what a ring reduce-scatter sends: (size-1)/size of
  // send. Virtual so a backend can use its own: NCCL's (nccl_communicator.h)
  // adds in T too, but in NCCL's order, which is rank order only up to 2 ranks.
  virtual Result<Done> reduce_scatter(std::span<const float> send, std::span<float> recv);
  virtual Result<Done> reduce_scatter(std::span<const double> send, std::span<double> recv);
};

// A key-value store as two functions: put(key, value) publishes, get(key)
// waits for the key (up to the timeout the store keeps) and returns its value,
// throwing std::runtime_error when it cannot.
struct KeyValue {
  std::function<void(const std::string&, const std::vector<char>&)> put;
  std::function<std::vector<char>(const std::string&)> get;
};

// A store in this process's memory, shared by every copy of the returned value, so
// ranks running as threads of one process can rendezvous. get waits up to
// `timeout` for a key.
KeyValue local_key_value(std::chrono::milliseconds timeout = std::chrono::seconds(30));

struct GlooOptions {
  int rank = 0;
  int size = 1;
  KeyValue store;
  // Keys are prefixed with this, so several groups can share one store.
  std::string prefix = "dew/attention";
  // The address this rank listens on and peers reach it at.
  std::string hostname = "127.0.0.1";
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
};

// Connects this rank to every other rank of the group over TCP (Gloo's full
// mesh); every rank calls it at the same time.
Result<std::unique_ptr<Communicator>> make_gloo_communicator(const GlooOptions& options);

}  // namespace dew::attention
