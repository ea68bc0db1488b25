// `dew attention-check`: the setup every process computes alike (mesh,
// plan, inputs, references), and one device's measurement.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "attention_check.h"
#include "dew/axes.h"
#include "dew/text.h"

namespace dew::cli {
namespace {

using Clock = std::chrono::steady_clock;

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
      for (std::int64_t p = 0; p < o.length; ++p)
        w.segments.push_back(std::int32_t(std::min<std::int64_t>(2, (3 * p + b) / o.length)));
  }
  return w;
}

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

// The mesh over the pool's CPU devices.
Result<Done> lay_out(const CheckOptions& o, CheckSetup& s) {
  const int per = o.devices_per_process, devices = s.processes * per;
  const std::string spec_text = o.mesh.empty() ? "sequence=" + std::to_string(devices) : o.mesh;
  auto spec = mesh::parse_mesh_spec(spec_text);
  if (!spec.ok()) return spec.error().prefixed("--mesh " + spec_text + ": ");
  auto built = mesh::build_mesh(spec.value(), mesh::cpu_pool(s.processes, per));
  if (!built.ok()) {
    return built.error().prefixed("--mesh " + spec_text + " over " + counted(devices, "device") + " (" +
                                  counted(s.processes, "process", "processes") + " x " + std::to_string(per) + "): ");
  }
  s.spec = spec.value();
  s.layout = built.value();
  s.sequence = s.layout.shape[static_cast<std::size_t>(mesh::Axis::kSequence)];
  s.shards = s.layout.shape[static_cast<std::size_t>(mesh::Axis::kTensor)];
  return Done{};
}

// The rule's plan, and which of the wanted exchanges can run.
Result<Done> choose(const CheckOptions& o, CheckSetup& s) {
  attention::Call call;
  call.heads = o.heads;
  call.kv_heads = o.kv_heads;
  call.query_length = call.key_length = o.length;
  call.sequence = s.sequence;
  call.tensor = s.shards;
  call.mask = s.mask;
  call.head_dim = o.head_dim;
  call.bytes_per_value = 4;
  call.gather_kernel = attention::GatherKernel::kSkipsMaskedBlocks;  // the kernel that runs here
  auto plan = attention::choose_exchange(call);
  if (!plan.ok()) return plan.error();
  if (o.kv_heads % s.shards != 0) {
    return not_allowed("--kv-heads", std::to_string(o.kv_heads),
                       "key heads that divide by the tensor axis (" + std::to_string(s.shards) + ")");
  }
  s.plan = plan.value();
  std::vector<Exchange> wanted = {Exchange::kAllToAll, Exchange::kGather};
  if (o.exchanges == "auto") wanted = {s.plan.exchange};
  if (o.exchanges == "all-to-all") wanted = {Exchange::kAllToAll};
  if (o.exchanges == "gather") wanted = {Exchange::kGather};
  for (const Exchange e : wanted) {
    const attention::ExchangeCost& cost = e == Exchange::kAllToAll ? s.plan.all_to_all : s.plan.gather;
    if (cost.can_run) {
      s.runnable.push_back(e);
    } else {
      s.skipped.push_back(std::string(attention::exchange_name(e)) + " cannot run: " + cost.why_not);
    }
  }
  if (s.runnable.empty()) return unsupported(s.skipped.front());
  return Done{};
}

}  // namespace

Result<CheckSetup> prepare_check(const CheckOptions& o, int processes, int rank) {
  CheckSetup s;
  s.processes = processes;
  auto mask = attention::parse_mask_kind(o.mask);
  if (!mask.ok()) return mask.error();
  s.mask = mask.value();
  if (auto done = lay_out(o, s); !done.ok()) return done.error();
  if (auto done = choose(o, s); !done.ok()) return done.error();
  // Masked calls cut the sequence into 2N chunks (device i: chunks i and
  // 2N-1-i) so every device does the same work; that needs 2N to divide it.
  const bool masked = s.mask.kind != attention::MaskKind::kNone;
  s.shard_layout =
      masked && o.length % (2 * s.sequence) == 0 ? attention::Layout::kChunkPairs : attention::Layout::kContiguous;
  s.whole = make_whole(o, s.mask.kind == attention::MaskKind::kDocuments);
  for (int d = 0; d < o.devices_per_process; ++d) {
    const int device = mesh::cpu_device_id(rank, o.devices_per_process, d);
    const int shard = axes::axis_member(s.layout, mesh::Axis::kTensor, device).value().rank;
    if (s.references.count(shard)) continue;
    auto r = reference(o, s.mask, s.whole, shard, s.shards);
    if (!r.ok()) return r.error();
    s.references.emplace(shard, std::move(r.value()));
  }
  return s;
}

