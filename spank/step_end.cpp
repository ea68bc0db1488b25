#include "step_end.h"

#include <csignal>

extern "C" {
#include <slurm/slurm.h>
#include <slurm/slurm_version.h>
#include <slurm/spank.h>
}

// Provided by slurmstepd (and srun) at run time, declared by Slurm's own
// header; weak, so the plugin loads anywhere and checks for it before use.
// Not linking libslurm keeps the plugin independent of which libslurm a site
// installs.
#pragma weak slurm_kill_job_step

#include "pool_plan.h"

namespace dew::spank {
namespace {

// slurm_kill_job_step as the Slurm this plugin is built against declares it:
// 23.11 added `flags` (0: signal the step's tasks, as before), 25.11 takes
// the step's id as a struct. Calling 22.05's form through a newer header
// would not compile, and a hand-written declaration would compile against
// any of them and pass the wrong arguments inside slurmstepd.
int kill_job_step(std::uint32_t job, std::uint32_t step, int signal) {
  const auto signal16 = static_cast<std::uint16_t>(signal);
#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(25, 11, 0)
  slurm_step_id_t id{};  // sluid 0: unknown, the ids below name the step
  id.job_id = job;
  id.step_id = step;
  id.step_het_comp = NO_VAL;
  return slurm_kill_job_step(&id, signal16, 0);
#elif SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(23, 11, 0)
  return slurm_kill_job_step(job, step, signal16, 0);
#else
  return slurm_kill_job_step(job, step, signal16);
#endif
}

}  // namespace

StepEnder::~StepEnder() { stop(); }

void StepEnder::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    pending_.clear();
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StepEnder::end_now(std::uint32_t job, std::uint32_t step) {
  {
    std::lock_guard lock(mutex_);
    pending_.clear();  // a fallback is moot now
  }
  send(Pending{job, step, kStepEndSignal, ""});
  schedule(Clock::now() + kStepKillGrace, Pending{job, step, SIGKILL,
                                                  "ending step " + std::to_string(job) + "." + std::to_string(step) +
                                                      ": SIGKILL to the tasks still running after SIGTERM"});
}

void StepEnder::kill_later(std::uint32_t job, std::uint32_t step) {
  const auto after = std::chrono::duration_cast<std::chrono::seconds>(kSrunStepKillAfter).count();
  schedule(Clock::now() + kSrunStepKillAfter,
           Pending{job, step, SIGKILL,
                   "step " + std::to_string(job) + "." + std::to_string(step) + " still runs " + std::to_string(after) +
                       " s after a node ended it: SIGKILL to its tasks"});
}

void StepEnder::end_later(std::uint32_t job, std::uint32_t step, const std::string& why) {
  {
    std::lock_guard lock(mutex_);
    if (!pending_.empty()) return;  // already on its way
  }
  schedule(Clock::now() + kPeerGrace, Pending{job, step, kStepEndSignal, why});
}

void StepEnder::schedule(Clock::time_point at, Pending pending) {
  std::lock_guard lock(mutex_);
  if (stopping_) return;
  pending_.emplace(at, std::move(pending));
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  changed_.notify_all();
}

void StepEnder::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (stopping_) return;
    if (pending_.empty()) {
      changed_.wait(lock);
      continue;
    }
    const auto due = pending_.begin()->first;
    if (changed_.wait_until(lock, due, [&] { return stopping_; })) return;
    if (Clock::now() < due || pending_.empty() || pending_.begin()->first != due) continue;
    Pending next = std::move(pending_.begin()->second);
    pending_.erase(pending_.begin());
    lock.unlock();
    send(next);
    // A fallback's SIGTERM is followed by SIGKILL, as end_now()'s is.
    if (next.signal == kStepEndSignal) {
      schedule(Clock::now() + kStepKillGrace,
               Pending{next.job, next.step, SIGKILL,
                       "ending step " + std::to_string(next.job) + "." + std::to_string(next.step) +
                           ": SIGKILL to the tasks still running after SIGTERM"});
    }
    lock.lock();
  }
}

// An error here mostly means the step has ended already: logged, not shown.
// SIGTERM goes with SIGCONT: a stopped task acts on it only once continued
// (a rank frozen with SIGSTOP ends with SIGTERM, not 2 s later by SIGKILL).
void StepEnder::send(const Pending& pending) {
  if (!pending.why.empty()) slurm_info("dew: %s", pending.why.c_str());
  if (slurm_kill_job_step == nullptr) {
    slurm_error("dew: slurm_kill_job_step is not available in this process; cannot end step %u.%u", pending.job,
                pending.step);
    return;
  }
  if (kill_job_step(pending.job, pending.step, pending.signal) != 0) {
    slurm_info("dew: signal %d to step %u.%u not delivered (ended already?)", pending.signal, pending.job,
               pending.step);
    return;
  }
  if (pending.signal == kStepEndSignal) kill_job_step(pending.job, pending.step, SIGCONT);
}

}  // namespace dew::spank
