// The NCCL communicator (dew/nccl.h). The only file that includes NCCL;
// every CUDA and NCCL status stops here as a one-line Error.
#include "dew/nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "dew/text.h"

namespace dew::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::string cuda_failed(const char* call, cudaError_t status) {
  return std::string(call) + " failed: " + one_line(cudaGetErrorString(status));
}

std::string nccl_failed(const char* call, ncclResult_t status, ncclComm_t comm = nullptr) {
  std::string text = std::string(call) + " failed: " + ncclGetErrorString(status);
  // NCCL's own detail, when it has one (it may name a peer or a transport).
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += " (" + std::string(last) + ")";
  return one_line(std::move(text));
}

// Waits until a non-blocking communicator is no longer ncclInProgress.
// Empty on success, else what went wrong; a timeout aborts nothing here.
std::string wait_ready(ncclComm_t comm, Clock::time_point deadline, const char* after, bool* timed_out) {
  *timed_out = false;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t status = ncclCommGetAsyncError(comm, &state);
    if (status != ncclSuccess) return nccl_failed("ncclCommGetAsyncError", status, comm);
    if (state == ncclSuccess) return {};
    if (state != ncclInProgress) return nccl_failed(after, state, comm);
    if (Clock::now() >= deadline) {
      *timed_out = true;
      return std::string(after) + " did not finish in time";
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, int rank, int size, int device,
                   std::chrono::milliseconds timeout)
      : comm_(comm), stream_(stream), rank_(rank), size_(size), device_(device), timeout_(timeout) {}

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (!broken_) {
      // Finalize flushes what is in flight; if that does not end in time (a
      // peer gone), abort instead of hanging in a destructor.
      bool timed_out = false;
      const ncclResult_t status = ncclCommFinalize(comm_);
      const bool finalized = (status == ncclSuccess || status == ncclInProgress) &&
                             wait_ready(comm_, Clock::now() + timeout_, "ncclCommFinalize", &timed_out).empty();
      if (finalized) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    if (buffer_ != nullptr) cudaFree(buffer_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Result<Done> all_to_all_bytes(std::span<const std::byte> send, std::span<std::byte> recv) override {
    if (auto bad = check_all_to_all(send.size(), recv.size(), "bytes")) return *bad;
    const std::size_t chunk = send.size() / static_cast<std::size_t>(size_);
    return run("all_to_all", send, recv, [&](const std::byte* in, std::byte* out) -> std::string {
      ncclResult_t status = ncclGroupStart();
      if (status != ncclSuccess) return nccl_failed("ncclGroupStart", status, comm_);
      for (int peer = 0; peer < size_; ++peer) {
        const std::size_t at = static_cast<std::size_t>(peer) * chunk;
        status = ncclSend(in + at, chunk, ncclChar, peer, comm_, stream_);
        if (status != ncclSuccess && status != ncclInProgress) {
          ncclGroupEnd();
          return nccl_failed("ncclSend", status, comm_);
        }
        status = ncclRecv(out + at, chunk, ncclChar, peer, comm_, stream_);
        if (status != ncclSuccess && status != ncclInProgress) {
          ncclGroupEnd();
          return nccl_failed("ncclRecv", status, comm_);
        }
      }
      status = ncclGroupEnd();
      if (status != ncclSuccess && status != ncclInProgress) return nccl_failed("ncclGroupEnd", status, comm_);
      return {};
    });
  }

  Result<Done> all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv) override {
    if (auto bad = check_all_gather(send.size(), recv.size(), "bytes")) return *bad;
    return run("all_gather", send, recv, [&](const std::byte* in, std::byte* out) -> std::string {
      const ncclResult_t status = ncclAllGather(in, out, send.size(), ncclChar, comm_, stream_);
      if (status != ncclSuccess && status != ncclInProgress) return nccl_failed("ncclAllGather", status, comm_);
      return {};
    });
  }

  Result<Done> reduce_scatter(std::span<const float> send, std::span<float> recv) override {
    return reduce_scatter_as<float>(send, recv, ncclFloat);
  }
  Result<Done> reduce_scatter(std::span<const double> send, std::span<double> recv) override {
    return reduce_scatter_as<double>(send, recv, ncclDouble);
  }

  Result<Done> broadcast_bytes(std::span<std::byte> data, int root) override {
    if (root < 0 || root >= size_) return Communicator::broadcast_bytes(data, root);  // its error
    return run("broadcast", data, data, [&](const std::byte* in, std::byte* out) -> std::string {
      const ncclResult_t status = ncclBroadcast(in, out, data.size(), ncclChar, root, comm_, stream_);
      if (status != ncclSuccess && status != ncclInProgress) return nccl_failed("ncclBroadcast", status, comm_);
      return {};
    });
  }

  Result<Done> barrier() override {
    const float one = 1.0f;
    float sum = 0.0f;
    auto done =
        run("barrier", std::as_bytes(std::span<const float>(&one, 1)),
            std::as_writable_bytes(std::span<float>(&sum, 1)), [&](const std::byte* in, std::byte* out) -> std::string {
              const ncclResult_t status = ncclAllReduce(in, out, 1, ncclFloat, ncclSum, comm_, stream_);
              if (status != ncclSuccess && status != ncclInProgress) return nccl_failed("ncclAllReduce", status, comm_);
              return {};
            });
    if (done.ok() && sum != static_cast<float>(size_)) {
      return failure("barrier",
                     "the one-element all-reduce gave " + std::to_string(sum) + ", expected " + std::to_string(size_));
    }
    return done;
  }

 private:
  template <typename T>
  Result<Done> reduce_scatter_as(std::span<const T> send, std::span<T> recv, ncclDataType_t type) {
    if (auto bad = check_reduce_scatter(send.size(), recv.size())) return *bad;
    return run("reduce_scatter", std::as_bytes(send), std::as_writable_bytes(recv),
               [&](const std::byte* in, std::byte* out) -> std::string {
                 const ncclResult_t status = ncclReduceScatter(in, out, recv.size(), type, ncclSum, comm_, stream_);
                 if (status != ncclSuccess && status != ncclInProgress)
                   return nccl_failed("ncclReduceScatter", status, comm_);
                 return {};
               });
  }

  Error failure(const char* what, const std::string& why, ErrorCode code = ErrorCode::kUnavailable) const {
    return Error{code, "nccl " + std::string(what) + " on rank " + std::to_string(rank_) + " of " +
                           std::to_string(size_) + " (GPU " + std::to_string(device_) + ") failed: " + one_line(why)};
  }

  // Room on the device for `in` bytes then `out` bytes; kept between calls.
  std::string reserve(std::size_t in, std::size_t out, std::byte** in_at, std::byte** out_at) {
    const std::size_t align = 256;
    const std::size_t out_offset = (in + align - 1) / align * align;
    const std::size_t need = std::max<std::size_t>(out_offset + out, 1);
    if (need > capacity_) {
      if (buffer_ != nullptr) {
        cudaFree(buffer_);
        buffer_ = nullptr;
        capacity_ = 0;
      }
      void* memory = nullptr;
      const cudaError_t status = cudaMalloc(&memory, need);
      if (status != cudaSuccess) return cuda_failed("cudaMalloc", status) + " (" + std::to_string(need) + " bytes)";
      buffer_ = static_cast<std::byte*>(memory);
      capacity_ = need;
    }
    *in_at = buffer_;
    *out_at = buffer_ + out_offset;
    return {};
  }

  // Marks this communicator unusable: NCCL state after a failed or
  // unfinished collective is unknown, so it is aborted.
  Error break_with(const char* what, const std::string& why, ErrorCode code = ErrorCode::kUnavailable) {
    if (!broken_) {
      broken_ = true;
      ncclCommAbort(comm_);
    }
    return failure(what, why, code);
  }

  // Copies send to the device, lets enqueue put the collective on stream_,
  // waits for it (up to timeout_), copies the result into recv.
  template <typename Enqueue>
  Result<Done> run(const char* what, std::span<const std::byte> send, std::span<std::byte> recv, Enqueue&& enqueue) {
    if (broken_) {
      return failure(what, "an earlier call failed and aborted this communicator; make a new one",
                     ErrorCode::kUnavailable);
    }
    if (send.empty() && recv.empty()) return Done{};  // every rank has the same sizes: nothing to exchange
    cudaError_t status = cudaSetDevice(device_);
    if (status != cudaSuccess) return failure(what, cuda_failed("cudaSetDevice", status));
    std::byte* in = nullptr;
    std::byte* out = nullptr;
    if (auto why = reserve(send.size(), recv.size(), &in, &out); !why.empty()) return failure(what, why);
    if (!send.empty()) {
      status = cudaMemcpyAsync(in, send.data(), send.size(), cudaMemcpyHostToDevice, stream_);
      if (status != cudaSuccess) return failure(what, cuda_failed("cudaMemcpyAsync (to the GPU)", status));
    }
    const auto deadline = Clock::now() + timeout_;
    if (auto why = enqueue(in, out); !why.empty()) return break_with(what, why);
    // Non-blocking NCCL: the enqueue may still be in progress.
    bool timed_out = false;
    if (auto why = wait_ready(comm_, deadline, "the collective's launch", &timed_out); !why.empty()) {
      if (timed_out)
        return break_with(what, why + " within " + std::to_string(timeout_.count()) + " ms", ErrorCode::kTimeout);
      return break_with(what, why);
    }
    // Poll rather than cudaStreamSynchronize, so a peer that never comes ends
    // in an error after timeout_ instead of a hang.
    for (;;) {
      status = cudaStreamQuery(stream_);
      if (status == cudaSuccess) break;
      if (status != cudaErrorNotReady) return break_with(what, cuda_failed("cudaStreamQuery", status));
      ncclResult_t state = ncclSuccess;
      const ncclResult_t got = ncclCommGetAsyncError(comm_, &state);
      if (got != ncclSuccess) return break_with(what, nccl_failed("ncclCommGetAsyncError", got, comm_));
      if (state != ncclSuccess && state != ncclInProgress) {
        return break_with(what, nccl_failed("the collective (ncclCommGetAsyncError's state)", state, comm_));
      }
      if (Clock::now() >= deadline) {
        return break_with(
            what,
            "not finished within " + std::to_string(timeout_.count()) + " ms (a peer that never joined the call?)",
            ErrorCode::kTimeout);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    // The collective is done: this copy cannot wait on a peer.
    status = cudaMemcpyAsync(recv.data(), out, recv.size(), cudaMemcpyDeviceToHost, stream_);
    if (status != cudaSuccess) return failure(what, cuda_failed("cudaMemcpyAsync (from the GPU)", status));
    status = cudaStreamSynchronize(stream_);
    if (status != cudaSuccess) return failure(what, cuda_failed("cudaStreamSynchronize", status));
    return Done{};
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_;
  int size_;
  int device_;
  std::chrono::milliseconds timeout_;
  std::byte* buffer_ = nullptr;
  std::size_t capacity_ = 0;
  bool broken_ = false;
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_nccl_communicator(const NcclOptions& options) {
  const std::string who = "nccl: rank " + std::to_string(options.rank) + " of " + std::to_string(options.size);
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return invalid_argument(who + " is not allowed; allowed: 0 <= rank < size, size >= 1");
  }
  if (options.device < 0) {
    return invalid_argument(who + ": device " + std::to_string(options.device) + " is not allowed; allowed: 0 or more");
  }
  if (!options.store.put || !options.store.get) {
    return invalid_argument("nccl: the key-value store needs both put and get");
  }
  if (options.timeout.count() <= 0) {
    return invalid_argument("nccl: timeout " + std::to_string(options.timeout.count()) +
                            " ms is not allowed; allowed: more than 0 ms");
  }
  const std::string key = options.prefix + "/nccl-unique-id";
  const std::string on = who + " (GPU " + std::to_string(options.device) + ")";

  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  // The others wait for rank 0's id first: no GPU is touched before it comes.
  if (options.rank != 0) {
    auto got = options.store.get(key);
    if (!got.ok()) return got.error().prefixed(on + " could not get the NCCL unique id from rank 0: ");
    const std::vector<char>& value = got.value();
    if (value.size() != sizeof id) {
      return invalid_argument(on + ": the NCCL unique id under '" + key + "' has " + std::to_string(value.size()) +
                              " bytes; allowed: " + std::to_string(sizeof id));
    }
    std::memcpy(&id, value.data(), sizeof id);
  }

  cudaError_t cuda = cudaSetDevice(options.device);
  if (cuda != cudaSuccess) return unavailable(on + ": " + cuda_failed("cudaSetDevice", cuda));

  if (options.rank == 0) {
    const ncclResult_t status = ncclGetUniqueId(&id);
    if (status != ncclSuccess) return unavailable(on + ": " + nccl_failed("ncclGetUniqueId", status));
    const char* bytes = reinterpret_cast<const char*>(&id);
    auto put = options.store.put(key, std::vector<char>(bytes, bytes + sizeof id));
    if (!put.ok()) return put.error().prefixed(on + ": ");
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so the timeout can end a setup a peer never joins
  ncclComm_t comm = nullptr;
  const auto deadline = Clock::now() + options.timeout;
  ncclResult_t status = ncclCommInitRankConfig(&comm, options.size, id, options.rank, &config);
  if (status != ncclSuccess && status != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    return unavailable(on + " could not join: " + nccl_failed("ncclCommInitRankConfig", status));
  }
  bool timed_out = false;
  if (auto why = wait_ready(comm, deadline, "ncclCommInitRankConfig", &timed_out); !why.empty()) {
    ncclCommAbort(comm);
    if (timed_out)
      return timeout_error(on + " could not join: " + why + " within " + std::to_string(options.timeout.count()) +
                           " ms");
    return unavailable(on + " could not join: " + why);
  }

  cudaStream_t stream = nullptr;
  cuda = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (cuda != cudaSuccess) {
    ncclCommAbort(comm);
    return unavailable(on + ": " + cuda_failed("cudaStreamCreateWithFlags", cuda));
  }
  return std::unique_ptr<Communicator>(
      std::make_unique<NcclCommunicator>(comm, stream, options.rank, options.size, options.device, options.timeout));
}

}  // namespace dew::comm
