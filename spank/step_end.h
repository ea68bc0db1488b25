// Ending a pool step from slurmstepd: the signals kill-on-bad-exit sends, at
// once or later, on a thread of its own so that no SPANK callback waits.
// An edge of the plugin (it calls Slurm); what to do and when is decided by
// classify_task_end() in the core (pool_plan.h).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace dew::spank {

class StepEnder {
 public:
  using Clock = std::chrono::steady_clock;
  StepEnder() = default;
  // Stops the thread without sending what is still pending: the plugin is
  // being unloaded.
  ~StepEnder();
  StepEnder(const StepEnder&) = delete;
  StepEnder& operator=(const StepEnder&) = delete;

  // Ends the step now: SIGTERM to every task, SIGKILL kStepKillGrace later.
  // Drops any fallback still pending.
  void end_now(std::uint32_t job, std::uint32_t step);
  // srun: SIGKILL to the step kSrunStepKillAfter from now, unless srun ends
  // first (stop()): a node ended the step, and srun still waits then only
  // for tasks that node's signals missed.
  void kill_later(std::uint32_t job, std::uint32_t step);
  // Ends the step after kPeerGrace unless end_now() comes first.
  void end_later(std::uint32_t job, std::uint32_t step, const std::string& why);
  // slurmstepd or srun is about to exit (every task has ended): stops
  // the thread and drops what is pending. Waiting here would hold up the
  // step's completion, and so srun's exit, for everyone; a node that still
  // runs a task (one that caught SIGTERM, a frozen rank with local peers)
  // keeps its slurmstepd, and its thread sends what is due.
  void stop();

 private:
  struct Pending {
    std::uint32_t job = 0;
    std::uint32_t step = 0;
    int signal = 0;
    std::string why;  // logged when sent
  };
  void schedule(Clock::time_point at, Pending pending);
  void run();
  static void send(const Pending& pending);

  std::mutex mutex_;
  std::condition_variable changed_;
  std::multimap<Clock::time_point, Pending> pending_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dew::spank
