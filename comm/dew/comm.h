// Collectives over one group of devices (namespace dew::comm). A group
// knows only a key-value store for its rendezvous: no pool, no mesh (the
// groups of a mesh axis over a pool are made in axes/, dew/axes.h).
//
//   Communicator        all_to_all, all_gather, reduce_scatter and all_reduce
//                       (sums in rank order, fp32 or fp64), broadcast, barrier
//   make_gloo_communicator   one Gloo rank over TCP, its rendezvous through a
//                       KeyValue store (put, get)
//   make_nccl_communicator   (dew/nccl.h, built where CUDA is) one NCCL rank on
//                       one GPU, its unique id through the store
//   local_key_value     an in-process store, for ranks that are threads of
//                       one process and no pool (tests, benchmarks)
//
// Every call of a Communicator is collective: every rank of the group makes
// it, in the same order, with the same sizes. Failures (a peer gone, a
// timeout, sizes that do not fit) come back as Errors, never as exceptions.
// Every process makes the communicators of its own devices, each device's
// call on its own thread, at the same point of the program; making one again
// later for the same device and group is allowed (each is a numbered round).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dew/export.h"
#include "dew/result.h"

namespace dew::comm {

class DEW_API Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // send holds size() equal chunks; chunk i goes to rank i, and recv's chunk
  // i comes from rank i. Both spans have the same length in bytes.
  virtual Result<Done> all_to_all_bytes(std::span<const std::byte> send, std::span<std::byte> recv) = 0;
  // recv (size() x send's length) holds every rank's send, in rank order.
  virtual Result<Done> all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv) = 0;
  // data becomes rank `root`'s data on every rank. The default gathers every
  // rank's bytes and keeps the root's; backends use their own.
  virtual Result<Done> broadcast_bytes(std::span<std::byte> data, int root);
  virtual Result<Done> barrier() = 0;

  template <typename T>
  Result<Done> all_to_all(std::span<const T> send, std::span<T> recv) {
    if (auto bad = check_all_to_all(send.size(), recv.size(), "values")) return *bad;
    return all_to_all_bytes(std::as_bytes(send), std::as_writable_bytes(recv));
  }
  template <typename T>
  Result<Done> all_gather(std::span<const T> send, std::span<T> recv) {
    return all_gather_bytes(std::as_bytes(send), std::as_writable_bytes(recv));
  }
  template <typename T>
  Result<Done> broadcast(std::span<T> data, int root) {
    return broadcast_bytes(std::as_writable_bytes(data), root);
  }
  // send holds size() equal chunks; recv (one chunk) becomes the sum over the
  // ranks of their chunk rank(), added in rank order in T (float: fp32
  // accumulation). Sends what a ring reduce-scatter sends: (size-1)/size of
  // send. Virtual so a backend can use its own: NCCL's (dew/nccl.h) adds in
  // T too, but in NCCL's order, which is rank order only up to 2 ranks.
  virtual Result<Done> reduce_scatter(std::span<const float> send, std::span<float> recv);
  virtual Result<Done> reduce_scatter(std::span<const double> send, std::span<double> recv);
  // data becomes the sum over the ranks of their data, in place: each element
  // added in rank order in T, so every rank holds the same bits, equal to a
  // sum over the ranks' values in rank order on one process. A reduce-scatter
  // then an all-gather: 2(size-1)/size of data sent.
  virtual Result<Done> all_reduce(std::span<float> data);
  virtual Result<Done> all_reduce(std::span<double> data);

 protected:
  // The size rules every backend checks first: an Error (kInvalidArgument)
  // naming the sizes, or nullopt. `unit` is "bytes" or "values".
  std::optional<Error> check_all_to_all(std::size_t send, std::size_t recv, const char* unit) const;
  std::optional<Error> check_all_gather(std::size_t send, std::size_t recv, const char* unit) const;
  std::optional<Error> check_reduce_scatter(std::size_t send, std::size_t recv) const;
};

// A key-value store as two functions: put(key, value) publishes (or gives
// the store's Error), get(key) waits for the key (up to the timeout the
// store keeps) and returns its value, or an Error (kTimeout naming the key,
// or the pool's own).
struct DEW_API KeyValue {
  std::function<Result<Done>(const std::string&, const std::vector<char>&)> put;
  std::function<Result<std::vector<char>>(const std::string&)> get;
};

// A store in this process's memory, shared by every copy of the returned
// value, so ranks running as threads of one process can rendezvous. get
// waits up to `timeout` for a key.
DEW_API KeyValue local_key_value(std::chrono::milliseconds timeout = std::chrono::seconds(30));

struct DEW_API GlooOptions {
  int rank = 0;
  int size = 1;
  KeyValue store;
  // Keys are prefixed with this, so several groups can share one store.
  std::string prefix = "dew/comm";
  // The address this rank listens on and peers reach it at.
  std::string hostname = "127.0.0.1";
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
};

// Connects this rank to every other rank of the group over TCP (Gloo's full
// mesh); every rank calls it at the same time.
DEW_API Result<std::unique_ptr<Communicator>> make_gloo_communicator(const GlooOptions& options);

}  // namespace dew::comm
