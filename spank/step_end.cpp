#include "step_end.h"

#include <csignal>

extern "C" {
#include <slurm/spank.h>

// Provided by slurmstepd (and srun) at run time; weak so the plugin loads
// anywhere and checks for it before use. Not linking libslurm keeps the
// plugin independent of which libslurm a site installs.
int slurm_kill_job_step(uint32_t job_id, uint32_t step_id, uint16_t signal) __attribute__((weak));
}

#include "pool_plan.h"

namespace dew::spank {

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
  if (slurm_kill_job_step(pending.job, pending.step, static_cast<std::uint16_t>(pending.signal)) != 0) {
    slurm_info("dew: signal %d to step %u.%u not delivered (ended already?)", pending.signal, pending.job,
               pending.step);
    return;
  }
  if (pending.signal == kStepEndSignal) slurm_kill_job_step(pending.job, pending.step, SIGCONT);
}

}  // namespace dew::spank
