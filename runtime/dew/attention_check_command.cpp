// `dew attention-check`: runs sequence-parallel attention across the pool
// this process joins (srun --dew-pool, dew launch, PMIx, or alone), checks
// both exchanges against whole-sequence attention in fp64, and times them,
// so a user learns on their own allocation that the exchanges work and which
// one is faster there. Every process runs it; process 0 prints the table.
//
// Each process owns --devices-per-process CPU devices, one thread each. The
// mesh (--mesh, default every device on the sequence axis) is laid over
// them; a device's sequence group talks over Gloo through
// make_axis_communicator, and a tensor axis splits the heads.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attention.h"
#include "axis_communicator.h"
#include "commands.h"
#include "exchange.h"
#include "mesh.h"
#include "pool.h"

namespace dew::cli {
namespace {

using attention::Exchange;
using Clock = std::chrono::steady_clock;

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

Whole make_whole(const CheckOptions& o, bool documents) {
  std::mt19937 gen(o.seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](std::int64_t heads) {
    std::vector<float> x(static_cast<std::size_t>(o.batch * heads * o.length * o.head_dim));
    for (float& e : x) e = u(gen);
    return x;
  };
  Whole w;
  w.q = fill(o.heads);
  w.k = fill(o.kv_heads);
  w.v = fill(o.kv_heads);
  w.d_out = fill(o.heads);
  if (documents) {
    // Three documents per sequence, of about a third each: their boundaries
    // fall inside shards and chunks rather than on their edges.
    for (int b = 0; b < o.batch; ++b)
      for (std::int64_t p = 0; p < o.length; ++p) w.segments.push_back(std::int32_t(std::min<std::int64_t>(2, (3 * p + b) / o.length)));
  }
  return w;
}

// One tensor shard's whole-sequence result in fp64: the reference.
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// The mask of a call over whole or sharded sequences.
attention::Mask mask_of(const attention::MaskSpec& spec, const Whole& whole) {
  attention::Mask mask;
  mask.causal = spec.kind == attention::MaskKind::kCausal || spec.kind == attention::MaskKind::kDocuments;
  if (spec.kind == attention::MaskKind::kWindow) mask.window = spec.window;
  mask.query_segments = whole.segments;
  mask.key_segments = whole.segments;
  return mask;
}

Result<Reference> reference(const CheckOptions& o, const attention::MaskSpec& spec, const Whole& whole, int shard,
                            int shards) {
  const int h = o.heads / shards, k = o.kv_heads / shards;
  auto heads = [&](const std::vector<float>& x, int all, int count) {
    const auto part = attention::take_heads<float>(x, o.batch, all, shard * count, count, o.length * o.head_dim);
    return std::vector<double>(part.begin(), part.end());
  };
  const auto q = heads(whole.q, o.heads, h), kk = heads(whole.k, o.kv_heads, k), v = heads(whole.v, o.kv_heads, k),
             d_out = heads(whole.d_out, o.heads, h);
  attention::Inputs<double> in;
  in.dims = attention::Dims{o.batch, h, k, o.length, o.length, o.head_dim};
  in.query = q.data();
  in.key = kk.data();
  in.value = v.data();
  in.mask = mask_of(spec, whole);
  Reference r;
  r.out.resize(q.size());
  r.lse.resize(static_cast<std::size_t>(o.batch * h * o.length));
  r.dq.resize(q.size());
  r.dk.resize(kk.size());
  r.dv.resize(v.size());
  if (auto f = attention::forward<double>(in, r.out.data(), r.lse.data()); !f.ok()) return f.error();
  if (auto b = attention::backward<double>(in, r.out.data(), r.lse.data(), d_out.data(),
                                           attention::Gradients<double>{r.dq.data(), r.dk.data(), r.dv.data()});
      !b.ok())
    return b.error();
  return r;
}

// max |got - want| / max |want| (normwise); infinity on a non-finite value.
double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double error = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double x = got[i], y = want[i];
    if (std::isinf(y) && x == y) continue;  // a row with no allowed key: lse -inf on both sides
    if (!std::isfinite(x)) return INFINITY;
    error = std::max(error, std::abs(x - y));
    norm = std::max(norm, std::abs(y));
  }
  return norm == 0 ? error : error / norm;
}

