// spank_dew.so: the SPANK edge. It gathers inputs from Slurm, calls the pure
// core (pool_plan.h) and applies what it returns. Nothing here decides
// anything the core could decide, and no exception crosses into Slurm.
//
// Where each callback runs (see spank(8)):
//   slurm_spank_init             srun, sbatch/salloc, slurmstepd: read plugstack.conf args, register options
//   option callbacks             srun/sbatch (validate), slurmstepd (the values srun carried)
//   slurm_spank_init_post_opt    srun, sbatch/salloc: refuse a Dew step if plugstack.conf is bad, check the
//                                options against each other; srun: draw the step's pool secret, listen
//                                for the nodes' failure notices;
//                                slurmstepd: log a bad plugstack.conf, once per node and step
//   slurm_spank_task_init        slurmstepd, per task, before exec: refuse a Dew step if plugstack.conf is bad;
//                                the task's environment
//   slurm_spank_task_exit        slurmstepd, per task: kill-on-bad-exit; the node's failure notice to srun
//   slurm_spank_local_user_init  srun, once the step exists: process 0's node address; srun's watch and
//                                its listener for the nodes' failure notices start
//   slurm_spank_exit             slurmstepd: the step ender's thread stops; srun: the step's verdict is
//                                said, its watch stops
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

extern "C" {
#include <slurm/slurm_version.h>
#include <slurm/spank.h>

// The SPANK loader looks these up by name: they must have C linkage, which a
// C++ namespace-scope const would not get by itself.
extern const char plugin_name[] = "dew";
extern const char plugin_type[] = "spank";
extern const unsigned int plugin_version = SLURM_VERSION_NUMBER;
extern const unsigned int spank_plugin_version = 0;
}

#include "dew/exit_status.h"
#include "dew/failure_record.h"
#include "dew/slurm_step.h"
#include "dew/text.h"
#include "node_lookup.h"
#include "pool_plan.h"
#include "srun_side.h"
#include "srun_watch.h"
#include "step_end.h"
#include "step_verdict.h"
#include "verdict_channel.h"

