// Sequence-parallel attention across the processes of a real pool: every
// process joins (libdew), runs D devices as threads, each a Gloo rank of its
// mesh group made from the pool and a mesh (make_axis_communicator), and
// checks both exchanges, forward and backward, against whole-sequence
// attention it computes itself (fp32 within 1e-5, fp64 within 1e-12
// relative): every device in one sequence group, then (when 4 divides the
// device count) heads split over tensor 2 x sequence N/2.
//
//   attention_pool_worker D      prints "CASE <name> <exchange> <type>: ok"
//                                or ": MISMATCH ...", then "ALL OK" (exit 0)
//   attention_pool_worker D stall P
//                                the same, but process P prints "STALLING"
//                                before its third exchange and never starts
//                                it, so its peers wait inside a collective
//                                (for tests that then kill P)
#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <thread>

#include "dew/axes.h"
#include "dew/mesh.h"
#include "dew/pool.h"
#include "exchange_harness.h"

namespace {

using namespace dew::attention;
using namespace dew::comm;
using namespace dew::axes;
using namespace dew::attention::testing;

struct Named {
  std::string name;
  Case c;
  Layout layout;
};

// Cases whose shapes every group size the tests use (2, 4, 8) can run.
std::vector<Named> cases(int n) {
  std::vector<Named> out;
  const std::int64_t length = 4 * n;  // divides by 2N for the chunk pairs
  out.push_back({"multi-head", make(2, 8, 8, length, length, 8, 1), Layout::kContiguous});
  out.push_back({"gqa-k-equals-n", make(1, 8, n, length, length, 8, 2, true), Layout::kContiguous});
  out.push_back({"gqa-k-below-n", make(1, 8, n / 2, length, length, 8, 3), Layout::kContiguous});
  out.push_back({"gqa-k-above-n", make(1, 16, 2 * n, length, length, 8, 4), Layout::kContiguous});
  out.push_back({"mqa", make(1, 8, 1, length, length, 8, 5, true), Layout::kContiguous});
  Named causal{"causal-chunk-pairs", make(2, 8, 2, length, length, 8, 6, true), Layout::kChunkPairs};
  causal.c.causal = true;
  out.push_back(causal);
  Named window{"window-with-sinks", make(1, 8, 4, length, length, 8, 7, true), Layout::kChunkPairs};
  window.c.window = Window{3, 1};
  out.push_back(window);
  Named docs{"documents", make(2, 8, 2, length, length, 8, 8), Layout::kChunkPairs};
  docs.c.query_segments = documents(2, length, {3, 5, 2, 7});
  docs.c.key_segments = docs.c.query_segments;
  docs.c.causal = true;
  out.push_back(docs);
  Named bias{"bias", make(1, 8, 4, length, length, 8, 9), Layout::kContiguous};
  bias.c.bias = true;
  fill(bias.c, 9);
  out.push_back(bias);
  return out;
}

// Runs `exchange` on this process's devices of the sequence group that
// `member` (any local device's membership) names, each device's Gloo rank made
// from the pool and the mesh, and reports against the case's whole result.
template <typename T>
std::vector<std::string> run_group(dew::runtime::Pool& pool, const dew::mesh::Mesh& mesh, const Case& c,
                                   Exchange exchange, Layout layout, const AxisMember& member,
                                   const std::vector<int>& local_devices, double tolerance) {
  std::vector<int> ranks;  // this process's devices' ranks in the group
  for (int r = 0; r < member.size; ++r)
    if (std::count(local_devices.begin(), local_devices.end(), member.devices[std::size_t(r)]) > 0) ranks.push_back(r);
  const Connect connect = [&](int rank) {
    return make_axis_communicator(pool, mesh, dew::mesh::Axis::kSequence, member.devices[std::size_t(rank)]);
  };
  // The exchange first, then the reference, in that order on every
  // compiler (argument order is not specified): the stall test kills a peer
  // while the others wait inside the exchange.
  auto got = run_exchange<T>(c, member.size, exchange, layout, ranks, connect);
  return mismatches<T>(c, whole_run<T>(c), std::move(got), tolerance, ranks);
}

dew::mesh::Mesh mesh_for(const std::string& spec, int processes, int per_process) {
  auto built =
      dew::mesh::build_mesh(dew::mesh::parse_mesh_spec(spec).value(), dew::mesh::cpu_pool(processes, per_process));
  if (!built.ok()) throw std::runtime_error(built.error().message);
  return built.value();
}

}  // namespace

