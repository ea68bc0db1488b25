// The NCCL communicator (namespace dew::comm): one NCCL rank on one GPU,
// one communicator per axis group. Built only where /usr/local/cuda has the
// CUDA runtime and NCCL (the build summary says whether);
// this header includes no CUDA header, so its users need none.
//
// Rendezvous: rank 0 makes the ncclUniqueId (ncclGetUniqueId) and puts it in
// the KeyValue store under <prefix>/nccl-unique-id; every other rank gets it
// from there; then every rank calls ncclCommInitRank (as its non-blocking
// ncclCommInitRankConfig, so `timeout` bounds it). Give each group its own
// prefix: two groups sharing one would share one id.
//
// Memory: the Communicator interface takes host spans, so every call copies
// host -> device, runs the collective on this communicator's stream, and
// copies device -> host before it returns. That is the path the CPU-side
// exchange code (attention/dew/exchange.h) calls; the GPU exchanges will pass device
// pointers instead and skip both copies. Device buffers are kept and grown,
// so repeated calls of one size allocate once.
//
//   all_to_all      ncclGroupStart, one ncclSend and one ncclRecv per peer
//                   (itself included), ncclGroupEnd
//   all_gather      ncclAllGather
//   reduce_scatter  ncclReduceScatter, ncclFloat or ncclDouble, ncclSum: the
//                   sum is in T, in NCCL's order (rank order up to 2 ranks)
//   broadcast       ncclBroadcast
//   all_reduce      the reduce_scatter above, then the all_gather: every
//                   rank ends with the same bits
//   barrier         a one-element ncclAllReduce
//
// Every CUDA or NCCL failure comes back as one line naming the call and
// cudaGetErrorString / ncclGetErrorString. A collective that has not finished
// within `timeout` (a peer gone) aborts the NCCL communicator
// (ncclCommAbort) and returns an error; every later call on it then fails.
// One thread at a time may use a communicator; ranks of one process must
// use different GPUs (NCCL allows one rank per GPU in a communicator).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "dew/comm.h"
#include "dew/result.h"

namespace dew::comm {

struct NcclOptions {
  int rank = 0;
  int size = 1;
  // The CUDA device this rank uses (cudaSetDevice); each rank its own.
  int device = 0;
  KeyValue store;
  // Keys are prefixed with this, so several groups can share one store.
  std::string prefix = "dew/comm";
  // Bounds the communicator's setup and each collective.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
};

// Joins this rank to the group's NCCL communicator; every rank of the group
// calls it at the same time (from its own thread or process).
Result<std::unique_ptr<Communicator>> make_nccl_communicator(const NcclOptions& options);

}  // namespace dew::comm
