// One device's run: its place and communicators, its parameter and optimizer
// shards, and every step: gather each bucket over fsdp, the pass, the
// gradients summed over sequence, reduce-scattered over fsdp and summed over
// data, AdamW on the shard.
#include "device.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>

#include "canonical.h"
#include "checkpoint.h"
#include "collectives.h"
#include "data.h"
#include "layout.h"
#include "model.h"
#include "params.h"

namespace dew::train {
namespace {

template <typename T>
std::vector<Shard<T>> initial_shards(const std::vector<std::vector<ParamSpec>>& buckets, const DevicePlace& p,
                                     std::uint64_t seed) {
  std::vector<Shard<T>> shards;
  for (const auto& bucket : buckets) {
    std::vector<T> flat;
    for (const auto& spec : bucket) {
      const auto part = initial_part<T>(spec, p.tensor.rank, p.tensor.size, seed);
      flat.insert(flat.end(), part.begin(), part.end());
    }
    Shard<T> s;
    s.size = std::int64_t(flat.size());
    s.chunk = (s.size + p.fsdp.size - 1) / p.fsdp.size;
    flat.resize(std::size_t(s.chunk * p.fsdp.size), T(0));
    s.params.assign(flat.begin() + s.chunk * p.fsdp.rank, flat.begin() + s.chunk * (p.fsdp.rank + 1));
    s.m.assign(s.params.size(), T(0));
    s.v.assign(s.params.size(), T(0));
    shards.push_back(std::move(s));
  }
  return shards;
}

template <typename T>
void adamw(const WorkerOptions& o, int step, std::span<const T> grad, Shard<T>& s) {
  const double correct1 = 1 - std::pow(o.beta1, step), correct2 = 1 - std::pow(o.beta2, step);
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    s.m[i] = T(o.beta1 * s.m[i] + (1 - o.beta1) * grad[i]);
    s.v[i] = T(o.beta2 * s.v[i] + (1 - o.beta2) * double(grad[i]) * grad[i]);
    const double update = (s.m[i] / correct1) / (std::sqrt(s.v[i] / correct2) + o.epsilon);
    s.params[i] = T(s.params[i] - o.learning_rate * (update + o.weight_decay * s.params[i]));
  }
}

// The shards of a resumed run: this device's runs of the canonical state.
template <typename T>
std::vector<Shard<T>> resumed_shards(const std::vector<std::vector<ParamSpec>>& buckets,
                                     const std::vector<Leaf>& leaves, const DevicePlace& p,
                                     const std::vector<double>& state) {
  const std::int64_t elements = canonical_size(leaves);
  std::vector<Shard<T>> shards;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    Shard<T> s;
    s.size = bucket_layout(buckets[b], p.tensor.size).size;
    s.chunk = (s.size + p.fsdp.size - 1) / p.fsdp.size;
    for (auto* section : {&s.params, &s.m, &s.v}) section->assign(std::size_t(s.chunk), T(0));
    const std::int64_t first = s.chunk * p.fsdp.rank, last = std::min(s.size, first + s.chunk);
    for (const auto& run :
         canonical_runs(buckets, int(b), leaves, p.tensor.rank, p.tensor.size, first, last, Replicated::kEveryRank)) {
      int section = 0;
      for (auto* values : {&s.params, &s.m, &s.v}) {
        const double* from = state.data() + section++ * elements + run.canonical;
        std::transform(from, from + run.length, values->begin() + (run.local - first), [](double x) { return T(x); });
      }
    }
    shards.push_back(std::move(s));
  }
  return shards;
}

// Sleeps until the process is ended (the stall drills).
[[noreturn]] void stall() {
  while (true) std::this_thread::sleep_for(std::chrono::hours(1));
}

bool drill_here(const ProcessRun& run, Drill::Kind kind, int step) {
  const Drill& d = run.options.drill;
  return d.kind == kind && d.rank == run.pool.rank() && d.step == step;
}

