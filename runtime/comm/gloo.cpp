// The Gloo communicator: one Gloo rank over TCP, its rendezvous through a
// KeyValue. The only file that includes Gloo; Gloo's exceptions stop here.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <exception>
#include <stdexcept>

#include "dew/comm.h"
#include "dew/text.h"

namespace dew::comm {
namespace {

// Gloo's Store over the two functions. Gloo's rendezvous expects
// exceptions; they stop in make_gloo_communicator.
class FunctionStore : public gloo::rendezvous::Store {
 public:
  explicit FunctionStore(KeyValue kv) : kv_(std::move(kv)) {}
  void set(const std::string& key, const std::vector<char>& data) override { kv_.put(key, data); }
  std::vector<char> get(const std::string& key) override {
    auto value = kv_.get(key);
    if (!value.ok()) throw std::runtime_error(value.error().message);
    return std::move(value.value());
  }
  void wait(const std::vector<std::string>& keys) override {
    for (const auto& key : keys) get(key);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override { wait(keys); }

 private:
  KeyValue kv_;
};


// Gloo says "Timed out" when a peer never answered within the timeout; any
// other failure is a peer that cannot be reached (or is gone).
Error gloo_error(const std::string& what, const std::exception& e) {
  const std::string text = what + one_line(e.what());
  const bool timed_out = text.find("Timed out") != std::string::npos || text.find("timed out") != std::string::npos;
  return timed_out ? timeout_error(text) : unavailable(text);
}

class GlooCommunicator : public Communicator {
 public:
  explicit GlooCommunicator(std::shared_ptr<gloo::rendezvous::Context> context) : context_(std::move(context)) {}
  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  Result<Done> all_to_all_bytes(std::span<const std::byte> send, std::span<std::byte> recv) override {
    if (auto bad = check_all_to_all(send.size(), recv.size(), "bytes")) return *bad;
    if (size() == 1) {
      std::copy(send.begin(), send.end(), recv.begin());
      return Done{};
    }
    return guarded("all_to_all", [&] {
      gloo::AlltoallOptions options(context_);
      options.setInput(const_cast<std::byte*>(send.data()), send.size());  // Gloo reads it only
      options.setOutput(recv.data(), recv.size());
      gloo::alltoall(options);
    });
  }

  Result<Done> all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv) override {
    if (auto bad = check_all_gather(send.size(), recv.size(), "bytes")) return *bad;
    if (size() == 1) {
      std::copy(send.begin(), send.end(), recv.begin());
      return Done{};
    }
    return guarded("all_gather", [&] {
      gloo::AllgatherOptions options(context_);
      options.setInput(const_cast<std::byte*>(send.data()), send.size());
      options.setOutput(recv.data(), recv.size());
      gloo::allgather(options);
    });
  }

  Result<Done> broadcast_bytes(std::span<std::byte> data, int root) override {
    if (root < 0 || root >= size()) return Communicator::broadcast_bytes(data, root);  // its error
    if (size() == 1 || data.empty()) return Done{};
    return guarded("broadcast", [&] {
      gloo::BroadcastOptions options(context_);
      options.setOutput(data.data(), data.size());
      options.setRoot(root);
      gloo::broadcast(options);
    });
  }

  // Two ranks: Gloo's ring all-reduce adds each element once, a + b on one
  // rank or b + a on the other, and IEEE addition commutes, so every rank
  // holds the rank-order sum's bits as the base class promises, with one
  // pipelined call instead of an all-to-all and an all-gather. More ranks
  // would add in ring order: they take the base class's way.
  Result<Done> all_reduce(std::span<float> data) override { return two_rank_all_reduce(data); }
  Result<Done> all_reduce(std::span<double> data) override { return two_rank_all_reduce(data); }
  // Two ranks: each sends the other its half in segments and adds each
  // segment as it arrives (a + b commutes: the rank-order sum's bits), where
  // the all-to-all would first wait for the whole half.
  Result<Done> reduce_scatter(std::span<const float> send, std::span<float> recv) override {
    return two_rank_reduce_scatter(send, recv);
  }
  Result<Done> reduce_scatter(std::span<const double> send, std::span<double> recv) override {
    return two_rank_reduce_scatter(send, recv);
  }

