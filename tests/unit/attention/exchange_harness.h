// The exchanges' test harness: cases, the whole-sequence result, running
// an exchange on thread-ranks, and comparing. Shared by the in-process test
// (exchange_test.cpp) and the pool worker that runs ranks across processes
// (tests/unit/attention/pool_worker.cpp).
#pragma once

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dew/attention.h"
#include "dew/comm.h"
#include "dew/exchange.h"
#include "reference.h"

namespace dew::attention::testing {

using comm::GlooOptions;
using comm::KeyValue;
using comm::local_key_value;
using comm::make_gloo_communicator;

// One device's shards and results.
template <typename T>
struct Device {
  std::vector<std::int64_t> q_pos, k_pos;
  std::vector<T> q, k, v, d_out, out, lse, dq, dk, dv, ds;
  std::string error;
  int forward_collectives = 0, backward_collectives = 0;  // calls to the communicator
};

// Passes every call to a real communicator and counts them: the exchanges
// promise few collectives per call (on a CPU pool their number, more than
// their bytes, sets the time).
class CountingCommunicator final : public Communicator {
 public:
  explicit CountingCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Result<Done> all_to_all_bytes(std::span<const std::byte> send, std::span<std::byte> recv) override {
    ++calls;
    return inner_.all_to_all_bytes(send, recv);
  }
  Result<Done> all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv) override {
    ++calls;
    return inner_.all_gather_bytes(send, recv);
  }
  Result<Done> barrier() override {
    ++calls;
    return inner_.barrier();
  }
  Result<Done> reduce_scatter(std::span<const float> send, std::span<float> recv) override {
    ++calls;
    return inner_.reduce_scatter(send, recv);
  }
  Result<Done> reduce_scatter(std::span<const double> send, std::span<double> recv) override {
    ++calls;
    return inner_.reduce_scatter(send, recv);
  }
  int calls = 0;

 private:
  Communicator& inner_;
};

// Rows `positions` of a [B][heads][length][w] tensor.
template <typename T>
std::vector<T> rows(const std::vector<T>& whole, int batch, int heads, std::int64_t length, std::int64_t w,
                    const std::vector<std::int64_t>& positions) {
  return take_rows<T>(whole, batch, heads, length, w, positions);
}

// The whole-sequence kernel in T.
template <typename T>
struct Whole {
  std::vector<T> out, lse, dq, dk, dv, ds;
};

template <typename T>
Whole<T> whole_run(const Case& c) {
  Bound<T> bound(c);
  Whole<T> w;
  const Dims& d = c.dims;
  w.out.resize(bound.q.size());
  w.lse.resize(std::size_t(d.batch * d.heads * d.query_length));
  if (!forward<T>(bound.inputs, w.out.data(), w.lse.data()).ok())
    throw std::runtime_error("whole-sequence forward failed");
  w.dq.resize(bound.q.size());
  w.dk.resize(bound.k.size());
  w.dv.resize(bound.v.size());
  w.ds.resize(c.sinks ? std::size_t(d.heads) : 0);
  if (!backward<T>(bound.inputs, w.out.data(), w.lse.data(), bound.d_out.data(),
                   Gradients<T>{w.dq.data(), w.dk.data(), w.dv.data(), c.sinks ? w.ds.data() : nullptr})
           .ok()) {
    throw std::runtime_error("whole-sequence backward failed");
  }
  return w;
}

// The case of tensor shard t of `shards`: its own H / shards query heads
// and K / shards key/value heads (and their sinks), the sequences whole.
inline Case head_shard(const Case& whole, int t, int shards) {
  const Dims& d = whole.dims;
  const int heads = d.heads / shards, kv_heads = d.kv_heads / shards;
  auto slice = [&](const std::vector<double>& x, int all, int count, std::int64_t per_head) {
    return take_heads<double>(x, d.batch, all, t * count, count, per_head);
  };
  Case c = whole;
  c.dims.heads = heads;
  c.dims.kv_heads = kv_heads;
  c.q = slice(whole.q, d.heads, heads, d.query_length * d.head_dim);
  c.d_out = slice(whole.d_out, d.heads, heads, d.query_length * d.head_dim);
  c.k = slice(whole.k, d.kv_heads, kv_heads, d.key_length * d.head_dim);
  c.v = slice(whole.v, d.kv_heads, kv_heads, d.key_length * d.head_dim);
  if (!whole.s.empty()) c.s.assign(whole.s.begin() + t * heads, whole.s.begin() + (t + 1) * heads);
  if (whole.bias) c.b = slice(whole.b, d.heads, heads, d.query_length * d.key_length);
  return c;
}

// Makes rank r's communicator of the group; called on rank r's thread.
using Connect = std::function<Result<std::unique_ptr<Communicator>>(int rank)>;

// Gloo ranks rendezvousing through `store` under `prefix`.
inline Connect gloo_connect(int n, KeyValue store, const std::string& prefix) {
  return [n, store, prefix](int rank) {
    GlooOptions options;
    options.rank = rank;
    options.size = n;
    options.store = store;
    options.prefix = prefix;
    return make_gloo_communicator(options);
  };
}