// Every device writes its shards (one device per data x sequence replica);
// then process 0 seals the checkpoint once every process has written: the
// digest, the finite check and the manifest (checkpoint.h).
template <typename T>
Result<Done> save_checkpoint(ProcessRun& run, const DevicePlace& p, const std::vector<std::vector<ParamSpec>>& buckets,
                             const std::vector<Leaf>& leaves, const std::vector<Shard<T>>& shards, int step, int local,
                             const std::vector<double>& losses) {
  const WorkerOptions& o = run.options;
  const std::string path = state_path_of(o.checkpoint_dir, step);
  const std::int64_t elements = canonical_size(leaves);
  if (p.data.rank == 0 && p.sequence.rank == 0) {
    for (std::size_t b = 0; b < shards.size(); ++b) {
      const Shard<T>& s = shards[b];
      const std::int64_t first = s.chunk * p.fsdp.rank, last = std::min(s.size, first + s.chunk);
      const auto runs =
          canonical_runs(buckets, int(b), leaves, p.tensor.rank, p.tensor.size, first, last, Replicated::kRankZeroOnly);
      int section = 0;
      for (const auto* values : {&s.params, &s.m, &s.v}) {
        std::function<void()> halfway;
        if (b == 0 && section == 0 && drill_here(run, Drill::Kind::kCrashWhileSaving, step)) {
          halfway = [] { ::raise(SIGKILL); };
        }
        auto wrote = write_state_runs<T>(path, section++, elements, runs, first, std::span<const T>(*values), halfway);
        if (!wrote.ok()) return wrote;
      }
    }
  }
  // A process whose devices write no shard (data rank > 0 everywhere, as on
  // a data=4 mesh) still crashes while saving when drilled to (issue 26: the
  // drill did nothing there): before the checkpoint's agreement.
  if (local == 0 && drill_here(run, Drill::Kind::kCrashWhileSaving, step)) ::raise(SIGKILL);
  run.devices.arrive_and_wait();
  Result<Done> saved = Done{};
  if (local == 0) {
    if (std::filesystem::exists(path)) saved = sync_file(path);
    if (saved.ok() && drill_here(run, Drill::Kind::kStallBeforeCheckpoint, step)) stall();
    // Throws PoolError naming the processes that never came (the patience,
    // DEW_AGREEMENT_PATIENCE_SECONDS); uncaught, it fails the pool.
    if (saved.ok()) run.pool.agree("checkpoint at step " + std::to_string(step));
    if (saved.ok() && run.pool.rank() == 0) {
      Manifest m;
      m.step = step;
      m.state = std::filesystem::relative(path, o.checkpoint_dir).string();
      m.elements = elements;
      m.dtype = dtype_name(o.dtype);
      m.model = o.model;
      m.batch = o.batch;
      m.seed = o.seed;
      m.learning_rate = o.learning_rate;
      m.mesh = o.mesh.empty() ? "data over every device" : o.mesh;
      m.losses = losses;
      // A lock file replaced meanwhile may let another pool in: stop
      // before this pool's manifest could replace that pool's.
      if (run.checkpoint_lock) saved = run.checkpoint_lock->still_held(o.checkpoint_dir);
      if (saved.ok()) saved = seal_checkpoint(o.checkpoint_dir, m);
    }
  }
  run.devices.arrive_and_wait();
  return saved;
}

// capture_gradient: this device's runs of step 1's gradient, into the
// process's canonical copy (devices write disjoint runs).
template <typename T>
void capture_gradient(ProcessRun& run, const DevicePlace& p, const std::vector<std::vector<ParamSpec>>& buckets,
                      const std::vector<Leaf>& leaves, const Shard<T>& s, int bucket, const std::vector<T>& grad) {
  if (!run.gradient || p.data.rank != 0 || p.sequence.rank != 0) return;
  const std::int64_t first = s.chunk * p.fsdp.rank, last = std::min(s.size, first + s.chunk);
  // Disjoint over the pool: the processes' copies are summed.
  for (const auto& r :
       canonical_runs(buckets, bucket, leaves, p.tensor.rank, p.tensor.size, first, last, Replicated::kRankZeroOnly)) {
    for (std::int64_t k = 0; k < r.length; ++k) {
      (*run.gradient)[std::size_t(r.canonical + k)] = double(grad[std::size_t(r.local - first + k)]);
    }
  }
}

