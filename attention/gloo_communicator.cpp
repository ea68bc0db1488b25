// The Gloo communicator: one Gloo rank over TCP, its rendezvous through a
// KeyValue. The only file that includes Gloo; Gloo's exceptions stop here.
#include <gloo/allgather.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <stdexcept>

#include "communicator.h"

namespace dew::attention {
namespace {

// Gloo's Store over the two functions.
class FunctionStore : public gloo::rendezvous::Store {
 public:
  explicit FunctionStore(KeyValue kv) : kv_(std::move(kv)) {}
  void set(const std::string& key, const std::vector<char>& data) override { kv_.put(key, data); }
  std::vector<char> get(const std::string& key) override { return kv_.get(key); }
  void wait(const std::vector<std::string>& keys) override {
    for (const auto& key : keys) kv_.get(key);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override { wait(keys); }

 private:
  KeyValue kv_;
};

std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  return text;
}

class GlooCommunicator : public Communicator {
 public:
  explicit GlooCommunicator(std::shared_ptr<gloo::rendezvous::Context> context) : context_(std::move(context)) {}
  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  Result<Done> all_to_all_bytes(std::span<const std::byte> send, std::span<std::byte> recv) override {
    const std::size_t n = static_cast<std::size_t>(size());
    if (send.size() != recv.size() || send.size() % n != 0) {
      return Error{"all_to_all: " + std::to_string(send.size()) + " bytes to send and " +
                   std::to_string(recv.size()) + " to receive are not allowed; allowed: equal sizes dividing by " +
                   std::to_string(n) + " ranks"};
    }
    if (n == 1) {
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
    const std::size_t n = static_cast<std::size_t>(size());
    if (recv.size() != send.size() * n) {
      return Error{"all_gather: " + std::to_string(recv.size()) + " bytes to receive is not allowed; allowed: " +
                   std::to_string(n) + " ranks x " + std::to_string(send.size()) + " sent"};
    }
    if (n == 1) {
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

  Result<Done> barrier() override {
    if (size() == 1) return Done{};
    return guarded("barrier", [&] {
      gloo::BarrierOptions options(context_);
      gloo::barrier(options);
    });
  }

 private:
  template <typename F>
  Result<Done> guarded(const char* what, F&& body) {
    try {
      body();
      return Done{};
    } catch (const std::exception& e) {
      return Error{std::string(what) + " on rank " + std::to_string(rank()) + " of " + std::to_string(size()) +
                   " failed: " + one_line(e.what())};
    }
  }
  std::shared_ptr<gloo::rendezvous::Context> context_;
};

}  // namespace

KeyValue local_key_value(std::chrono::milliseconds timeout) {
  struct Shared {
    std::mutex mutex;
    std::condition_variable changed;
    std::map<std::string, std::vector<char>> values;
  };
  auto shared = std::make_shared<Shared>();
  KeyValue kv;
  kv.put = [shared](const std::string& key, const std::vector<char>& value) {
    {
      std::lock_guard lock(shared->mutex);
      shared->values[key] = value;
    }
    shared->changed.notify_all();
  };
  kv.get = [shared, timeout](const std::string& key) {
    std::unique_lock lock(shared->mutex);
    if (!shared->changed.wait_for(lock, timeout, [&] { return shared->values.count(key) != 0; })) {
      throw std::runtime_error("key-value store: no value for '" + key + "' after " +
                               std::to_string(timeout.count()) + " ms");
    }
    return shared->values[key];
  };
  return kv;
}

Result<std::unique_ptr<Communicator>> make_gloo_communicator(const GlooOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return Error{"gloo: rank " + std::to_string(options.rank) + " of " + std::to_string(options.size) +
                 " is not allowed; allowed: 0 <= rank < size, size >= 1"};
  }
  if (!options.store.put || !options.store.get) {
    return Error{"gloo: the key-value store needs both put and get"};
  }
  if (options.timeout.count() <= 0) {
    return Error{"gloo: timeout " + std::to_string(options.timeout.count()) +
                 " ms is not allowed; allowed: more than 0 ms"};
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
    return Error{"gloo: rank " + std::to_string(options.rank) + " of " + std::to_string(options.size) +
                 " could not connect: " + one_line(e.what())};
  }
}

}  // namespace dew::attention