void measure_device(const CheckOptions& o, const CheckSetup& s, runtime::Pool& pool, int device,
                    std::map<Exchange, Measured*> measured) {
  const auto record_failure = [&](const std::string& why) {
    for (auto& [e, m] : measured) m->failure = "device " + std::to_string(device) + ": " + why;
  };
  const int shard = axes::axis_member(s.layout, mesh::Axis::kTensor, device).value().rank;
  const axes::AxisMember group = axes::axis_member(s.layout, mesh::Axis::kSequence, device).value();
  const int h = o.heads / s.shards, k = o.kv_heads / s.shards;
  auto positions = attention::shard_positions(s.shard_layout, o.length, s.sequence, group.rank);
  if (!positions.ok()) return record_failure(positions.error().message);
  const std::vector<std::int64_t>& pos = positions.value();
  const auto local = [&](const std::vector<float>& x, int all, int count) {
    const auto part = attention::take_heads<float>(x, o.batch, all, shard * count, count, o.length * o.head_dim);
    return attention::take_rows<float>(part, o.batch, count, o.length, o.head_dim, pos);
  };
  const auto q = local(s.whole.q, o.heads, h), kk = local(s.whole.k, o.kv_heads, k),
             v = local(s.whole.v, o.kv_heads, k), d_out = local(s.whole.d_out, o.heads, h);
  const Reference& ref = s.references.at(shard);
  const auto want = [&](const std::vector<double>& x, int heads, std::int64_t width) {
    return attention::take_rows<double>(x, o.batch, heads, o.length, width, pos);
  };
  const std::vector<double> wanted[] = {want(ref.out, h, o.head_dim), want(ref.lse, h, 1), want(ref.dq, h, o.head_dim),
                                        want(ref.dk, k, o.head_dim), want(ref.dv, k, o.head_dim)};

  auto comm = axes::make_axis_communicator(pool, s.layout, mesh::Axis::kSequence, device);
  if (!comm.ok()) return record_failure(comm.error().message);
  attention::ShardCall<float> call;
  call.dims = attention::Dims{o.batch, h, k, o.length, o.length, o.head_dim};
  call.layout = s.shard_layout;
  call.query = q.data();
  call.key = kk.data();
  call.value = v.data();
  const attention::Mask m = mask_of(s.mask, s.whole);
  call.causal = m.causal;
  call.window = m.window;
  call.query_segments = m.query_segments;
  call.key_segments = m.key_segments;
  std::vector<float> out(q.size()), lse(pos.size() * std::size_t(o.batch * h)), dq(q.size()), dk(kk.size()),
      dv(v.size());
  // One call: forward + backward, timed between barriers of the group.
  const auto once = [&](Exchange e) -> Result<double> {
    if (auto b = comm.value()->barrier(); !b.ok()) return b.error();
    const auto start = Clock::now();
    auto f = attention::exchange_forward<float>(e, *comm.value(), call, out.data(), lse.data());
    if (!f.ok()) return f.error();
    auto b = attention::exchange_backward<float>(e, *comm.value(), call, out.data(), lse.data(), d_out.data(),
                                                 attention::Gradients<float>{dq.data(), dk.data(), dv.data()});
    if (!b.ok()) return b.error();
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  // The first call of each exchange is checked (and warms up); then the
  // counted runs, the exchanges interleaved A B, B A, ...
  for (const Exchange e : s.runnable) {
    auto first = once(e);
    if (!first.ok()) return record_failure(std::string(attention::exchange_name(e)) + ": " + first.error().message);
    const std::vector<float>* got[] = {&out, &lse, &dq, &dk, &dv};
    for (std::size_t t = 0; t < std::size(got); ++t) {
      const double error = relative_error(*got[t], wanted[t]);
      measured.at(e)->error = std::max(measured.at(e)->error, std::isnan(error) ? INFINITY : error);
    }
  }
  for (int r = 0; r < o.runs; ++r) {
    std::vector<Exchange> order = s.runnable;
    if (r % 2 == 1) std::reverse(order.begin(), order.end());
    for (const Exchange e : order) {
      auto seconds = once(e);
      if (!seconds.ok())
        return record_failure(std::string(attention::exchange_name(e)) + ": " + seconds.error().message);
      measured.at(e)->seconds.push_back(seconds.value());
    }
  }
}

Result<Done> check_fits(const CheckOptions& o, long double memory) {
  const long double need = 32.0L * 8 * o.batch * std::max(o.heads, o.kv_heads) * o.length * o.head_dim;
  if (memory <= 0 || need <= memory) return Done{};
  const auto gib = [](long double bytes) { return std::to_string(static_cast<long long>(bytes / (1LL << 30))); };
  return invalid_argument("--batch " + std::to_string(o.batch) + ", --heads " + std::to_string(o.heads) +
                          ", --length " + std::to_string(o.length) + " and --head-dim " + std::to_string(o.head_dim) +
                          " need about " + gib(need) + " GiB on each process, more than this machine's " + gib(memory) +
                          " GiB; allowed: a smaller --batch, --heads, --length or --head-dim");
}

}  // namespace dew::cli