// A loss that is not finite ends the run before anything of its state is
// saved. Every device sees the same mean (all-reduced), so one must speak for
// the pool: an all_gather of every device's part (on this path only) finds
// the first process and device whose part is not finite, and that device
// publishes the error at once; the others end as its peers when its word
// comes (a peer's failure waits for it). All parts finite (their sum
// overflowed): device 0 of process 0 speaks.
Error non_finite_loss(ProcessRun& run, int local, int step, double part, double mean) {
  auto& parts = run.loss_parts;
  parts.devices[std::size_t(local)] = part;
  run.devices.arrive_and_wait();
  if (local == 0) {
    const std::string mine(reinterpret_cast<const char*>(parts.devices.data()), parts.devices.size() * sizeof(double));
    parts.processes = run.local_only ? runtime::Gathered(std::vector<std::string>{mine}) : run.pool.all_gather(mine);
  }
  run.devices.arrive_and_wait();
  int rank = 0, device = 0;
  bool found = false;
  for (std::size_t r = 0; r < parts.processes.size() && !found; ++r) {
    std::vector<double> theirs(parts.processes[r].size() / sizeof(double));
    std::memcpy(theirs.data(), parts.processes[r].data(), theirs.size() * sizeof(double));
    for (std::size_t d = 0; d < theirs.size() && !found; ++d) {
      found = !std::isfinite(theirs[d]);
      if (found) rank = int(r), device = int(d);
    }
  }
  const std::string what = "step " + std::to_string(step) + ": the loss is " + value_text(mean);
  if ((run.local_only ? 0 : run.pool.rank()) != rank || local != device) {
    return peer_failed(what + "; process " + std::to_string(rank) + " reports it");
  }
  return invalid_argument(what +
                          (found
                               ? " (process " + std::to_string(rank) + ": this device's part of the global batch is " +
                                     value_text(part) + ", the first part that is not finite)"
                               : " (every device's part of the global batch is finite; their sum is not)") +
                          "; the run ends here, and no checkpoint of this state is written");
}

StepRecord record_of(int step, double loss, Clock::time_point start, const StepSplit& split) {
  StepRecord record;
  record.step = step;
  record.loss = loss;
  record.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  double collective = 0;
  for (const auto& [what, seconds] : split.seconds) collective += seconds;
  record.split = split.seconds;
  record.split["compute"] = std::max(0.0, record.seconds - collective);
  return record;
}

// One step's pass over this device's part of the batch: the bucket
// gradients, and the sum of its tokens' losses.
template <typename T>
struct Pass {
  std::vector<std::vector<T>> grads;
  double loss = 0;
};

template <typename T>
Result<Pass<T>> run_pass(const ProcessRun& run, const DevicePlace& p,
                         const std::vector<std::vector<ParamSpec>>& buckets, const std::vector<std::vector<T>>& params,
                         int step, LayoutCollectives<T>& collectives) {
  const WorkerOptions& o = run.options;
  if (drill_here(run, Drill::Kind::kLoaderThrows, step + 1)) {
    throw std::runtime_error("data loader: cannot read the batch of step " + std::to_string(step + 1) +
                             " (--drill loader-throws)");
  }
  if (p.device == run.first_device && drill_here(run, Drill::Kind::kStallInStep, step + 1)) stall();
  const Batch batch = batch_of(run.dataset, step, p.first_sequence, p.sequences, p.positions);
  Pass<T> pass;
  std::vector<std::span<const T>> param_views;
  std::vector<std::span<T>> grad_views;
  for (const auto& whole_bucket : params) {
    pass.grads.emplace_back(whole_bucket.size(), T(0));
    param_views.emplace_back(whole_bucket);
  }
  for (auto& g : pass.grads) grad_views.emplace_back(g);
  const DeviceShape shape{p.sequences, int(p.positions.size()), p.tensor.size, p.positions};
  const T scale = T(1.0 / (double(o.batch) * o.model.length));
  auto loss = forward_backward<T>(o.model, shape, buckets, param_views, batch.tokens, batch.targets, scale, grad_views,
                                  collectives);
  if (!loss.ok()) return loss.error().prefixed("step " + std::to_string(step + 1) + ": ");
  pass.loss = loss.value() * double(scale);
  return pass;
}