// Runs the exchange on the thread-ranks `ranks` of a group of n (all n
// when empty), each connecting with `connect`; returns each device's results
// (entries of ranks run elsewhere stay empty). A pool of processes passes
// its own ranks and communicators made through the pool.
template <typename T>
std::vector<Device<T>> run_exchange(const Case& c, int n, Exchange exchange, Layout layout, std::vector<int> ranks,
                                    const Connect& connect) {
  if (ranks.empty())
    for (int r = 0; r < n; ++r) ranks.push_back(r);
  const Dims& d = c.dims;
  const auto q = as<T>(c.q), k = as<T>(c.k), v = as<T>(c.v), d_out = as<T>(c.d_out), s = as<T>(c.s);
  const auto bias_values = as<T>(c.b);
  std::vector<Device<T>> devices(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (const int rank : ranks) {
    threads.emplace_back([&, rank] {
      Device<T>& dev = devices[std::size_t(rank)];
      auto qp = shard_positions(layout, d.query_length, n, rank);
      auto kp = shard_positions(layout, d.key_length, n, rank);
      if (qp.ok()) dev.q_pos = qp.value();
      if (kp.ok()) dev.k_pos = kp.value();
      dev.q = rows(q, d.batch, d.heads, d.query_length, d.head_dim, dev.q_pos);
      dev.d_out = rows(d_out, d.batch, d.heads, d.query_length, d.head_dim, dev.q_pos);
      dev.k = rows(k, d.batch, d.kv_heads, d.key_length, d.head_dim, dev.k_pos);
      dev.v = rows(v, d.batch, d.kv_heads, d.key_length, d.head_dim, dev.k_pos);
      auto comm = connect(rank);
      if (!comm.ok() || !comm.value()->barrier().ok()) {  // every rank connected before any may leave
        dev.error = comm.ok() ? "barrier failed" : comm.error().message;
        return;
      }
      ShardCall<T> call;
      call.dims = d;
      call.layout = layout;
      call.query = dev.q.data();
      call.key = dev.k.data();
      call.value = dev.v.data();
      call.causal = c.causal;
      call.window = c.window;
      call.query_segments = c.query_segments;
      call.key_segments = c.key_segments;
      call.sinks = c.sinks ? s.data() : nullptr;
      if (c.bias) call.bias.data = bias_values.data();
      call.query_block = c.query_block;
      call.key_block = c.key_block;
      dev.out.assign(dev.q.size(), T(7));
      dev.lse.assign(dev.q_pos.size() * std::size_t(d.batch * d.heads), T(7));
      CountingCommunicator counted(*comm.value());
      auto f = exchange_forward<T>(exchange, counted, call, dev.out.data(), dev.lse.data());
      dev.forward_collectives = counted.calls;
      if (!f.ok()) {
        dev.error = f.error().message;
        return;
      }
      dev.dq.assign(dev.q.size(), T(7));
      dev.dk.assign(dev.k.size(), T(7));
      dev.dv.assign(dev.v.size(), T(7));
      dev.ds.assign(c.sinks ? std::size_t(d.heads) : 0, T(7));
      auto b = exchange_backward<T>(
          exchange, counted, call, dev.out.data(), dev.lse.data(), dev.d_out.data(),
          Gradients<T>{dev.dq.data(), dev.dk.data(), dev.dv.data(), c.sinks ? dev.ds.data() : nullptr});
      dev.backward_collectives = counted.calls - dev.forward_collectives;
      if (!b.ok()) dev.error = b.error().message;
    });
  }
  for (auto& t : threads) t.join();
  return devices;
}

// Every rank a thread here, over Gloo through an in-process store.
template <typename T>
std::vector<Device<T>> run_exchange(const Case& c, int n, Exchange exchange, Layout layout) {
  return run_exchange<T>(c, n, exchange, layout, {}, gloo_connect(n, local_key_value(), "dew/attention"));
}

template <typename T>
double error_of(const std::vector<T>& got, const std::vector<T>& want) {
  return relative_error(got, std::vector<double>(want.begin(), want.end()));
}

// What differs from the whole-sequence result on the devices `ranks` (all
// when empty), beyond `tolerance`: one line each; empty when all match.
template <typename T>
std::vector<std::string> mismatches(const Case& c, const Whole<T>& whole, const std::vector<Device<T>>& devices,
                                    double tolerance, std::vector<int> ranks = {}) {
  const Dims& d = c.dims;
  if (ranks.empty())
    for (int r = 0; r < static_cast<int>(devices.size()); ++r) ranks.push_back(r);
  std::vector<std::string> out;
  for (const int r : ranks) {
    const Device<T>& dev = devices[std::size_t(r)];
    const std::string who = "rank " + std::to_string(r) + " ";
    if (!dev.error.empty()) {
      out.push_back(who + "error: " + dev.error);
      continue;
    }
    const auto w = [&](const std::vector<T>& x, int heads, std::int64_t len, std::int64_t width,
                       const std::vector<std::int64_t>& pos) { return rows(x, d.batch, heads, len, width, pos); };
    const auto check = [&](const char* name, double error) {
      if (!(error <= tolerance)) out.push_back(who + name + " relative error " + std::to_string(error));
    };
    check("out", error_of(dev.out, w(whole.out, d.heads, d.query_length, d.head_dim, dev.q_pos)));
    check("lse", error_of(dev.lse, w(whole.lse, d.heads, d.query_length, 1, dev.q_pos)));
    check("dq", error_of(dev.dq, w(whole.dq, d.heads, d.query_length, d.head_dim, dev.q_pos)));
    check("dk", error_of(dev.dk, w(whole.dk, d.kv_heads, d.key_length, d.head_dim, dev.k_pos)));
    check("dv", error_of(dev.dv, w(whole.dv, d.kv_heads, d.key_length, d.head_dim, dev.k_pos)));
    if (c.sinks) check("d sinks", error_of(dev.ds, whole.ds));
  }
  return out;
}

inline Case make(int batch, int heads, int kv_heads, std::int64_t lq, std::int64_t lk, int head_dim, unsigned seed = 1,
                 bool sinks = false) {
  Case c;
  c.dims = Dims{batch, heads, kv_heads, lq, lk, head_dim};
  c.sinks = sinks;
  c.query_block = 8;
  c.key_block = 8;
  dew::attention::testing::fill(c, seed);
  return c;
}

}  // namespace dew::attention::testing
