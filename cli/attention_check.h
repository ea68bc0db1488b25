// `dew attention-check`'s parts (private to cli/): the options, the check's
// setup over the pool's mesh, one device's measurement, and the report
// process 0 prints.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "dew/attention.h"
#include "dew/exchange.h"
#include "dew/mesh.h"
#include "dew/pool.h"

namespace dew::cli {

using attention::Exchange;

struct CheckOptions {
  int batch = 1;
  int heads = 16;
  int kv_heads = 8;
  std::int64_t length = 2048;
  int head_dim = 64;
  std::string mask = "causal";
  int devices_per_process = 1;
  std::string mesh;  // empty: sequence = every device
  std::string exchanges = "both";
  int runs = 3;
  double tolerance = 1e-4;
  unsigned seed = 1;
};

// The whole inputs, the same on every process (one seed).
struct Whole {
  std::vector<float> q, k, v, d_out;
  std::vector<std::int32_t> segments;  // batch x length, --mask documents only
};

// One tensor shard's whole-sequence result in fp64: the reference.
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// What the check runs, decided once on every process alike.
struct CheckSetup {
  attention::MaskSpec mask;
  mesh::MeshSpec spec;
  mesh::Mesh layout;
  int processes = 1;
  int sequence = 1;  // N, the sequence axis
  int shards = 1;    // the tensor axis
  attention::Plan plan;
  std::vector<Exchange> runnable;
  std::vector<std::string> skipped;  // "gather cannot run: ..."
  attention::Layout shard_layout = attention::Layout::kContiguous;
  Whole whole;
  std::map<int, Reference> references;  // per tensor shard this process's devices hold
};

// What one device measured for one exchange.
struct Measured {
  double error = 0;             // the largest relative error over out, lse, dq, dk, dv
  std::vector<double> seconds;  // forward + backward, per counted run
  std::string failure;          // non-empty: the exchange failed on this device
};

// The mesh, the rule's plan, the exchanges to run, the inputs and the
// references, for a pool of `processes`.
Result<CheckSetup> prepare_check(const CheckOptions& o, int processes, int rank);

// kInvalidArgument naming the estimate when the check's inputs, outputs and
// fp64 reference would not fit in `memory` bytes (--length 1048576 ended in
// a bare std::bad_alloc). Estimated at 256 bytes per batch x head x
// position x head dim on each process: one process's peak resident size
// measured 180-230 (lengths 2048 to 16384).
Result<Done> check_fits(const CheckOptions& o, long double memory);

// One device's calls of every runnable exchange: the first checked against
// the reference, then o.runs timed ones (exchanges interleaved). Writes
// `measured[e]`.
void measure_device(const CheckOptions& o, const CheckSetup& setup, runtime::Pool& pool, int device,
                    std::map<Exchange, Measured*> measured);

// One process's measurements as text for pool.all_gather, and every
// process's folded into the table process 0 prints. Returns whether every
// exchange ran within the tolerance.
std::string serialize(const std::map<Exchange, std::vector<Measured>>& measured);
bool print_report(const CheckOptions& o, const CheckSetup& setup, const std::vector<std::string>& reports, bool print);

}  // namespace dew::cli