// What one device measured for one exchange.
struct Measured {
  double error = 0;                // the largest relative error over out, lse, dq, dk, dv
  std::vector<double> seconds;     // forward + backward, per counted run
  std::string failure;             // non-empty: the exchange failed on this device
};

std::string exchange_text(Exchange e) { return std::string(attention::exchange_name(e)); }

// Serialized per process for pool.all_gather: "exchange error seconds..."
// lines, or "exchange ! failure".
std::string serialize(const std::map<Exchange, std::vector<Measured>>& measured) {
  std::ostringstream out;
  out.precision(17);
  for (const auto& [exchange, devices] : measured)
    for (const Measured& m : devices) {
      out << exchange_text(exchange);
      if (!m.failure.empty()) {
        out << " ! " << m.failure << "\n";
        continue;
      }
      out << " " << m.error;
      for (const double s : m.seconds) out << " " << s;
      out << "\n";
    }
  return out.str();
}

int run(const CheckOptions& o) {
  auto fail = [](const std::string& message) {
    std::cerr << "dew: " << message << "\n";
    return 1;
  };
  auto mask = attention::parse_mask_kind(o.mask);
  if (!mask.ok()) return fail(mask.error().message);
  std::vector<Exchange> wanted;
  if (o.exchanges == "both") {
    wanted = {Exchange::kAllToAll, Exchange::kGather};
  } else if (o.exchanges == "all-to-all" || o.exchanges == "gather" || o.exchanges == "auto") {
    // auto: resolved from the rule below.
  } else {
    return fail("--exchange " + o.exchanges + " is not allowed; allowed: both, auto, all-to-all, gather");
  }

  // Devices are threads: one OpenBLAS thread each, as one accelerator each.
  openblas_set_num_threads(1);
  runtime::JoinOptions join_options;
  std::optional<runtime::Pool> joined;
  try {
    joined.emplace(runtime::join(join_options));
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  runtime::Pool& pool = *joined;
  const int processes = pool.size(), per = o.devices_per_process, devices = processes * per;

  const std::string spec_text = o.mesh.empty() ? "sequence=" + std::to_string(devices) : o.mesh;
  auto spec = mesh::parse_mesh_spec(spec_text);
  if (!spec.ok()) return fail("--mesh " + spec_text + ": " + spec.error().message);
  auto built = mesh::build_mesh(spec.value(), mesh::cpu_pool(processes, per));
  if (!built.ok()) {
    return fail("--mesh " + spec_text + " over " + std::to_string(devices) + " device" + (devices == 1 ? "" : "s") +
                " (" + std::to_string(processes) + " process" + (processes == 1 ? "" : "es") + " x " +
                std::to_string(per) + "): " + built.error().message);
  }
  const mesh::Mesh& layout = built.value();
  const int n = layout.shape[static_cast<std::size_t>(mesh::Axis::kSequence)];
  const int shards = layout.shape[static_cast<std::size_t>(mesh::Axis::kTensor)];

  attention::Call call;
  call.heads = o.heads;
  call.kv_heads = o.kv_heads;
  call.query_length = call.key_length = o.length;
  call.sequence = n;
  call.tensor = shards;
  call.mask = mask.value();
  call.head_dim = o.head_dim;
  call.bytes_per_value = 4;
  call.gather_kernel = attention::GatherKernel::kSkipsMaskedBlocks;  // the kernel that runs here
  auto plan = attention::choose_exchange(call);
  if (!plan.ok()) return fail(plan.error().message);
  if (o.kv_heads % shards != 0) {
    return fail("--kv-heads " + std::to_string(o.kv_heads) + " over tensor " + std::to_string(shards) +
                " is not allowed; allowed: key heads that divide by the tensor axis");
  }
  if (o.exchanges == "auto") wanted = {plan.value().exchange};
  if (o.exchanges == "all-to-all") wanted = {Exchange::kAllToAll};
  if (o.exchanges == "gather") wanted = {Exchange::kGather};
  std::vector<Exchange> runnable;
  std::vector<std::string> skipped;
  for (const Exchange e : wanted) {
    const attention::ExchangeCost& cost = e == Exchange::kAllToAll ? plan.value().all_to_all : plan.value().gather;
    if (cost.can_run) runnable.push_back(e);
    else skipped.push_back(exchange_text(e) + " cannot run: " + cost.why_not);
  }
  if (runnable.empty()) return fail(skipped.front());
  // Masked calls cut the sequence into 2N chunks (device i: chunks i and
  // 2N-1-i) so every device does the same work; that needs 2N to divide it.
  const bool masked = mask.value().kind != attention::MaskKind::kNone;
  const attention::Layout shard_layout =
      masked && o.length % (2 * n) == 0 ? attention::Layout::kChunkPairs : attention::Layout::kContiguous;

  const Whole whole = make_whole(o, mask.value().kind == attention::MaskKind::kDocuments);
  std::vector<int> mine;
  for (int d = 0; d < per; ++d) mine.push_back(pool.rank() * per + d);
  // The fp64 reference of every tensor shard this process's devices hold.
  std::map<int, Reference> references;
  for (const int device : mine) {
    const int shard = attention::axis_member(layout, mesh::Axis::kTensor, device).value().rank;
    if (references.count(shard)) continue;
    auto r = reference(o, mask.value(), whole, shard, shards);
    if (!r.ok()) return fail(r.error().message);
    references.emplace(shard, std::move(r.value()));
  }

  std::map<Exchange, std::vector<Measured>> measured;
  for (const Exchange e : runnable) measured[e].resize(mine.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    threads.emplace_back([&, i] {
      const int device = mine[i];
      const int shard = attention::axis_member(layout, mesh::Axis::kTensor, device).value().rank;
      const attention::AxisMember group = attention::axis_member(layout, mesh::Axis::kSequence, device).value();
      const int h = o.heads / shards, k = o.kv_heads / shards;
      auto record_failure = [&](const std::string& why) {
        for (const Exchange e : runnable) measured.at(e)[i].failure = "device " + std::to_string(device) + ": " + why;
      };
      auto positions = attention::shard_positions(shard_layout, o.length, n, group.rank);
      if (!positions.ok()) return record_failure(positions.error().message);
      const std::vector<std::int64_t>& pos = positions.value();
      auto local = [&](const std::vector<float>& x, int all, int count) {
        const auto part = attention::take_heads<float>(x, o.batch, all, shard * count, count, o.length * o.head_dim);
        return attention::take_rows<float>(part, o.batch, count, o.length, o.head_dim, pos);
      };
      const auto q = local(whole.q, o.heads, h), kk = local(whole.k, o.kv_heads, k),
                 v = local(whole.v, o.kv_heads, k), d_out = local(whole.d_out, o.heads, h);
      const Reference& ref = references.at(shard);
      auto want = [&](const std::vector<double>& x, int heads, std::int64_t width) {
        return attention::take_rows<double>(x, o.batch, heads, o.length, width, pos);
      };
      const auto want_out = want(ref.out, h, o.head_dim), want_lse = want(ref.lse, h, 1),
                 want_dq = want(ref.dq, h, o.head_dim), want_dk = want(ref.dk, k, o.head_dim),
                 want_dv = want(ref.dv, k, o.head_dim);

      auto comm = attention::make_axis_communicator(pool, layout, mesh::Axis::kSequence, device);
      if (!comm.ok()) return record_failure(comm.error().message);
      attention::ShardCall<float> shard_call;
      shard_call.dims = attention::Dims{o.batch, h, k, o.length, o.length, o.head_dim};
      shard_call.layout = shard_layout;
      shard_call.query = q.data();
      shard_call.key = kk.data();
      shard_call.value = v.data();
      const attention::Mask m = mask_of(mask.value(), whole);
      shard_call.causal = m.causal;
      shard_call.window = m.window;
      shard_call.query_segments = m.query_segments;
      shard_call.key_segments = m.key_segments;
      std::vector<float> out(q.size()), lse(pos.size() * std::size_t(o.batch * h)), dq(q.size()), dk(kk.size()),
          dv(v.size());
      // One call: forward + backward, timed between barriers of the group.
      auto once = [&](Exchange e) -> Result<double> {
        if (auto b = comm.value()->barrier(); !b.ok()) return b.error();
        const auto start = Clock::now();
        auto f = attention::exchange_forward<float>(e, *comm.value(), shard_call, out.data(), lse.data());
        if (!f.ok()) return f.error();
        auto b = attention::exchange_backward<float>(e, *comm.value(), shard_call, out.data(), lse.data(),
                                                     d_out.data(),
                                                     attention::Gradients<float>{dq.data(), dk.data(), dv.data()});
        if (!b.ok()) return b.error();
        return std::chrono::duration<double>(Clock::now() - start).count();
      };
      // The first call of each exchange is checked (and warms up); then
      // the counted runs, the exchanges interleaved A B, B A, ...
      for (const Exchange e : runnable) {
        auto first = once(e);
        if (!first.ok()) return record_failure(exchange_text(e) + ": " + first.error().message);
        Measured& mine_e = measured.at(e)[i];
        for (const double error : {relative_error(out, want_out), relative_error(lse, want_lse),
                                   relative_error(dq, want_dq), relative_error(dk, want_dk),
                                   relative_error(dv, want_dv)})
          mine_e.error = std::max(mine_e.error, std::isnan(error) ? INFINITY : error);
      }
      for (int r = 0; r < o.runs; ++r) {
        std::vector<Exchange> order = runnable;
        if (r % 2 == 1) std::reverse(order.begin(), order.end());
        for (const Exchange e : order) {
          auto seconds = once(e);
          if (!seconds.ok()) return record_failure(exchange_text(e) + ": " + seconds.error().message);
          measured.at(e)[i].seconds.push_back(seconds.value());
        }
      }
    });
  }
  for (auto& t : threads) t.join();

  // Every process's devices, at process 0.
  std::vector<std::string> all;
  try {
    all = pool.all_gather(serialize(measured));
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  struct Summary {
    double error = 0;
    std::vector<double> slowest;  // per run, the slowest device's seconds
    std::vector<std::string> failures;
  };
  std::map<std::string, Summary> summary;
  for (std::size_t process = 0; process < all.size(); ++process) {
    std::istringstream lines(all[process]);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      std::string name, first;
      fields >> name >> first;
      Summary& s = summary[name];
      if (first == "!") {
        std::string rest;
        std::getline(fields, rest);
        s.failures.push_back(rest.empty() ? rest : rest.substr(1));
        continue;
      }
      char* end = nullptr;
      const double error = std::strtod(first.c_str(), &end);
      if (first.empty() || *end != '\0') {
        s.failures.push_back("process " + std::to_string(process) + " sent an unreadable report: '" + line + "'");
        continue;
      }
      s.error = std::max(s.error, std::isnan(error) ? INFINITY : error);
      double seconds = 0;
      for (std::size_t r = 0; fields >> seconds; ++r) {
        if (s.slowest.size() <= r) s.slowest.push_back(0);
        s.slowest[r] = std::max(s.slowest[r], seconds);
      }
    }
  }
  bool ok = true;
  for (const auto& [name, s] : summary) ok = ok && s.failures.empty() && s.error <= o.tolerance;
  if (pool.rank() == 0) {
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.empty() ? NAN : v[v.size() / 2];
    };
    std::printf("attention check: %d devices (%d process%s x %d), mesh %s; batch %d, heads %d/%d, length %lld, head "
                "dim %d, mask %s, fp32 against fp64\n",
                devices, processes, processes == 1 ? "" : "es", per, mesh::format_mesh_spec(spec.value()).c_str(), o.batch, o.heads, o.kv_heads,
                static_cast<long long>(o.length), o.head_dim, attention::format_mask_kind(mask.value()).c_str());
    std::printf("rule: %s (%s)\n", exchange_text(plan.value().exchange).c_str(), plan.value().reason.c_str());
    for (const std::string& why : skipped) std::printf("skipped: %s\n", why.c_str());
    std::printf("\n%-11s %16s %16s  %s\n", "exchange", "forward+backward", "relative error", "");
    std::map<std::string, double> medians;
    for (const Exchange e : runnable) {
      const Summary& s = summary[exchange_text(e)];
      if (!s.failures.empty()) {
        std::printf("%-11s failed: %s\n", exchange_text(e).c_str(), s.failures.front().c_str());
        continue;
      }
      medians[exchange_text(e)] = median(s.slowest);
      std::printf("%-11s %14.4f s %16.2e  %s\n", exchange_text(e).c_str(), medians[exchange_text(e)], s.error,
                  s.error <= o.tolerance ? "ok" : "TOO LARGE");
    }
    std::printf("\ntime: the slowest device's, median of %d runs after one checked call; error: largest over out, "
                "lse, dq, dk, dv on every device (normwise), tolerance %.0e\n",
                o.runs, o.tolerance);
    if (medians.size() == 2) {
      const double a = medians["all-to-all"], g = medians["gather"];
      const std::string faster = a <= g ? "all-to-all" : "gather";
      std::printf("faster here: %s, by %.1f %%; the rule picked %s\n", faster.c_str(),
                  100.0 * (std::max(a, g) / std::min(a, g) - 1.0), exchange_text(plan.value().exchange).c_str());
    }
    std::printf("%s\n", ok ? "result: every exchange matches whole-sequence attention"
                           : "result: FAILED (see above)");
  }
  return ok ? 0 : 1;
}

}  // namespace