  Result<Done> barrier() override {
    if (size() == 1) return Done{};
    return guarded("barrier", [&] {
      gloo::BarrierOptions options(context_);
      gloo::barrier(options);
    });
  }

 private:
  template <typename T>
  Result<Done> two_rank_reduce_scatter(std::span<const T> send, std::span<T> recv) {
    if (size() != 2 || recv.empty()) return Communicator::reduce_scatter(send, recv);
    if (auto bad = check_reduce_scatter(send.size(), recv.size())) return *bad;
    const std::size_t chunk = recv.size(), bytes = chunk * sizeof(T);
    const int peer = 1 - rank();
    thread_local std::vector<T> incoming;
    incoming.resize(chunk);
    return guarded("reduce_scatter", [&] {
      constexpr std::size_t kSegment = 256 * 1024;  // bytes: a multiple of sizeof(T)
      const std::size_t segments = (bytes + kSegment - 1) / kSegment;
      auto out = context_->createUnboundBuffer(const_cast<T*>(send.data() + peer * chunk), bytes);  // read only
      auto in = context_->createUnboundBuffer(incoming.data(), bytes);
      const auto slot = static_cast<std::uint64_t>(context_->nextSlot());
      for (std::size_t s = 0; s < segments; ++s) in->recv(peer, slot, s * kSegment, std::min(kSegment, bytes - s * kSegment));
      for (std::size_t s = 0; s < segments; ++s) out->send(peer, slot, s * kSegment, std::min(kSegment, bytes - s * kSegment));
      const T* mine = send.data() + static_cast<std::size_t>(rank()) * chunk;
      for (std::size_t s = 0; s < segments; ++s) {
        if (!in->waitRecv(context_->getTimeout())) throw std::runtime_error("Timed out waiting for the peer's half");
        const std::size_t last = std::min(chunk, (s + 1) * kSegment / sizeof(T));
        for (std::size_t i = s * kSegment / sizeof(T); i < last; ++i) recv[i] = mine[i] + incoming[i];
      }
      for (std::size_t s = 0; s < segments; ++s) {
        if (!out->waitSend(context_->getTimeout())) throw std::runtime_error("Timed out sending the peer's half");
      }
    });
  }

  template <typename T>
  Result<Done> two_rank_all_reduce(std::span<T> data) {
    if (size() != 2 || data.empty()) return Communicator::all_reduce(data);
    return guarded("all_reduce", [&] {
      gloo::AllreduceOptions options(context_);
      options.setOutput(data.data(), data.size());
      options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      options.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
      gloo::allreduce(options);
    });
  }

  template <typename F>
  Result<Done> guarded(const char* what, F&& body) {
    try {
      body();
      return Done{};
    } catch (const std::exception& e) {
      return gloo_error(std::string(what) + " on rank " + std::to_string(rank()) + " of " + std::to_string(size()) +
                            " failed: ",
                        e);
    }
  }
  std::shared_ptr<gloo::rendezvous::Context> context_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_gloo_communicator(const GlooOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return invalid_argument("gloo: rank " + std::to_string(options.rank) + " of " + std::to_string(options.size) +
                            " is not allowed; allowed: 0 <= rank < size, size >= 1");
  }
  if (!options.store.put || !options.store.get) {
    return invalid_argument("gloo: the key-value store needs both put and get");
  }
  if (options.timeout.count() <= 0) {
    return invalid_argument("gloo: timeout " + std::to_string(options.timeout.count()) +
                            " ms is not allowed; allowed: more than 0 ms");
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(options.timeout);
    FunctionStore store(options.store);
    gloo::rendezvous::PrefixStore prefixed(options.prefix, store);
    context->connectFullMesh(prefixed, device);
    return std::unique_ptr<Communicator>(std::make_unique<GlooCommunicator>(std::move(context)));
  } catch (const std::exception& e) {
    return gloo_error("gloo: rank " + std::to_string(options.rank) + " of " + std::to_string(options.size) +
                          " could not connect: ",
                      e);
  }
}

}  // namespace dew::comm
