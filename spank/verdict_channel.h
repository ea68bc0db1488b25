// The edge of one verdict per step (the rule is StepVerdict, step_verdict.h):
// srun's listener for the nodes' failure notices, and a node's sending of
// one. Sockets and threads only; what a notice says and which is named is
// the core's.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "dew/coordinator_port.h"
#include "step_verdict.h"

namespace dew::spank {

// The record of a rank's failure for `dew launch` (dew/failure_record.h),
// beside the line for people, when the launch's tag is set (srun's
// environment, or the job's on a node): the failure's rank, exit code,
// node and time, and its line (classify_task_end's "rank R ended with ...").
void say_failure_record(const std::optional<std::string>& tag, const FailureNotice& failure);

class VerdictListener {
 public:
  VerdictListener() = default;
  ~VerdictListener();
  VerdictListener(const VerdictListener&) = delete;
  VerdictListener& operator=(const VerdictListener&) = delete;

  // srun, before the tasks' environment is taken: a TCP port the nodes
  // reach srun at (every address; a port of `range`, Slurm's SrunPortRange
  // when the site sets one, else one the kernel picks); 0 when srun cannot
  // listen (each node then names its failure itself).
  std::uint16_t listen(std::optional<PortRange> range);
  // srun, once the step exists: notices are taken and the verdict said;
  // `on_first_notice` runs on the listener's thread when the first is taken
  // (a node has ended the step).
  void start(std::uint32_t job, std::uint32_t step, std::string secret, std::function<void()> on_first_notice);
  // srun is exiting: notices already sent are taken (for at most
  // kNoticeBound), the verdict is said if it was not, the thread ends.
  void stop();

 private:
  void run(std::uint32_t job, std::uint32_t step, const std::string& secret,
           const std::function<void()>& on_first_notice);

  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::uint16_t port_ = 0;
  bool port_from_range_ = false;
  std::mutex mutex_;
  bool stopping_ = false;
  std::thread thread_;
};

// A node's slurmstepd: sends `notice` (encode_failure_notice) to srun at
// host:port and waits up to `bound` for srun's "ok". False when srun did not
// take it: the node names the failure itself.
bool send_failure_notice(const std::string& host, std::uint16_t port, const std::string& notice,
                         std::chrono::milliseconds bound);

}  // namespace dew::spank
