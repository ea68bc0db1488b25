// `dew attention-check`: runs sequence-parallel attention across the pool
// this process joins (srun --dew-pool, dew launch, PMIx, or alone), checks
// both exchanges against whole-sequence attention in fp64, and times them,
// so a user learns on their own allocation that the exchanges work and which
// one is faster there. Every process runs it; process 0 prints the table.
//
// Each process owns --devices-per-process CPU devices, one thread each. The
// mesh (--mesh, default every device on the sequence axis) is laid over
// them; a device's sequence group talks over Gloo through
// make_axis_communicator (axes/), and a tensor axis splits the heads.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "attention_check.h"
#include "commands.h"
#include "dew/median.h"
#include "dew/text.h"

namespace dew::cli {
namespace {

std::string exchange_text(Exchange e) { return std::string(attention::exchange_name(e)); }

// Every process's reports folded per exchange.
struct ExchangeSummary {
  double error = 0;
  std::vector<double> slowest;  // per run, the slowest device's seconds
  std::vector<std::string> failures;
};

void fold_line(const std::string& line, std::size_t process, std::map<std::string, ExchangeSummary>& summary) {
  std::istringstream fields(line);
  std::string name, first;
  fields >> name >> first;
  ExchangeSummary& s = summary[name];
  if (first == "!") {
    std::string rest;
    std::getline(fields, rest);
    s.failures.push_back(rest.empty() ? rest : rest.substr(1));
    return;
  }
  char* end = nullptr;
  const double error = std::strtod(first.c_str(), &end);
  if (first.empty() || *end != '\0') {
    s.failures.push_back("process " + std::to_string(process) + " sent an unreadable report: '" + line + "'");
    return;
  }
  s.error = std::max(s.error, std::isnan(error) ? INFINITY : error);
  double seconds = 0;
  for (std::size_t r = 0; fields >> seconds; ++r) {
    if (s.slowest.size() <= r) s.slowest.push_back(0);
    s.slowest[r] = std::max(s.slowest[r], seconds);
  }
}

void print_table(const CheckOptions& o, const CheckSetup& s, std::map<std::string, ExchangeSummary>& summary, bool ok) {
  const int devices = s.processes * o.devices_per_process;
  std::printf(
      "attention check: %s (%s x %d), mesh %s; batch %d, heads %d/%d, length %lld, head "
      "dim %d, mask %s, fp32 against fp64\n",
      counted(devices, "device").c_str(), counted(s.processes, "process", "processes").c_str(), o.devices_per_process,
      mesh::format_mesh_spec(s.spec).c_str(), o.batch, o.heads, o.kv_heads, static_cast<long long>(o.length),
      o.head_dim, attention::format_mask_kind(s.mask).c_str());
  std::printf("rule: %s (%s)\n", exchange_text(s.plan.exchange).c_str(), s.plan.reason.c_str());
  for (const std::string& why : s.skipped) std::printf("skipped: %s\n", why.c_str());
  std::printf("\n%-11s %16s %16s  %s\n", "exchange", "forward+backward", "relative error", "");
  std::map<std::string, double> medians;
  for (const Exchange e : s.runnable) {
    const ExchangeSummary& x = summary[exchange_text(e)];
    if (!x.failures.empty()) {
      std::printf("%-11s failed: %s\n", exchange_text(e).c_str(), x.failures.front().c_str());
      continue;
    }
    medians[exchange_text(e)] = x.slowest.empty() ? NAN : median(x.slowest);
    std::printf("%-11s %14.4f s %16.2e  %s\n", exchange_text(e).c_str(), medians[exchange_text(e)], x.error,
                x.error <= o.tolerance ? "ok" : "TOO LARGE");
  }
  std::printf(
      "\ntime: the slowest device's, median of %d runs after one checked call; error: largest over out, "
      "lse, dq, dk, dv on every device (normwise), tolerance %.0e\n",
      o.runs, o.tolerance);
  if (medians.size() == 2) {
    const double a = medians["all-to-all"], g = medians["gather"];
    std::printf("faster here: %s, by %.1f %%; the rule picked %s\n", a <= g ? "all-to-all" : "gather",
                100.0 * (std::max(a, g) / std::min(a, g) - 1.0), exchange_text(s.plan.exchange).c_str());
  }
  std::printf("%s\n", ok ? "result: every exchange matches whole-sequence attention" : "result: FAILED (see above)");
}

int run(const CheckOptions& o) {
  if (o.exchanges != "both" && o.exchanges != "all-to-all" && o.exchanges != "gather" && o.exchanges != "auto") {
    return report(not_allowed("--exchange", o.exchanges, "both, auto, all-to-all, gather"));
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (auto fits = check_fits(o, static_cast<long double>(pages) * page); !fits.ok()) return report(fits.error(), 2);
  auto joined = join_with_cpu_devices();
  if (!joined.ok()) return report(joined.error(), kJoinFailedExitCode);
  runtime::Pool& pool = joined.value();
  auto setup = prepare_check(o, pool.size(), pool.rank());
  if (!setup.ok()) return report(setup.error());
  const CheckSetup& s = setup.value();

  std::map<Exchange, std::vector<Measured>> measured;
  for (const Exchange e : s.runnable) measured[e].resize(static_cast<std::size_t>(o.devices_per_process));
  std::vector<std::thread> threads;
  for (int i = 0; i < o.devices_per_process; ++i) {
    std::map<Exchange, Measured*> mine;
    for (auto& [e, devices] : measured) mine[e] = &devices[static_cast<std::size_t>(i)];
    threads.emplace_back(measure_device, std::cref(o), std::cref(s), std::ref(pool),
                         mesh::cpu_device_id(pool.rank(), o.devices_per_process, i), mine);
  }
  for (auto& t : threads) t.join();

  // Every process's devices, at process 0.
  auto all = pool.try_all_gather(serialize(measured));
  if (!all.ok()) return report(all.error());
  return print_report(o, s, all.value().strings(), pool.rank() == 0) ? 0 : 1;
}

}  // namespace

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

bool print_report(const CheckOptions& o, const CheckSetup& setup, const std::vector<std::string>& reports, bool print) {
  std::map<std::string, ExchangeSummary> summary;
  for (std::size_t process = 0; process < reports.size(); ++process) {
    std::istringstream lines(reports[process]);
    for (std::string line; std::getline(lines, line);) fold_line(line, process, summary);
  }
  bool ok = true;
  for (const auto& [name, s] : summary) ok = ok && s.failures.empty() && s.error <= o.tolerance;
  if (print) print_table(o, setup, summary, ok);
  return ok;
}

void add_attention_check_command(CLI::App& app) {
  auto o = std::make_shared<CheckOptions>();
  CLI::App* command = app.add_subcommand(
      "attention-check",
      "Run sequence-parallel attention across this pool (every process runs it, e.g. under srun --dew-pool): "
      "check both exchanges against whole-sequence attention in fp64 and time them");
  command
      ->add_option("--devices-per-process", o->devices_per_process,
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
  command->add_option("--exchange", o->exchanges, "both, auto (the rule's pick), all-to-all or gather (default both)");
  command->add_option("--runs", o->runs, "Timed runs of each exchange after the checked call (default 3)")
      ->check(CLI::Range(1, 1000));
  command->add_option("--tolerance", o->tolerance, "Largest relative error allowed (default 1e-4)")
      ->check(finite_number(0, true));
  command->add_option("--seed", o->seed, "Seed of the random inputs, the same on every process (default 1)");
  command->callback([o] { run_subcommand("attention-check", [&] { return run(*o); }); });
}

}  // namespace dew::cli