void add_attention_check_command(CLI::App& app) {
  auto o = std::make_shared<CheckOptions>();
  CLI::App* command = app.add_subcommand(
      "attention-check",
      "Run sequence-parallel attention across this pool (every process runs it, e.g. under srun --dew-pool): "
      "check both exchanges against whole-sequence attention in fp64 and time them");
  command->add_option("--devices-per-process", o->devices_per_process,
                      "CPU devices per process, one thread each (default 1)")
      ->check(CLI::Range(1, 64));
  command->add_option("--mesh", o->mesh,
                      "MeshSpec over all devices, e.g. tensor=2,sequence=4 (default: sequence = every device)");
  command->add_option("--heads", o->heads, "Query heads H (default 16)")->check(CLI::Range(1, 4096));
  command->add_option("--kv-heads", o->kv_heads, "Key/value heads K, a divisor of H (default 8)")
      ->check(CLI::Range(1, 4096));
  command->add_option("--length", o->length, "Sequence length (default 2048)")->check(CLI::Range(1, 1 << 20));
  command->add_option("--head-dim", o->head_dim, "Head width (default 64)")->check(CLI::Range(1, 1024));
  command->add_option("--batch", o->batch, "Sequences per call (default 1)")->check(CLI::Range(1, 1024));
  command->add_option("--mask", o->mask,
                      "none, causal, documents (causal within three documents), window=W or window=LEFT,RIGHT "
                      "(default causal)");
  command->add_option("--exchange", o->exchanges,
                      "both, auto (the rule's pick), all-to-all or gather (default both)");
  command->add_option("--runs", o->runs, "Timed runs of each exchange after the checked call (default 3)")
      ->check(CLI::Range(1, 1000));
  command->add_option("--tolerance", o->tolerance, "Largest relative error allowed (default 1e-4)")
      ->check(CLI::PositiveNumber);
  command->add_option("--seed", o->seed, "Seed of the random inputs, the same on every process (default 1)");
  command->callback([o] {
    if (const int code = run(*o); code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace dew::cli
