// `dew layout-parity`: every layout of a device count trained against one
// device, in one process or as a pool (dew launch, srun --dew-pool). A
// layout passes when its losses and step 1's gradient, leaf group by leaf
// group, are within --factor times the reference's own deviation when only
// the order of the batch's sums changes. Prints a table; exits 1 if any
// layout fails.
#include <cstdio>
#include <memory>
#include <optional>

#include "commands.h"
#include "dew/layout_parity.h"
#include "dew/log.h"
#include "dew/pool.h"
#include "dew/text.h"

namespace dew::cli {
namespace {

struct ParityArgs {
  int devices = 8;
  int steps = 3;
  std::string dtype = "fp32";
  double factor = 8;
};

std::string cell(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%-10.2e", value);
  return text;
}

std::string compact(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

void print_row(const std::string& layout, const std::string& exchange, const std::string& rest) {
  std::printf("%-44s %-11s %s\n", layout.c_str(), exchange.c_str(), rest.c_str());
  std::fflush(stdout);
}

std::string header_cells() {
  std::string text;
  for (const char* group : train::kParityGroups) {
    char name[32];
    std::snprintf(name, sizeof name, "%-10s ", group);
    text += name;
  }
  return text + "result";
}

int run(const ParityArgs& a) {
  if (a.dtype != "fp32" && a.dtype != "fp64") return report(not_allowed("--dtype", a.dtype, "fp32 or fp64"), 2);
  if (a.devices < 1 || a.steps < 1 || !(a.factor >= 1)) {
    return report(invalid_argument("--devices " + std::to_string(a.devices) + ", --steps " + std::to_string(a.steps) +
                                   " and --factor " + std::to_string(a.factor) +
                                   ": allowed: devices and steps from 1, a factor from 1"),
                  2);
  }
  // Each device is a thread with its own shards; a mesh holds at most this
  // many (issue 26: 2147483647 ended in SIGFPE).
  constexpr int kMaxParityDevices = 4096;
  if (a.devices > kMaxParityDevices) {
    return report(invalid_argument("--devices " + std::to_string(a.devices) + " is not allowed; allowed: 1 to " +
                                   std::to_string(kMaxParityDevices)),
                  2);
  }
  auto joined = join_with_cpu_devices();
  if (!joined.ok()) return report(joined.error(), kJoinFailedExitCode);
  runtime::Pool& pool = joined.value();
  if (a.devices % pool.size() != 0) {
    return report(invalid_argument("--devices " + std::to_string(a.devices) + " does not split over " +
                                   counted(pool.size(), "process", "processes") + "; allowed: a multiple of " +
                                   std::to_string(pool.size())),
                  2);
  }
  train::WorkerOptions o;
  o.devices_per_process = a.devices / pool.size();
  o.steps = a.steps;
  o.dtype = a.dtype == "fp64" ? train::Dtype::kFloat64 : train::Dtype::kFloat32;
  o.step_bound.reset();
  o.capture_gradient = true;
  std::optional<train::WorkerReport> reference, reordered;
  // Values this close are equal whatever the floor: a few units in the last place of the dtype.
  const double slack = a.dtype == "fp64" ? 1e-17 : 1e-9;
  if (pool.rank() == 0) {
    auto ref = train::run_one_device(pool, o);
    train::WorkerOptions reversed = o;
    reversed.reverse_batch = true;
    auto rev = train::run_one_device(pool, reversed);
    if (!ref.ok() || !rev.ok()) return report(ref.ok() ? rev.error() : ref.error());
    reference = std::move(ref.value());
    reordered = std::move(rev.value());
    log_info("layout-parity: " + counted(a.devices, "device") + " (" + counted(pool.size(), "process", "processes") +
             " x " + std::to_string(o.devices_per_process) + "), " + a.dtype + ", " + counted(a.steps, "step") +
             "; a layout passes within " + compact(a.factor) + " x the floor + " + compact(slack));
    print_row("layout", "exchange", header_cells());
    const auto floors = train::compare_to_reference(*reordered, *reference, *reordered, 1, 0);
    std::string row;
    for (const auto& g : floors) row += cell(g.floor) + " ";
    print_row("floor (one device, batch reversed)", "-", row);
  }
  int failed = 0, passed = 0, refused = 0;
  for (const auto& layout : train::parity_layouts(a.devices)) {
    o.mesh = layout.mesh;
    o.exchange = layout.exchange;
    auto planned = train::plan_layout(o, pool.size());
    if (!planned.ok()) {
      ++refused;
      if (pool.rank() == 0) print_row(layout.mesh, layout.exchange, "refused: " + planned.error().message);
      continue;
    }
    auto result = train::run_worker(pool, o);
    if (!result.ok()) return report(result.error());
    if (pool.rank() != 0) continue;
    std::string row;
    bool pass = true;
    for (const auto& g : train::compare_to_reference(result.value(), *reference, *reordered, a.factor, slack)) {
      row += cell(g.deviation) + " ";
      pass = pass && g.pass;
    }
    (pass ? passed : failed) += 1;
    print_row(layout.mesh, result.value().exchange == "local" ? "-" : result.value().exchange,
              row + (pass ? "pass" : "FAIL"));
  }
  if (pool.rank() == 0) {
    log_info("layout-parity: " + std::to_string(passed) + " passed, " + std::to_string(failed) + " failed, " +
             std::to_string(refused) + " refused by the rules");
  }
  return failed > 0 ? 1 : 0;
}

}  // namespace

void add_layout_parity_command(CLI::App& app) {
  auto a = std::make_shared<ParityArgs>();
  CLI::App* command = app.add_subcommand(
      "layout-parity",
      "Train every layout of --devices CPU devices (data, fsdp, tensor, sequence, replicas; both exchanges) against "
      "one device and compare losses and gradients with the reference's own floor; in one process or as a pool");
  command->add_option("--devices", a->devices, "Devices over the whole pool (default 8)");
  command->add_option("--steps", a->steps, "Steps whose losses are compared (default 3; gradients of step 1)");
  command->add_option("--dtype", a->dtype, "fp32 or fp64 (default fp32)");
  command
      ->add_option("--factor", a->factor,
                   "A layout passes within FACTOR x the floor (the one-device run with its batch reversed) "
                   "(default 8)")
      ->check(finite_number(1, false));
  command->callback([a] { run_subcommand("layout-parity", [&] { return run(*a); }); });
}

}  // namespace dew::cli
