// run_worker: what a process does once for all its devices (the checkpoint
// directory, a resumed state, the cached dataset, the stall watch), one
// thread per device, and the report; report_json: the pool.json of the
// design page.
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "canonical.h"
#include "checkpoint.h"
#include "dataset_cache.h"
#include "device.h"
#include "dew/directory_lock.h"
#include "dew/failure_timings.h"
#include "dew/log.h"
#include "dew/text.h"
#include "dew/topology.h"
#include "dew/train.h"
#include "layout.h"

namespace dew::train {
namespace {

// Who holds a checkpoint directory, for the pool that finds it taken.
std::string holder_line(const runtime::Pool& pool) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char since[32] = {};
  std::strftime(since, sizeof since, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  return "a pool of " + counted(pool.size(), "process", "processes") + " (process 0 on " + host + ", pid " +
         std::to_string(::getpid()) + ", since " + since + ")";
}

// --resume auto: whether the directory holds a checkpoint to resume from
// (its manifest, written last). Process 0's look decides for the pool, so
// every process takes the same way even if one is written meanwhile; what is
// there is then verified as any --resume's is, never started over silently.
bool has_checkpoint(runtime::Pool& pool, const std::string& directory) {
  std::error_code ignored;
  const bool here = std::filesystem::exists(directory + "/manifest.json", ignored);
  const bool found = pool.all_gather(here ? "1" : "0").front() == "1";
  if (pool.rank() == 0 && !found) {
    log_info("--resume auto: no checkpoint in " + directory + " yet: starting at step 1");
  }
  return found;
}

// The checkpoint directory, shared by every process (checked before step 1)
// and held by this pool alone (process 0 holds its lock for the run), and
// the state to resume from.
Result<std::optional<Checkpoint>> prepare_checkpoints(runtime::Pool& pool, const WorkerOptions& o,
                                                      std::optional<DirectoryLock>& lock) {
  if (o.checkpoint_dir.empty()) {
    if (o.resume != Resume::kNo) {
      return invalid_argument("--resume needs --checkpoint-dir, the directory to resume from");
    }
    if (o.checkpoint_every > 0) return invalid_argument("--checkpoint-every needs --checkpoint-dir");
    return std::optional<Checkpoint>();
  }
  if (o.checkpoint_every < 0) {
    return invalid_argument("--checkpoint-every " + std::to_string(o.checkpoint_every) +
                            " is not allowed; allowed: 0 (only resume) or more");
  }
  std::error_code error;
  std::filesystem::create_directories(o.checkpoint_dir, error);
  if (error) return system_error("--checkpoint-dir: cannot create " + o.checkpoint_dir + ": " + error.message());
  if (pool.rank() == 0) {
    auto taken = DirectoryLock::take(o.checkpoint_dir, holder_line(pool));
    // The others wait for process 0 at the shared-directory check below:
    // its refusal ends the pool at once, named (returned, it left them
    // waiting for it, and it for them as it left).
    if (!taken.ok()) pool.fail("--checkpoint-dir: " + taken.error().message, 1);
    lock.emplace(std::move(taken.value()));
  }
  if (auto shared = pool.check_shared_directory(o.checkpoint_dir); !shared.ok()) {
    return shared.error().prefixed("--checkpoint-dir: ");
  }
  if (o.resume == Resume::kNo) return std::optional<Checkpoint>();
  if (o.resume == Resume::kIfAny && !has_checkpoint(pool, o.checkpoint_dir)) return std::optional<Checkpoint>();
  // Every process verifies what it reads itself (no file can change between
  // one process's check and another's read); the first that refuses speaks
  // for the pool, once, with a refused resume's exit code 1, and the others
  // end as its peers when its word comes.
  auto loaded = load_checkpoint(o.checkpoint_dir, o);
  const auto verdicts = pool.all_gather(loaded.ok() ? "" : loaded.error().message);
  for (std::size_t r = 0; r < verdicts.size(); ++r) {
    if (verdicts[r].empty()) continue;
    const std::string verdict(verdicts[r]);
    if (int(r) == pool.rank()) pool.fail(verdict, 1);
    pool.wait_until_ending(timings::kPeerNoticeGrace);  // its word ends this process as its peer
    return peer_failed("process " + std::to_string(r) + " refused the checkpoint: " + verdict);
  }
  if (pool.rank() == 0) {
    const int step = loaded.value().manifest.step;
    const std::string verified = " (its size, digest and binding verified by every process)";
    if (step == o.steps) {
      log_info("--resume auto: the checkpoint in " + o.checkpoint_dir + " is of step " + std::to_string(step) +
               ", the last of --steps " + std::to_string(o.steps) + verified +
               ": the training is complete, nothing left to train");
    } else {
      log_info("resuming from the checkpoint of step " + std::to_string(step) + " in " + o.checkpoint_dir + verified);
    }
  }
  return std::optional<Checkpoint>(std::move(loaded.value()));
}

// The dataset, from the cache when every process's fingerprint agrees; one
// line from process 0 says who found it.
CachedDataset load_dataset(runtime::Pool& pool, const WorkerOptions& o, std::vector<bool>& found) {
  if (o.cache_dir.empty()) return cached_dataset(o, std::nullopt, "");
  const auto key = pool.compile_cache_key(topology::accelerator_fingerprint());
  CachedDataset cached = cached_dataset(o, key, o.cache_dir);
  const auto flags = pool.all_gather(cached.found ? "1" : "0");
  const auto stored = pool.all_gather(store_dataset(cached) ? "1" : "0");
  const auto unstored = std::count(stored.begin(), stored.end(), std::string_view("0"));
  int hits = 0;
  for (const auto& flag : flags) {
    found.push_back(flag == "1");
    hits += flag == "1";
  }
  if (pool.rank() != 0) return cached;
  const std::string what = "the tokenized dataset (" + counted(o.steps, "step") + " x " + counted(o.batch, "sequence") +
                           " x " + std::to_string(o.model.length + 1) + " tokens)";
  if (!key) {
    log_info("cache: off for this run (the processes' accelerator fingerprints differ); " + what + " made in memory");
  } else if (hits == pool.size()) {
    log_info("cache: every process (" + std::to_string(hits) + ") found " + what + " under compile-cache key " +
             key->substr(0, 12) + " in " + o.cache_dir + "; not tokenized again");
  } else {
    // Only what was stored is said to be: a process that could not says why.
    const std::string kept = unstored == 0 ? " and stored it in " + o.cache_dir
                                           : "; " + counted(unstored, "process", "processes") +
                                                 " could not store it in " + o.cache_dir + " (each said why)";
    log_info("cache: " + std::to_string(hits) + " of " + counted(pool.size(), "process", "processes") + " found " +
             what + " under compile-cache key " + key->substr(0, 12) + "; the others tokenized it" + kept);
  }
  return cached;
}

// Step 1's gradient, whole, on every process: each holds its writers' runs
// (zeros elsewhere), and the runs of all processes are disjoint.
std::vector<double> gathered_gradient(runtime::Pool& pool, const std::vector<double>& local) {
  if (pool.size() == 1) return local;
  const std::string bytes(reinterpret_cast<const char*>(local.data()), local.size() * sizeof(double));
  std::vector<double> whole(local.size(), 0.0), part(local.size());
  for (const auto& other : pool.all_gather(bytes)) {
    std::memcpy(part.data(), other.data(), std::min(other.size(), part.size() * sizeof(double)));
    for (std::size_t k = 0; k < whole.size(); ++k) whole[k] += part[k];
  }
  return whole;
}

// Trains this process's devices over `layout`. local_only: a layout of this
// process alone (the one-device reference), with no pool-wide steps.
Result<WorkerReport> train_process(runtime::Pool& pool, const mesh::Mesh& layout, const WorkerOptions& o,
                                   const std::function<void(const StepRecord&)>& progress, bool local_only) {
  WorkerReport report;
  std::optional<Checkpoint> resumed;
  std::optional<DirectoryLock> held;  // the checkpoint directory's, for the run
  if (!local_only) {
    auto prepared = prepare_checkpoints(pool, o, held);
    if (!prepared.ok()) return prepared.error();
    resumed = std::move(prepared.value());
  }
  CachedDataset data = local_only ? cached_dataset(o, std::nullopt, "") : load_dataset(pool, o, report.cache_found);
  if (o.reverse_batch) reverse_sequences(data.dataset);
  const int devices = o.devices_per_process;
  const int first_device = local_only ? 0 : mesh::cpu_device_id(pool.rank(), devices, 0);
  StallWatch watch(pool, o.step_bound, devices, first_device);
  std::barrier<> sync(devices);
  const auto leaves = model_leaves(model_buckets(o.model));
  std::vector<double> gradient(o.capture_gradient ? std::size_t(canonical_size(leaves)) : 0);
  ProcessRun run{pool, layout, o, data.dataset, watch, sync, first_device, 0, nullptr, {}, {}, nullptr, local_only, {}};
  run.loss_parts.devices.assign(std::size_t(devices), 0.0);
  if (resumed) {
    run.start_step = resumed->manifest.step;
    run.resumed_state = &resumed->state;
    run.earlier_losses = resumed->manifest.losses;
  }
  if (pool.rank() == 0) run.progress = progress;
  if (held) run.checkpoint_lock = &*held;
  if (o.capture_gradient) run.gradient = &gradient;
  std::vector<Result<DeviceResult>> results(std::size_t(devices), Result<DeviceResult>(DeviceResult{}));
  std::vector<std::thread> threads;
  for (int d = 0; d < devices; ++d) {
    threads.emplace_back([&, d] {
      results[std::size_t(d)] = train_device(run, d);
      // Its peers wait for it inside collectives: its error ends the pool.
      // A collective fails also when a peer process died or failed: the
      // pool's word of that peer (which ends this process with the
      // peer-failed code, naming it) comes within a moment, so a broken
      // collective gets that moment first. Its own error (a disk full, a
      // bad value) is published at once: the culprit speaks first.
      if (!results[std::size_t(d)].ok()) {
        const Error& error = results[std::size_t(d)].error();
        if (!local_only && may_be_a_peers_failure(error)) pool.wait_until_ending(timings::kPeerNoticeGrace);
        pool.fail("device " + std::to_string(first_device + d) + ": " + error.message);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const DeviceResult& first = results[0].value();
  report.mesh = layout;
  report.steps = first.steps;
  report.fsdp_groups = layout.groups[static_cast<int>(mesh::Axis::kFsdp)].processes;
  report.exchange = first.exchange;
  report.exchange_reason = first.exchange_reason;
  report.state_bytes_per_device = first.state_bytes;
  report.tokens_per_step = o.batch * o.model.length;
  report.resumed_from = run.start_step;
  report.earlier_losses = run.earlier_losses;
  if (o.capture_gradient) {
    report.gradient = local_only ? gradient : gathered_gradient(pool, gradient);
    for (const auto& leaf : leaves) report.leaves.push_back({leaf.name, leaf.offset, leaf.size});
  }
  return report;
}

}  // namespace

Result<WorkerReport> run_worker(runtime::Pool& pool, const WorkerOptions& o,
                                const std::function<void(const StepRecord&)>& progress) {
  auto planned = plan_layout(o, pool.size());
  if (!planned.ok()) return planned.error();
  return train_process(pool, planned.value(), o, progress, false);
}

Result<WorkerReport> run_one_device(runtime::Pool& pool, WorkerOptions o) {
  o.mesh.clear();
  o.devices_per_process = 1;
  o.checkpoint_dir.clear();
  o.checkpoint_every = 0;
  o.resume = Resume::kNo;
  o.cache_dir.clear();
  o.drill = Drill{};
  auto planned = plan_layout(o, 1);
  if (!planned.ok()) return planned.error();
  return train_process(pool, planned.value(), o, {}, true);
}

std::string report_json(const WorkerReport& r, const WorkerOptions& o) {
  nlohmann::json j;
  std::vector<double> losses = r.earlier_losses;
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& s : r.steps) {
    losses.push_back(s.loss);
    steps.push_back({{"step", s.step}, {"loss", s.loss}, {"seconds", s.seconds}, {"split", s.split}});
  }
  j["losses"] = losses;
  if (r.resumed_from > 0) j["resumed_from"] = r.resumed_from;
  j["fsdp_groups"] = r.fsdp_groups;
  j["mesh"] = nlohmann::json::parse(mesh::mesh_to_json(r.mesh));
  j["exchange"] = r.exchange;
  if (!r.exchange_reason.empty()) j["exchange_reason"] = r.exchange_reason;
  j["steps"] = steps;
  j["state_bytes_per_device"] = r.state_bytes_per_device;
  j["tokens_per_step"] = r.tokens_per_step;
  j["dtype"] = dtype_name(o.dtype);
  j["model"] = {{"vocab", o.model.vocab},
                {"width", o.model.width},
                {"layers", o.model.layers},
                {"heads", o.model.heads},
                {"kv_heads", o.model.kv_heads},
                {"mlp", o.model.mlp},
                {"length", o.model.length},
                {"batch", o.batch},
                {"seed", o.seed}};
  if (!r.cache_found.empty()) j["cache_found"] = r.cache_found;
  return j.dump(2) + "\n";
}

Result<Drill> parse_drill(std::string_view text) {
  static const std::pair<std::string_view, Drill::Kind> kinds[] = {
      {"loader-throws", Drill::Kind::kLoaderThrows},
      {"stall-in-step", Drill::Kind::kStallInStep},
      {"stall-before-checkpoint", Drill::Kind::kStallBeforeCheckpoint},
      {"crash-while-saving", Drill::Kind::kCrashWhileSaving}};
  const auto bad = [&] {
    return not_allowed("--drill", text,
                       "KIND@RANK:STEP with KIND loader-throws, stall-in-step, stall-before-checkpoint or "
                       "crash-while-saving, RANK a process and STEP a step from 1");
  };
  const auto at = text.find('@'), colon = text.find(':');
  if (at == std::string_view::npos || colon == std::string_view::npos || colon < at) return bad();
  Drill drill;
  bool known = false;
  for (const auto& [name, kind] : kinds) {
    if (text.substr(0, at) == name) {
      drill.kind = kind;
      known = true;
    }
  }
  const auto number = [](std::string_view digits, int& out) {
    if (digits.empty() || digits.size() > 6) return false;
    out = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return false;
      out = out * 10 + (c - '0');
    }
    return true;
  };
  if (!known || !number(text.substr(at + 1, colon - at - 1), drill.rank) ||
      !number(text.substr(colon + 1), drill.step) || drill.step < 1) {
    return bad();
  }
  return drill;
}

}  // namespace dew::train