int main(int argc, char** argv) {
  const int per_process = argc > 1 ? std::stoi(argv[1]) : 1;
  const int stalling_process = argc > 3 && std::string(argv[2]) == "stall" ? std::stoi(argv[3]) : -1;
  auto pool = dew::runtime::join();
  const int n = pool.size() * per_process;
  std::vector<int> mine;  // this process's device ids: cpu_pool numbers them process by process
  for (int d = 0; d < per_process; ++d) mine.push_back(dew::mesh::cpu_device_id(pool.rank(), per_process, d));
  bool all_ok = true;
  auto report = [&](const std::string& what, const std::vector<std::string>& bad) {
    std::string line = "CASE " + what + ": ";
    if (bad.empty()) {
      line += "ok";
    } else {
      all_ok = false;
      line += "MISMATCH";
      for (const auto& b : bad) line += "; " + b;
    }
    std::cout << line << std::endl;
  };

  // Every device in one sequence group of n.
  const auto sequence_mesh = mesh_for("sequence=" + std::to_string(n), pool.size(), per_process);
  const AxisMember group = axis_member(sequence_mesh, dew::mesh::Axis::kSequence, mine[0]).value();
  int round = 0;
  for (const Named& named : cases(n)) {
    for (const Exchange exchange : {Exchange::kAllToAll, Exchange::kGather}) {
      if (pool.rank() == stalling_process && round == 2) {
        std::cout << "STALLING" << std::endl;
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
      }
      ++round;
      const std::string what = named.name + " " + std::string(exchange_name(exchange));
      report(what + " fp32", run_group<float>(pool, sequence_mesh, named.c, exchange, named.layout, group, mine, 1e-5));
      report(what + " fp64",
             run_group<double>(pool, sequence_mesh, named.c, exchange, named.layout, group, mine, 1e-12));
    }
  }

  // Heads split over tensor 2 x sequence n/2: tensor shard t (a device's
  // rank in its tensor group) runs its heads in sequence group t.
  if (n % 4 == 0) {
    const auto mesh = mesh_for("tensor=2,sequence=" + std::to_string(n / 2), pool.size(), per_process);
    Case whole = make(2, 8, 4, 2 * n, 2 * n, 8, 14, true);
    whole.causal = true;
    std::vector<int> shards;  // the tensor shards this process's devices hold
    for (const int device : mine) {
      const int t = axis_member(mesh, dew::mesh::Axis::kTensor, device).value().rank;
      if (std::count(shards.begin(), shards.end(), t) == 0) shards.push_back(t);
    }
    for (const Exchange exchange : {Exchange::kAllToAll, Exchange::kGather}) {
      std::vector<std::vector<std::string>> bad(shards.size());
      std::vector<std::thread> threads;
      for (std::size_t i = 0; i < shards.size(); ++i) {
        threads.emplace_back([&, i] {
          const int t = shards[i];
          int first = -1;  // a local device of shard t
          for (const int device : mine)
            if (first < 0 && axis_member(mesh, dew::mesh::Axis::kTensor, device).value().rank == t) first = device;
          const AxisMember member = axis_member(mesh, dew::mesh::Axis::kSequence, first).value();
          bad[i] = run_group<double>(pool, mesh, head_shard(whole, t, 2), exchange, Layout::kChunkPairs, member, mine,
                                     1e-12);
        });
      }
      for (auto& thread : threads) thread.join();
      for (std::size_t i = 0; i < shards.size(); ++i)
        report("tensor-2-x-sequence-" + std::to_string(n / 2) + " shard " + std::to_string(shards[i]) + " " +
                   std::string(exchange_name(exchange)) + " fp64",
               bad[i]);
    }
  }

  pool.agree("attention-done");
  if (all_ok)
    std::cout << "ALL OK: " << n << " devices (" << pool.size() << " processes x " << per_process << ")" << std::endl;
  return all_ok ? 0 : 1;
}
