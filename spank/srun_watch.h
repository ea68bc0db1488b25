// srun's watch over its pool step: a thread in srun that asks slurmctld
// every kSrunWatchEvery whether the step still exists, and ends srun
// (SIGTERM: srun's own way out, with the largest exit code it heard) when
// the step has ended in Slurm but srun still waits for exits that will
// never come. An edge of the plugin (it calls Slurm); when to end srun is
// SrunWatch's, in the core (pool_plan.h).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace dew::spank {

class SrunWatcher {
 public:
  SrunWatcher() = default;
  ~SrunWatcher();
  SrunWatcher(const SrunWatcher&) = delete;
  SrunWatcher& operator=(const SrunWatcher&) = delete;

  // srun, once the step exists (local_user_init).
  void start(std::uint32_t job, std::uint32_t step);
  // srun is exiting (slurm_spank_exit): the thread ends before the plugin is
  // unloaded. A look in flight is waited for (one RPC to slurmctld).
  void stop();

 private:
  void run(std::uint32_t job, std::uint32_t step);

  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dew::spank