namespace dew::spank {
namespace {

// Steps Slurm runs for itself (batch script, extern, interactive): never pools.
constexpr std::uint32_t kFirstSpecialStep = 0xfffffff0u;

PlugstackConfig g_config;
// A plugstack.conf line that does not parse: kept, not fatal, so that steps
// that never ask for Dew still run; judge_plugstack_fault() refuses the
// others once their options are known.
std::optional<Error> g_config_error;
PoolOptions g_options;
// Per slurmstepd (one node's tasks of one step): whether this node has
// ended the step or seen it end, and what ends it.
bool g_step_ending = false;
StepEnder g_step_ender;
// Per srun of a pool step: ends srun when Slurm has ended the step but
// some tasks' exits never reached srun (srun_watch.h).
SrunWatcher g_srun_watcher;
// Per srun of a pool step: the nodes' failure notices, named once.
VerdictListener g_verdict_listener;

void report(const Error& error) { slurm_error("dew: %s", error.message.c_str()); }

// Runs one SPANK callback body; exceptions become one error line and -1.
template <typename Body>
int guarded(const char* where, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    slurm_error("dew: %s: %s", where, e.what());
  } catch (...) {
    slurm_error("dew: %s: unknown error", where);
  }
  return -1;
}

// ------------------------------------------------------------- options ---

enum OptionId : int {
  kPool = 1,
  kDevicesPerProcess,
  kPort,
  kCoordinator,
  kMultiHost,
  kWatchdog,
  kKillOnBadExit,
};

template <typename T>
int store(Result<T> parsed, auto& slot) {
  if (!parsed.ok()) {
    report(parsed.error());
    return -1;
  }
  slot = std::move(parsed.value());
  return 0;
}

// The option's name for note_option and its errors.
const char* option_name(int id) {
  switch (id) {
    case kPool:
      return "--dew-pool";
    case kMultiHost:
      return "--dew-multi-host";
    case kDevicesPerProcess:
      return "--dew-devices-per-process";
    case kPort:
      return "--dew-port";
    case kCoordinator:
      return "--dew-coordinator";
    case kWatchdog:
      return "--dew-watchdog";
    case kKillOnBadExit:
      return "--dew-kill-on-bad-exit";
    default:
      return "--dew-?";
  }
}

SeenOptions g_seen_options;

// The --dew-* options this step (or job) was given: none, it did not ask for Dew.
std::vector<std::string> dew_options_given() {
  std::vector<std::string> names;
  for (const auto& [option, value] : g_seen_options) names.push_back(option);
  return names;
}

int on_option(int id, const char* optarg, int /*remote*/) {
  return guarded("option", [&] {
    // Flags arrive with optarg NULL, and in slurmstepd sometimes twice.
    const bool flag = id == kPool || id == kMultiHost;
    const std::string_view value = optarg && !flag ? optarg : "";
    if (auto once = note_option(g_seen_options, option_name(id), value); !once.ok()) {
      report(once.error());
      return -1;
    }
    switch (id) {
      case kPool:
        g_options.pool = true;
        return 0;
      case kMultiHost:
        g_options.multi_host = true;
        return 0;
      case kDevicesPerProcess:
        return store(parse_devices_per_process_choice(value, "--dew-devices-per-process"),
                     g_options.devices_per_process);
      case kPort:
        return store(parse_port(value, "--dew-port"), g_options.port);
      case kCoordinator:
        return store(parse_coordinator_host(value, "--dew-coordinator"), g_options.coordinator);
      case kWatchdog:
        return store(parse_watchdog(value, "--dew-watchdog"), g_options.watchdog);
      case kKillOnBadExit:
        return store(parse_yes_no(value, "--dew-kill-on-bad-exit"), g_options.kill_on_bad_exit);
      default:
        return -1;
    }
  });
}

char* text(const char* literal) { return const_cast<char*>(literal); }

// Usage strings show in `srun --help`: keep them true.
spank_option g_option_table[] = {
    {text("dew-pool"), nullptr,
     text("Form a Dew process pool: give every task its rank, the process count, a coordinator "
          "address and per-task GPUs."),
     0, kPool, on_option},
    {text("dew-devices-per-process"), text("N|off"),
     text("GPUs per task: local task L takes the step's GPUs [L*N, (L+1)*N) (default: plugstack "
          "devices_per_process for steps with GPUs, else an even share of the node's GPUs when it runs several "
          "tasks, more tasks than GPUs refused; off: every task sees all; Slurm's own "
          "--gpus-per-task/--gpu-bind binding is kept)."),
     1, kDevicesPerProcess, on_option},
    {text("dew-port"), text("PORT"),
     text("Coordinator port (1024-65535; default: derived from job and step id in the admin's "
          "port_range)."),
     1, kPort, on_option},
    {text("dew-coordinator"), text("HOST"),
     text("Host name by which the other nodes reach the node of rank 0 (default: first node of "
          "the step)."),
     1, kCoordinator, on_option},
    {text("dew-multi-host"), nullptr, text("Form a pool even with a single task."), 0, kMultiHost, on_option},
    {text("dew-watchdog"), text("DURATION|off"),
     text("XLA execution watchdog appended to XLA_FLAGS, e.g. 30m, 1h30m (default: plugstack "
          "watchdog, 30m)."),
     1, kWatchdog, on_option},
    {text("dew-kill-on-bad-exit"), text("yes|no"),
     text("End the whole step when any task exits non-zero or by a signal (default: plugstack "
          "kill_on_bad_exit, yes)."),
     1, kKillOnBadExit, on_option},
};

// ------------------------------------------------------- slurmstepd side ---

std::optional<std::string> task_getenv(spank_t sp, const char* name) {
  std::vector<char> buffer(256);
  for (;;) {
    const auto rc = spank_getenv(sp, name, buffer.data(), static_cast<int>(buffer.size()));
    if (rc == ESPANK_SUCCESS) return std::string(buffer.data());
    if (rc != ESPANK_NOSPACE || buffer.size() >= (1u << 20)) return std::nullopt;
    buffer.resize(buffer.size() * 4);
  }
}

template <typename T>
bool get_item(spank_t sp, spank_item_t item, T& out) {
  return spank_get_item(sp, item, &out) == ESPANK_SUCCESS;
}

Result<TaskFacts> gather_task_facts(spank_t sp) {
  TaskFacts facts;
  int local_task = 0;
  const bool items = get_item(sp, S_JOB_ID, facts.job_id) && get_item(sp, S_JOB_STEPID, facts.step_id) &&
                     get_item(sp, S_TASK_GLOBAL_ID, facts.global_task) &&
                     get_item(sp, S_JOB_TOTAL_TASK_COUNT, facts.task_count) && get_item(sp, S_TASK_ID, local_task) &&
                     get_item(sp, S_JOB_LOCAL_TASK_COUNT, facts.local_task_count) &&
                     get_item(sp, S_JOB_NODEID, facts.node_id);
  if (!items || local_task < 0) return internal_error("slurmstepd did not give the task's ids");
  facts.local_task = static_cast<std::uint32_t>(local_task);
  facts.step_nodelist = task_getenv(sp, "SLURM_STEP_NODELIST");
  facts.distribution = task_getenv(sp, "SLURM_DISTRIBUTION");
  facts.visible_devices = task_getenv(sp, "CUDA_VISIBLE_DEVICES");
  facts.tres_bind = task_getenv(sp, "SLURMD_TRES_BIND");
  facts.gpus_per_task = task_getenv(sp, "SLURM_GPUS_PER_TASK");
  facts.xla_flags = task_getenv(sp, "XLA_FLAGS");
  return facts;
}

bool special_step(spank_t sp) {
  std::uint32_t step = 0;
  return !get_item(sp, S_JOB_STEPID, step) || step >= kFirstSpecialStep;
}

// What a step on this node asked for: a step Slurm runs for itself (a batch
// script, even of an `sbatch --dew-pool` job) forms no pool and runs.
std::vector<std::string> step_dew_options(spank_t sp) {
  return special_step(sp) ? std::vector<std::string>() : dew_options_given();
}

// Says a verdict's line where judge_plugstack_fault() sends it; `sp` names
// the node in a task's line. True when the step is refused.
bool apply(const FaultVerdict& verdict, spank_t sp = nullptr) {
  const char* line = verdict.line.c_str();
  switch (verdict.line_to) {
    case FaultLineTo::kNowhere:
      break;
    case FaultLineTo::kDebug:
      slurm_debug("dew: %s", line);
      break;
    case FaultLineTo::kInfo:
      slurm_info("dew: %s", line);
      break;
    case FaultLineTo::kError:
      slurm_error("dew: %s", line);
      break;
    case FaultLineTo::kTaskStderr: {
      // Straight to the task's stderr, which srun prints: slurm_error here
      // would also put it in slurmd's log once per task.
      const auto node = sp ? task_getenv(sp, "SLURMD_NODENAME") : std::nullopt;
      const std::string text = "error: dew: " + (node ? *node + ": " : std::string()) + verdict.line + "\n";
      const auto written = write(STDERR_FILENO, text.data(), text.size());
      static_cast<void>(written);  // nothing else to tell: the refusal stands
      break;
    }
  }
  return verdict.refuse;
}

// srun's lookup (below), for the node that runs process 0 in this step.
void take_rank0_address(TaskFacts& facts, const std::optional<std::string>& carried) {
  if (!carried) return;
  const auto equals = carried->find('=');
  auto node = rank0_node(facts.step_nodelist, facts.distribution);
  if (equals == std::string::npos || !node.ok() || carried->substr(0, equals) != node.value()) return;
  facts.rank0_name_resolves = false;
  if (equals + 1 < carried->size()) facts.rank0_node_address = carried->substr(equals + 1);
}

int task_init(spank_t sp) {
  auto secret = task_getenv(sp, kSecretCarrier);
  spank_unsetenv(sp, kSecretCarrier);  // never left in a task: it reads DEW_POOL_SECRET
  auto rank0_address = task_getenv(sp, kRank0AddressCarrier);
  spank_unsetenv(sp, kRank0AddressCarrier);
  spank_unsetenv(sp, kVerdictPortCarrier);  // slurmstepd's, not the task's
  // Defence in depth: srun read a good plugstack.conf, this node a bad one.
  int local_task = 0;
  const bool first_task = get_item(sp, S_TASK_ID, local_task) && local_task == 0;
  if (apply(judge_plugstack_fault(FaultSite::kNodeTask, g_config_error, step_dew_options(sp), first_task), sp)) {
    return -1;
  }
  if (!g_options.pool || special_step(sp) || g_config_error) return 0;
  auto facts = gather_task_facts(sp);
  if (!facts.ok()) return report(facts.error()), -1;
  facts.value().pool_secret = std::move(secret);
  take_rank0_address(facts.value(), rank0_address);
  auto plan = plan_task_environment(facts.value(), g_options, g_config);
  if (!plan.ok()) {
    slurm_error("dew: rank %u: %s", facts.value().global_task, plan.error().message.c_str());
    return -1;
  }
  for (const auto& [name, value] : plan.value().set) {
    if (spank_setenv(sp, name.c_str(), value.c_str(), 1) != ESPANK_SUCCESS) {
      slurm_error("dew: rank %u: cannot set %s", facts.value().global_task, name.c_str());
      return -1;
    }
  }
  for (const auto& name : plan.value().unset) spank_unsetenv(sp, name.c_str());
  for (const auto& note : plan.value().notes) slurm_debug("dew: %s", note.c_str());
  return 0;
}

// This node's word of a rank's failure, as srun's notice and a record say it.
FailureNotice failure_seen(spank_t sp, std::uint32_t rank, int wait_status, const std::string& line) {
  FailureNotice notice;
  notice.rank = rank;
  notice.exit_code = exit_code_of(wait_status);
  notice.ended_at_us = failure_seen_now_us();
  notice.node = task_getenv(sp, "SLURMD_NODENAME").value_or("?");
  notice.line = line;
  return notice;
}

// This node's failure notice to srun (step_verdict.h); false when srun gave
// no port or did not take it.
bool tell_srun(spank_t sp, const FailureNotice& notice, std::uint32_t job, std::uint32_t step) {
  const auto host = task_getenv(sp, "SLURM_SRUN_COMM_HOST");
  const auto port = task_getenv(sp, kVerdictPortCarrier);
  const auto secret = task_getenv(sp, kSecretCarrier);
  const auto port_number = port ? parse_whole<std::uint16_t>(*port) : std::nullopt;
  if (!host || !port_number || !secret) return false;
  return send_failure_notice(*host, *port_number, encode_failure_notice(notice, job, step, *secret), kNoticeBound);
}

int task_exit(spank_t sp) {
  // (A bad plugstack.conf: a pool step's tasks were refused before exec.)
  if (!g_options.pool || special_step(sp) || g_config_error) return 0;
  if (!g_options.kill_on_bad_exit.value_or(g_config.kill_on_bad_exit)) return 0;
  int status = 0;
  std::uint32_t rank = 0, job = 0, step = 0;
  if (!get_item(sp, S_TASK_EXIT_STATUS, status) || !get_item(sp, S_TASK_GLOBAL_ID, rank) ||
      !get_item(sp, S_JOB_ID, job) || !get_item(sp, S_JOB_STEPID, step)) {
    return 0;
  }
  const auto end = classify_task_end(status, rank, job, step, g_step_ending);
  switch (end.kind) {
    case TaskEnd::kClean:
      return 0;
    case TaskEnd::kStepEnding:
      g_step_ending = true;
      slurm_info("dew: %s", end.line.c_str());
      return 0;
    case TaskEnd::kPeerFailed:
      slurm_info("dew: %s", end.line.c_str());
      if (!g_step_ending) g_step_ender.end_later(job, step, end.line);
      return 0;
    case TaskEnd::kFailed:
      break;
  }
  // One notice and one end of the step per node: the first failure here.
  // srun names the step's first failure over every node; a node srun does
  // not answer names its own.
  if (g_step_ending) return 0;
  g_step_ending = true;
  const FailureNotice failure = failure_seen(sp, rank, status, end.line);
  if (tell_srun(sp, failure, job, step)) {
    slurm_info("dew: %s (said to srun)", end.line.c_str());
  } else {
    slurm_error("dew: %s", end.line.c_str());
    say_failure_record(task_getenv(sp, kNoticeTagVariable), failure);
    // The line's way to srun has no acknowledgement: kNodeLinePause.
    usleep(static_cast<useconds_t>(std::chrono::microseconds(kNodeLinePause).count()));
  }
  g_step_ender.end_now(job, step);
  return 0;
}

}  // namespace
}  // namespace dew::spank

