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
#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>

#include "dew/comm.h"
#include "dew/text.h"
#include "sigpipe.h"

namespace dew::comm {
namespace {

// A store's Error, carried through Gloo's rendezvous (which expects
// exceptions) to make_gloo_communicator with its code.
struct StoreFailure : std::runtime_error {
  explicit StoreFailure(Error e) : std::runtime_error(e.message), error(std::move(e)) {}
  Error error;
};

// Gloo's Store over the two functions. Gloo's rendezvous expects
// exceptions; they stop in make_gloo_communicator.
class FunctionStore : public gloo::rendezvous::Store {
 public:
  explicit FunctionStore(KeyValue kv) : kv_(std::move(kv)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    auto put = kv_.put(key, data);
    if (!put.ok()) throw StoreFailure(put.error());
  }
  std::vector<char> get(const std::string& key) override {
    auto value = kv_.get(key);
    if (!value.ok()) throw StoreFailure(value.error());
    return std::move(value.value());
  }
  void wait(const std::vector<std::string>& keys) override {
    for (const auto& key : keys) get(key);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override { wait(keys); }

 private:
  KeyValue kv_;
};

using Clock = std::chrono::steady_clock;

// The Error of a failed Gloo call that began at `began`: a store's keeps its
// code; Gloo's own exceptions have no kind of their own (a timeout is an
// IoException like a reset), so one thrown once the whole timeout had
// passed is a peer that never answered (kTimeout), any earlier one a peer
// that cannot be reached or is gone (kUnavailable).
Error gloo_error(const std::string& what, const std::exception& e, Clock::time_point began,
                 std::chrono::milliseconds timeout) {
  if (const auto* store = dynamic_cast<const StoreFailure*>(&e)) return store->error.prefixed(what);
  const std::string text = what + one_line(e.what());
  return Clock::now() - began >= timeout ? timeout_error(text) : unavailable(text);
}

// `count` values of T cut into segments of `segment` values (the last one
// may be shorter): element indices for the sums, bytes for Gloo.
template <typename T>
struct Segments {
  std::size_t count, segment, number;
  Segments(std::size_t count_, std::size_t segment_)
      : count(count_), segment(segment_), number((count_ + segment_ - 1) / segment_) {}
  std::size_t first(std::size_t s) const { return std::min(count, s * segment); }
  std::size_t size(std::size_t s) const { return std::min(count, (s + 1) * segment) - first(s); }
  std::size_t offset_bytes(std::size_t s) const { return first(s) * sizeof(T); }
  std::size_t bytes(std::size_t s) const { return size(s) * sizeof(T); }
};

// Gloo's waits return false when aborted (a timeout throws on its own).
void must_complete(bool completed, const char* what) {
  if (!completed) throw std::runtime_error(std::string(what) + " was aborted");
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
  // would add in ring order: they take chain_all_reduce.
  Result<Done> all_reduce(std::span<float> data) override { return pipelined_all_reduce(data); }
  Result<Done> all_reduce(std::span<double> data) override { return pipelined_all_reduce(data); }
  Result<Done> reduce_scatter(std::span<const float> send, std::span<float> recv) override {
    return segmented_reduce_scatter(send, recv);
  }
  Result<Done> reduce_scatter(std::span<const double> send, std::span<double> recv) override {
    return segmented_reduce_scatter(send, recv);
  }

  Result<Done> barrier() override {
    if (size() == 1) return Done{};
    return guarded("barrier", [&] {
      gloo::BarrierOptions options(context_);
      gloo::barrier(options);
    });
  }

 private:
  // Each rank sends every peer that peer's chunk in segments, one buffer
  // per peer, and adds the chunks it receives in rank order, segment by
  // segment, each as soon as that rank's copy is in: the rank-order sum's
  // bits (at two ranks a + b on one and b + a on the other, which commute),
  // with the adding of early ranks' copies while later ones still arrive,
  // where Gloo's all-to-all first waits for all of them. Segments of equal
  // size, at least 256 KiB at two ranks and 1 MiB past that (a short last
  // segment costs a message and overlaps nothing; bench/collectives measured
  // 256 KiB to 1 MiB, within its noise of each other).
  template <typename T>
  Result<Done> segmented_reduce_scatter(std::span<const T> send, std::span<T> recv) {
    if (auto bad = check_reduce_scatter(send.size(), recv.size())) return *bad;
    const int n = size(), r = rank();
    // In place (recv inside send) the sum would read what it has written:
    // the all-to-all way copies first.
    const bool overlap = recv.data() < send.data() + send.size() && send.data() < recv.data() + recv.size();
    if (n == 1 || recv.empty() || overlap) return Communicator::reduce_scatter(send, recv);
    const std::size_t chunk = recv.size();
    const std::size_t smallest = (n == 2 ? 256 * 1024 : 1024 * 1024) / sizeof(T);  // equal segments, none smaller
    const std::size_t equal = std::max<std::size_t>(1, chunk / smallest);
    const Segments<T> segments(chunk, (chunk + equal - 1) / equal);
    thread_local std::vector<T> incoming;  // peer q's copy of this rank's chunk at q * chunk
    incoming.resize(chunk * static_cast<std::size_t>(n));
    return guarded("reduce_scatter", [&] {
      const auto timeout = context_->getTimeout();
      const auto slot = static_cast<std::uint64_t>(context_->nextSlot());
      std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> from(static_cast<std::size_t>(n));
      for (int q = 0; q < n; ++q) {
        if (q == r) continue;
        from[std::size_t(q)] =
            context_->createUnboundBuffer(incoming.data() + std::size_t(q) * chunk, chunk * sizeof(T));
        for (std::size_t s = 0; s < segments.number; ++s) {
          from[std::size_t(q)]->recv(q, slot, segments.offset_bytes(s), segments.bytes(s));
        }
      }
      auto out = context_->createUnboundBuffer(const_cast<T*>(send.data()), send.size_bytes());  // read only
      for (std::size_t s = 0; s < segments.number; ++s) {
        for (int k = 1; k < n; ++k) {  // each peer's first segment first, from the next rank on
          const int to = (r + k) % n;
          out->send(to, slot, std::size_t(to) * chunk * sizeof(T) + segments.offset_bytes(s), segments.bytes(s));
        }
      }
      for (std::size_t s = 0; s < segments.number; ++s) {
        T* sum = recv.data() + segments.first(s);
        const std::size_t count = segments.size(s);
        const auto term = [&](int q) {  // rank q's copy of this segment, once it is in
          if (q != r) must_complete(from[std::size_t(q)]->waitRecv(timeout), "reduce_scatter");
          return (q == r ? send.data() : incoming.data()) + std::size_t(q) * chunk + segments.first(s);
        };
        const T* first = term(0);
        const T* second = term(1);  // the first two in one pass: no copy of the first
        for (std::size_t i = 0; i < count; ++i) sum[i] = first[i] + second[i];
        for (int q = 2; q < n; ++q) {
          const T* next = term(q);
          for (std::size_t i = 0; i < count; ++i) sum[i] += next[i];
        }
      }
      for (std::size_t k = 0; k < segments.number * std::size_t(n - 1); ++k) {
        must_complete(out->waitSend(timeout), "reduce_scatter");
      }
    });
  }

  template <typename T>
  Result<Done> pipelined_all_reduce(std::span<T> data) {
    if (size() == 1 || data.empty()) return Done{};
    if (size() > 2) return guarded("all_reduce", [&] { chain_all_reduce(data); });
    return guarded("all_reduce", [&] {
      gloo::AllreduceOptions options(context_);
      options.setOutput(data.data(), data.size());
      options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      options.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
      gloo::allreduce(options);
    });
  }

  // Three or more ranks: the rank-order sum ((x0 + x1) + x2) + ... is a
  // chain, so it runs as one, pipelined in segments along the ring 0 -> 1 ->
  // ... -> n-1 -> 0: rank r adds its values to the partial sum from r - 1
  // and passes it on; rank n-1 finishes each segment and sends it round to
  // 0, and 0 .. n-3 forward it. Every rank sends and receives from one
  // neighbour at a time, like Gloo's ring (on a shared machine the bytes
  // copied are the same as the ring's and an all-to-all's, with fewer
  // streams at once; bench/collectives measured it against both), and every
  // rank holds the very bits rank n-1 computed.
  //
  // The result is received into `data` while `data` is still being sent
  // from: safe on TCP, because the result of a segment cannot exist before
  // this rank's copy of that segment has been written to its socket.
  template <typename T>
  void chain_all_reduce(std::span<T> data) {
    const Segments<T> segments(data.size(), 1024 * 1024 / sizeof(T));  // measured: smaller ones cost per message
    const int n = size(), r = rank(), left = (r + n - 1) % n, right = (r + 1) % n;
    const auto timeout = context_->getTimeout();
    thread_local std::vector<T> partial;  // the partial sums from the left
    partial.resize(r > 0 ? data.size() : 0);
    auto buffer = context_->createUnboundBuffer(data.data(), data.size_bytes());
    auto from_left = context_->createUnboundBuffer(partial.data(), partial.size() * sizeof(T));
    const auto sums = static_cast<std::uint64_t>(context_->nextSlot(2)), results = sums + 1;
    std::size_t sent = 0, forwarded = 0;
    for (std::size_t s = 0; s < segments.number; ++s) {
      if (r > 0) from_left->recv(left, sums, segments.offset_bytes(s), segments.bytes(s));
      if (r != n - 1) buffer->recv(left, results, segments.offset_bytes(s), segments.bytes(s));
    }
    const bool forwards = r != n - 1 && r != n - 2;  // n-1 has the result already
    const auto forward_next = [&] {
      must_complete(buffer->waitRecv(timeout), "all_reduce");
      if (forwards) {
        buffer->send(right, results, segments.offset_bytes(forwarded), segments.bytes(forwarded));
        ++sent;
      }
      ++forwarded;
    };
    for (std::size_t s = 0; s < segments.number; ++s) {
      if (r > 0) {
        must_complete(from_left->waitRecv(timeout), "all_reduce");
        T* mine = data.data() + segments.first(s);
        const T* before = partial.data() + segments.first(s);
        for (std::size_t i = 0, end = segments.size(s); i < end; ++i) mine[i] = before[i] + mine[i];
      }
      buffer->send(right, r == n - 1 ? results : sums, segments.offset_bytes(s), segments.bytes(s));
      ++sent;
      // A segment's result comes back about n segments after this rank
      // sent it: forward it then, not after the last segment.
      if (r != n - 1 && forwarded + static_cast<std::size_t>(n) <= s) forward_next();
    }
    if (r != n - 1) {
      while (forwarded < segments.number) forward_next();
    }
    for (std::size_t k = 0; k < sent; ++k) must_complete(buffer->waitSend(timeout), "all_reduce");
  }

  template <typename F>
  Result<Done> guarded(const char* what, F&& body) {
    const NoSigpipe no_sigpipe;
    const auto began = Clock::now();
    try {
      body();
      return Done{};
    } catch (const std::exception& e) {
      return gloo_error(
          std::string(what) + " on rank " + std::to_string(rank()) + " of " + std::to_string(size()) + " failed: ", e,
          began, context_->getTimeout());
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
  // Gloo's device thread inherits this thread's blocked SIGPIPE.
  const NoSigpipe no_sigpipe;
  const auto began = Clock::now();
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
    return gloo_error(
        "gloo: rank " + std::to_string(options.rank) + " of " + std::to_string(options.size) + " could not connect: ",
        e, began, options.timeout);
  }
}

}  // namespace dew::comm