template <typename T>
Result<DeviceResult> train_typed(ProcessRun& run, int local) {
  const WorkerOptions& o = run.options;
  const int device = run.first_device + local;
  auto place = place_of(run.mesh, o, device);
  if (!place.ok()) return place.error();
  const DevicePlace& p = place.value();
  // Nothing to train (--resume auto on the final step's checkpoint): no
  // communicators, whose connecting a peer's prompt end would cut short.
  const bool nothing_to_train = run.start_step >= o.steps;
  auto comms = nothing_to_train ? Result<Communicators>(Communicators{}) : make_communicators(run.pool, run.mesh, p);
  if (!comms.ok()) return comms.error();
  DeviceResult result;
  auto plan = plan_exchange(o, p.sequence.size, p.tensor.size);
  if (!plan.ok()) return plan.error();
  if (p.sequence.size > 1) {
    result.exchange = std::string(attention::exchange_name(plan.value().exchange));
    result.exchange_reason = plan.value().reason;
  }
  const auto buckets = model_buckets(o.model);
  const auto leaves = model_leaves(buckets);
  auto shards = run.resumed_state ? resumed_shards<T>(buckets, leaves, p, *run.resumed_state)
                                  : initial_shards<T>(buckets, p, o.seed);
  for (const auto& s : shards) result.state_bytes += std::int64_t(3 * s.params.size() * sizeof(T));
  const int head = o.model.width / o.model.heads;
  const auto positions = std::int64_t(p.positions.size());
  const attention::Dims local_dims{
      p.sequences, o.model.heads / p.tensor.size, o.model.kv_heads / p.tensor.size, positions, positions, head};
  attention::Dims whole = local_dims;
  whole.query_length = whole.key_length = o.model.length;
  std::vector<double> losses = run.earlier_losses;
  for (int step = run.start_step; step < o.steps; ++step) {
    StepSplit split{&run.watch, local, {}};
    run.watch.step_begins(local, step + 1);
    const auto start = Clock::now();
    auto params = gather_buckets(shards, p, comms.value(), split);
    if (!params.ok()) return params.error();
    LayoutCollectives<T> collectives(comms.value().tensor.get(), comms.value().sequence.get(), plan.value().exchange,
                                     local_dims, whole, split);
    auto pass = run_pass<T>(run, p, buckets, params.value(), step, collectives);
    if (!pass.ok()) return pass.error();
    for (std::size_t b = 0; b < shards.size(); ++b) {
      auto shard = reduce_gradients(pass.value().grads[b], shards[b], p, comms.value(), split);
      if (!shard.ok()) return shard.error();
      if (step == 0) capture_gradient<T>(run, p, buckets, leaves, shards[b], int(b), shard.value());
      adamw<T>(o, step + 1, shard.value(), shards[b]);
    }
    auto mean = global_loss(pass.value().loss, comms.value(), split);
    if (!mean.ok()) return mean.error();
    run.watch.step_ends(local);
    if (!std::isfinite(mean.value())) return non_finite_loss(run, local, step + 1, pass.value().loss, mean.value());
    StepRecord record = record_of(step + 1, mean.value(), start, split);
    losses.push_back(record.loss);
    if (run.progress && local == 0) run.progress(record);
    result.steps.push_back(std::move(record));
    if (o.checkpoint_every > 0 && ((step + 1) % o.checkpoint_every == 0 || step + 1 == o.steps)) {
      auto saved = save_checkpoint<T>(run, p, buckets, leaves, shards, step + 1, local, losses);
      if (!saved.ok()) return saved.error();
    }
  }
  return result;
}

}  // namespace

Result<DeviceResult> train_device(ProcessRun& run, int local_device) {
  return run.options.dtype == Dtype::kFloat64 ? train_typed<double>(run, local_device)
                                              : train_typed<float>(run, local_device);
}

}  // namespace dew::train
