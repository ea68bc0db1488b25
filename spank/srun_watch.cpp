#include "srun_watch.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

extern "C" {
#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
#include <slurm/spank.h>
}

// Provided by srun at run time (libslurmfull), declared by Slurm's own
// header; weak, as slurm_kill_job_step is (step_end.cpp).
#pragma weak slurm_get_job_steps
#pragma weak slurm_free_job_step_info_response_msg

#include "pool_plan.h"

namespace dew::spank {
namespace {

// slurmctld's record of the step, asked the way `squeue -s -j J` asks.
StepRecord look_up_step(std::uint32_t job, std::uint32_t step) {
  if (slurm_get_job_steps == nullptr || slurm_free_job_step_info_response_msg == nullptr) return StepRecord::kUnknown;
  job_step_info_response_msg_t* steps = nullptr;
  if (slurm_get_job_steps(0, job, step, &steps, SHOW_ALL) != 0) {
    // The job itself gone (purged after it ended): so is its step.
    return errno == ESLURM_INVALID_JOB_ID ? StepRecord::kGone : StepRecord::kUnknown;
  }
  const bool listed = steps != nullptr && steps->job_step_count > 0;
  slurm_free_job_step_info_response_msg(steps);
  return listed ? StepRecord::kListed : StepRecord::kGone;
}

}  // namespace

SrunWatcher::~SrunWatcher() { stop(); }

void SrunWatcher::start(std::uint32_t job, std::uint32_t step) {
  std::lock_guard lock(mutex_);
  if (thread_.joinable() || stopping_) return;
  // srun blocks its signals before loading plugins: this thread inherits
  // that, and srun's own handling sees the SIGTERM sent below.
  thread_ = std::thread([this, job, step] { run(job, step); });
}

void SrunWatcher::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SrunWatcher::run(std::uint32_t job, std::uint32_t step) {
  SrunWatch watch(job, step);
  std::unique_lock lock(mutex_);
  for (;;) {
    if (changed_.wait_for(lock, kSrunWatchEvery, [&] { return stopping_; })) return;
    lock.unlock();
    const auto line = watch.after_look(look_up_step(job, step));
    lock.lock();
    if (stopping_) return;
    if (!line) continue;
    slurm_error("dew: %s", line->c_str());
    // srun's own way out: it forwards the signal to the (ended) step, waits
    // KillWait for it and exits with the largest exit code it heard.
    kill(getpid(), SIGTERM);
    return;
  }
}

}  // namespace dew::spank