using namespace dew::spank;

extern "C" {

int slurm_spank_init(spank_t sp, int ac, char** av) {
  return guarded("init", [&] {
    const auto context = spank_context();
    if (context != S_CTX_LOCAL && context != S_CTX_REMOTE && context != S_CTX_ALLOCATOR) return 0;
    // A bad line fails nothing here: failing init would fail every srun,
    // and every step on the nodes, Dew or not (init_post_opt judges it).
    auto config = parse_plugstack_args(std::vector<std::string>(av, av + ac));
    if (config.ok()) {
      g_config = config.value();
    } else {
      g_config_error = config.error();
    }
    for (auto& option : g_option_table) {
      if (spank_option_register(sp, &option) != ESPANK_SUCCESS) {
        slurm_error("dew: cannot register --%s", option.name);
        return -1;
      }
    }
    return 0;
  });
}

int slurm_spank_init_post_opt(spank_t sp, int, char**) {
  return guarded("init_post_opt", [&] {
    const auto context = spank_context();
    // slurmstepd: once per node and step, the line for slurmd's log; the
    // tasks of a Dew step are refused in task_init, whose lines reach srun.
    if (context == S_CTX_REMOTE)
      return apply(judge_plugstack_fault(FaultSite::kNodeStep, g_config_error, step_dew_options(sp))) ? -1 : 0;
    if (context != S_CTX_LOCAL && context != S_CTX_ALLOCATOR) return 0;
    // Before anything is allocated or run, and once, whatever options were given.
    const auto site = context == S_CTX_LOCAL ? FaultSite::kSrun : FaultSite::kAllocator;
    if (apply(judge_plugstack_fault(site, g_config_error, dew_options_given()))) return -1;
    if (g_config_error) return 0;  // a step without --dew-* options: nothing to check or draw
    auto checked = check_pool_options(g_options);
    if (!checked.ok()) return report(checked.error()), -1;
    // Drawn here, not in local_user_init: with --export=NONE srun has taken
    // its copy of the environment for the tasks by then.
    if (context != S_CTX_LOCAL || !g_options.pool) return 0;
    if (draw_pool_secret() != 0) return -1;
    return g_options.kill_on_bad_exit.value_or(g_config.kill_on_bad_exit) ? listen_for_notices(g_verdict_listener) : 0;
  });
}

// srun, once the step exists (its nodes known, SLURM_NODELIST) and before
// the tasks' environment is taken from srun's.
int slurm_spank_local_user_init(spank_t sp, int, char**) {
  return guarded("local_user_init", [&] {
    if (spank_context() != S_CTX_LOCAL || !g_options.pool) return 0;
    std::uint32_t job = 0, step = 0;
    if (!get_item(sp, S_JOB_ID, job) || !get_item(sp, S_JOB_STEPID, step)) return 0;
    // Every node that ends a pool step tells srun, one task or many.
    // srun outlives every task: it ends the step again for any a node's
    // signals missed (kSrunStepKillAfter).
    if (const char* secret = std::getenv(kSecretCarrier)) {
      g_verdict_listener.start(job, step, secret, [job, step] { g_step_ender.kill_later(job, step); });
    }
    // A step that forms no pool has nothing to look up or watch.
    std::uint32_t tasks = 0;
    if (spank_get_item(sp, S_JOB_TOTAL_TASK_COUNT, &tasks) == ESPANK_SUCCESS && !forms_pool(tasks, g_options)) {
      return 0;
    }
    g_srun_watcher.start(job, step);
    return g_options.coordinator ? 0 : look_up_rank0_node();
  });
}

int slurm_spank_task_init(spank_t sp, int, char**) {
  return guarded("task_init", [&] { return task_init(sp); });
}

int slurm_spank_task_exit(spank_t sp, int, char**) {
  return guarded("task_exit", [&] { return task_exit(sp); });
}

// slurmstepd, once every task of this node has ended: the step ender's
// thread stops before the plugin is unloaded.
int slurm_spank_exit(spank_t, int, char**) {
  return guarded("exit", [&] {
    if (spank_context() == S_CTX_REMOTE) g_step_ender.stop();
    if (spank_context() == S_CTX_LOCAL) {
      g_verdict_listener.stop();
      g_srun_watcher.stop();
      g_step_ender.stop();
    }
    return 0;
  });
}

}  // extern "C"
