// `dew worker`: the design page's distribution worker. Every process of a
// pool runs it (under dew launch, srun --dew-pool, srun --mpi=pmix, or alone
// with several CPU devices); it trains the small transformer of dew/train.h
// over the layout --mesh gives, prints a line per step from process 0 and
// writes --out (the losses, the fsdp groups, the mesh) atomically.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>

#include "commands.h"
#include "dew/atomic_file.h"
#include "dew/log.h"
#include "dew/pool.h"
#include "dew/task_contract.h"
#include "dew/text.h"
#include "dew/train.h"
#include "dew/watchdog.h"

namespace dew::cli {
namespace {

struct WorkerArgs {
  train::WorkerOptions options;
  std::string dtype = "fp32";
  std::string out;
  std::string watchdog;   // empty: DEW_WATCHDOG, else 30m
  std::string cache_dir;  // empty: train::default_cache_dir(); "off": none
  bool cache_dir_given = false;
  std::string drill;
  std::string resume;  // "" (not given), "always" (--resume alone) or "auto"
};

// --dtype, --watchdog, --cache-dir and --drill into the options.
Result<Done> resolve(WorkerArgs& a) {
  if (a.dtype != "fp32" && a.dtype != "fp64") return not_allowed("--dtype", a.dtype, "fp32 or fp64");
  a.options.dtype = a.dtype == "fp64" ? train::Dtype::kFloat64 : train::Dtype::kFloat32;
  const char* inherited = std::getenv(contract::kWatchdog.name);
  auto watchdog =
      chosen_watchdog(a.watchdog, "--watchdog", inherited ? std::optional<std::string>(inherited) : std::nullopt);
  if (!watchdog.ok()) return watchdog.error();
  a.options.step_bound.reset();
  if (watchdog.value()) a.options.step_bound = *watchdog.value();
  if (a.cache_dir_given && a.cache_dir.empty()) {
    return invalid_argument("--cache-dir '' is not allowed; allowed: a directory, or off for no cache");
  }
  a.options.cache_dir = a.cache_dir == "off" ? "" : a.cache_dir.empty() ? train::default_cache_dir() : a.cache_dir;
  if (a.resume == "always" || a.resume == "auto") {
    a.options.resume = a.resume == "always" ? train::Resume::kAlways : train::Resume::kIfAny;
  } else if (!a.resume.empty()) {
    return not_allowed("--resume", a.resume,
                       "--resume alone (a complete checkpoint must be there) or --resume auto (the last complete "
                       "checkpoint if there is one, else step 1: a requeued job's next start)");
  }
  if (!a.drill.empty()) {
    auto drill = train::parse_drill(a.drill);
    if (!drill.ok()) return drill.error();
    a.options.drill = drill.value();
  }
  return Done{};
}

std::string progress_line(const train::StepRecord& s, int steps, int tokens) {
  char line[160];
  std::snprintf(line, sizeof line, "step %d/%d: loss %.6f, %.3f s, %.0f tokens/s", s.step, steps, s.loss, s.seconds,
                s.seconds > 0 ? tokens / s.seconds : 0.0);
  return line;
}

std::string groups_text(const std::vector<std::vector<int>>& groups) {
  std::string out = "[";
  for (std::size_t g = 0; g < groups.size(); ++g) out += (g ? ", [" : "[") + join(groups[g], ", ") + "]";
  return out + "]";
}

int run(WorkerArgs& a) {
  if (auto resolved = resolve(a); !resolved.ok()) return report(resolved.error(), 2);
  // Before any training: --out replaces only a regular file of its own.
  if (!a.out.empty()) {
    if (auto regular = refuse_unless_regular(a.out, "--out"); !regular.ok()) return report(regular.error(), 2);
  }
  auto joined = join_with_cpu_devices();
  if (!joined.ok()) return report(joined.error(), kJoinFailedExitCode);
  runtime::Pool& pool = joined.value();
  auto layout = train::plan_layout(a.options, pool.size());
  if (!layout.ok()) return report(layout.error(), 2);
  const int tokens = a.options.batch * a.options.model.length;
  if (pool.rank() == 0) {
    const mesh::Mesh& m = layout.value();
    log_info("mesh " + mesh::format_mesh_shape(m.shape) + " over " +
             counted(pool.size() * a.options.devices_per_process, "device") + " (" +
             counted(pool.size(), "process", "processes") + " x " + std::to_string(a.options.devices_per_process) +
             "), replicas=" + std::to_string(m.replicas) + "; fsdp groups " +
             groups_text(m.groups[static_cast<int>(mesh::Axis::kFsdp)].processes));
  }
  if (a.options.drill.kind != train::Drill::Kind::kNone && a.options.drill.rank >= pool.size()) {
    return report(
        invalid_argument("--drill " + a.drill + ": there is no process " + std::to_string(a.options.drill.rank) +
                         " in a pool of " + std::to_string(pool.size())),
        2);
  }
  auto result = train::run_worker(
      pool, a.options, [&](const train::StepRecord& s) { log_info(progress_line(s, a.options.steps, tokens)); });
  if (!result.ok()) return report(result.error());
  if (pool.rank() == 0 && !a.out.empty()) {
    if (auto written = write_file_atomically(a.out, train::report_json(result.value(), a.options)); !written.ok()) {
      return report(written.error().prefixed("--out: "));
    }
  }
  return 0;
}

}  // namespace

void add_worker_command(CLI::App& app) {
  auto a = std::make_shared<WorkerArgs>();
  train::WorkerOptions& o = a->options;
  CLI::App* command = app.add_subcommand(
      "worker",
      "Train a small transformer over this pool (every process runs it, e.g. under dew launch or srun "
      "--dew-pool): the design page's distribution worker, on CPU devices");
  command->add_option("--mesh", o.mesh,
                      "MeshSpec over every device: {\"fsdp\": 2, \"replicas\": 2} or fsdp=2,replicas=2 (axes data, "
                      "fsdp, tensor, sequence and replicas; default: data over every device)");
  command->add_option("--devices", o.devices,
                      "Fill the mesh row-major in exactly this order of the pool's devices, such as 0,4,1,5,2,6,3,7 "
                      "(no placement: an axis on the links you choose; default: placed on the fastest links)");
  command->add_option("--devices-per-process", o.devices_per_process,
                      "CPU devices per process, one thread each (default 1)");
  command->add_option("--steps", o.steps, "Training steps (default 20)");
  command->add_option("--batch", o.batch, "Sequences per step over the whole pool (default 8)");
  command->add_option("--dtype", a->dtype, "fp32 or fp64 (default fp32; fp64 for exact comparisons)");
  command->add_option("--seed", o.seed, "Seed of the model and the data (default 0)");
  command->add_option("--learning-rate", o.learning_rate, "AdamW's learning rate (default 0.003)");
  command->add_option("--out", a->out,
                      "Write the losses, fsdp groups, mesh, exchange and step times to FILE as JSON (process 0, "
                      "atomically)");
  command->add_option("--exchange", o.exchange,
                      "The sequence axis's exchange: auto (the rule's pick), all-to-all or gather (default auto)");
  command->add_option("--checkpoint-dir", o.checkpoint_dir,
                      "Save checkpoints into DIR, a directory every process shares (checked before step 1)");
  command->add_option("--checkpoint-every", o.checkpoint_every,
                      "Save every N steps and after the last (with --checkpoint-dir; default 0: never)");
  command
      ->add_option("--resume", a->resume,
                   "Continue from the last complete checkpoint in --checkpoint-dir (any layout of the same model); "
                   "--resume auto: from it if there is one, else from step 1 (a requeued job's script)")
      ->expected(0, 1)
      ->default_str("always");
  command->add_option("--watchdog", a->watchdog,
                      "Bound of one step (90s, 30m, off; default DEW_WATCHDOG, else 30m): a process stalled "
                      "outside collectives past it fails the pool, naming itself");
  command
      ->add_option("--cache-dir", a->cache_dir,
                   "Cache the tokenized dataset under the pool's compile-cache key in DIR, or off (default "
                   "$DEW_CACHE_DIR/worker, $XDG_CACHE_HOME/dew/worker or ~/.cache/dew/worker)")
      ->each([a](const std::string&) { a->cache_dir_given = true; });
  command->add_option("--drill", a->drill,
                      "A failure on purpose: KIND@RANK:STEP, KIND loader-throws, stall-in-step, "
                      "stall-before-checkpoint or crash-while-saving");
  command->add_option("--vocab", o.model.vocab, "Vocabulary (default 64)");
  command->add_option("--width", o.model.width, "Model width (default 32)");
  command->add_option("--layers", o.model.layers, "Blocks (default 2)");
  command->add_option("--heads", o.model.heads, "Query heads (default 4)");
  command->add_option("--kv-heads", o.model.kv_heads, "Key/value heads (default 2)");
  command->add_option("--mlp", o.model.mlp, "MLP hidden units (default 64)");
  command->add_option("--length", o.model.length, "Positions per sequence (default 16)");
  command->callback([a] { run_subcommand("worker", [&] { return run(*a); }); });
}

}  // namespace dew::cli
