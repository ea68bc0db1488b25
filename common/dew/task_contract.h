// The task contract: every DEW_* variable, declared once: its name, what it
// means, what holds when it is unset, and who writes it. The plugin, `dew
// launch` (local, ssh, --slurm), the pool, `dew env`, Python and the axes
// name a variable only through these (a test fails on any other "DEW_..."
// literal in the sources); `dew env --variables` prints this table.
//
// Precedence, in one place: what a Dew launcher set for this process beats
// what the process inherited (dew launch hands its processes none of its own
// task's variables, dew/slurm_step.h is_task_identity_variable); two sources
// that disagree (Dew's rank and size beside a Slurm step's or mpirun's)
// refuse the join naming both (pool/identity.cpp); a JoinOptions field
// beats its variable.
#pragma once

#include <array>

#include "dew/export.h"

namespace dew::contract {

struct DEW_API Variable {
  const char* name;
  const char* meaning;
  const char* when_unset;
  const char* written_by;
};

// Who a process is, and where its pool meets.
inline constexpr Variable kProcessId{"DEW_PROCESS_ID", "this process's rank, 0 to DEW_PROCESS_COUNT-1",
                                     "not a Dew launcher's process: PMIx, mpirun or Slurm say, else alone",
                                     "srun --dew-pool, dew launch"};
inline constexpr Variable kProcessCount{"DEW_PROCESS_COUNT", "the pool's number of processes", "as DEW_PROCESS_ID",
                                        "srun --dew-pool, dew launch"};
inline constexpr Variable kLocalProcessId{"DEW_LOCAL_PROCESS_ID", "this process's index among its node's", "0",
                                          "srun --dew-pool, dew launch"};
inline constexpr Variable kLocalProcessCount{"DEW_LOCAL_PROCESS_COUNT", "the pool's processes on this node", "1",
                                             "srun --dew-pool, dew launch"};
inline constexpr Variable kNodeId{"DEW_NODE_ID", "this node's index in the pool (torchrun's GROUP_RANK)", "0",
                                  "srun --dew-pool"};
inline constexpr Variable kCoordinatorAddress{
    "DEW_COORDINATOR_ADDRESS", "host:port of process 0's coordination service (Dew's own port)",
    "JAX_COORDINATOR_ADDRESS; under Slurm without the plugin, rank 0's node and the port derived from the job",
    "srun --dew-pool, dew launch, you (plain srun)"};
inline constexpr Variable kFrameworkCoordinator{
    "DEW_FRAMEWORK_COORDINATOR", "host:port of the framework's coordinator (MASTER_ADDR:MASTER_PORT)",
    "process 0 picks a free port at the join", "srun --dew-pool, dew launch"};
inline constexpr Variable kPoolSecret{"DEW_POOL_SECRET", "the pool's shared secret (64 hex digits)",
                                      "MUNGE seals one under Slurm; else the join refuses",
                                      "srun --dew-pool, dew launch, you"};
inline constexpr Variable kMultiHost{"DEW_MULTI_HOST", "1: a one-task step still forms a pool of one",
                                     "0: a one-task step is alone", "srun --dew-pool --dew-multi-host"};

// The settings every launcher gives alike.
inline constexpr Variable kWatchdog{"DEW_WATCHDOG",
                                    "the step bound of StepWatchdog, dew worker and XLA's watchdog (30m, 1h30m, off)",
                                    "30m", "srun --dew-pool (--dew-watchdog, plugstack), dew launch --watchdog"};
inline constexpr Variable kAgreementPatience{"DEW_AGREEMENT_PATIENCE_SECONDS",
                                             "how long an agreement waits for the slowest process", "86400", "you"};
inline constexpr Variable kHeartbeatTimeout{"DEW_HEARTBEAT_TIMEOUT_SECONDS",
                                            "silence after which a peer counts as lost", "10", "you"};
inline constexpr Variable kFailureGrace{"DEW_FAILURE_GRACE_SECONDS",
                                        "how long a failing pool waits for each process's own word",
                                        "60 (0 in dew worker and Python)", "you"};
inline constexpr Variable kJoinTimeout{"DEW_JOIN_TIMEOUT_SECONDS", "how long the join waits for every process", "300",
                                       "you"};
inline constexpr Variable kExitBound{"DEW_EXIT_BOUND_SECONDS",
                                     "how long a process that must end may take before it is ended", "2", "you"};
inline constexpr Variable kSlowSeconds{
    "DEW_SLOW_SECONDS", "a step this much slower than the median is said (at most once a minute)", "30", "you"};
inline constexpr Variable kPaceSeconds{
    "DEW_PACE_SECONDS", "the window, in whole seconds, in which StepWatchdog compares the steps", "60", "you (tests)"};

// Between a launcher and its processes' output.
inline constexpr Variable kLinesPrefixed{"DEW_LINES_PREFIXED", "1: the launcher labels every line with the rank",
                                         "libdew labels its own lines", "dew launch"};
inline constexpr Variable kNoticeTag{"DEW_NOTICE_TAG", "the launch's tag of failure records (16 hex digits)",
                                     "no failure records are written", "dew launch"};
inline constexpr Variable kStopMark{"DEW_STOP_MARK", "a file stop_requested() creates when it stops the script",
                                    "none is created", "scripts/sbatch/python-requeue.sbatch"};
inline constexpr Variable kLogLevel{
    "DEW_LOG_LEVEL", "the least level of libdew's lines (trace, debug, info, warn, error, off)", "info", "you"};

// Where things are.
inline constexpr Variable kMungeSocket{"DEW_MUNGE_SOCKET", "munged's socket", "munged's default socket", "you"};
inline constexpr Variable kCacheDir{"DEW_CACHE_DIR", "where dew worker keeps its dataset cache (under worker/)",
                                    "$XDG_CACHE_HOME/dew, else ~/.cache/dew", "dew launch --private-dirs, you"};
inline constexpr Variable kTopologyFile{"DEW_TOPOLOGY_FILE", "a saved topology in place of this machine's",
                                        "this machine's (hwloc, NVML)", "you (tests, rehearsals)"};
inline constexpr Variable kHostId{"DEW_HOST_ID", "this process's host as dew mesh --pool groups hosts",
                                  "the machine's own name", "you (tests, rehearsals)"};
inline constexpr Variable kAcceleratorFingerprint{"DEW_ACCELERATOR_FINGERPRINT",
                                                  "the accelerators' description in compile cache keys",
                                                  "this machine's", "you (tests)"};
inline constexpr Variable kLaunchSshConfig{"DEW_LAUNCH_SSH_CONFIG", "dew launch's ssh -F file",
                                           "ssh's own configuration", "you"};

inline constexpr std::array<const Variable*, 27> kAll = {&kProcessId,
                                                         &kProcessCount,
                                                         &kLocalProcessId,
                                                         &kLocalProcessCount,
                                                         &kNodeId,
                                                         &kCoordinatorAddress,
                                                         &kFrameworkCoordinator,
                                                         &kPoolSecret,
                                                         &kMultiHost,
                                                         &kWatchdog,
                                                         &kAgreementPatience,
                                                         &kHeartbeatTimeout,
                                                         &kFailureGrace,
                                                         &kJoinTimeout,
                                                         &kExitBound,
                                                         &kSlowSeconds,
                                                         &kPaceSeconds,
                                                         &kLinesPrefixed,
                                                         &kNoticeTag,
                                                         &kStopMark,
                                                         &kLogLevel,
                                                         &kMungeSocket,
                                                         &kCacheDir,
                                                         &kTopologyFile,
                                                         &kHostId,
                                                         &kAcceleratorFingerprint,
                                                         &kLaunchSshConfig};

}  // namespace dew::contract
