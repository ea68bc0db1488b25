// How processes of a pool end, as the plugin, `dew launch` and the pool
// itself name it: the exit codes Dew gives, and a wait status in words.
#pragma once

#include <string>

#include "dew/export.h"

namespace dew {

// A process that ends because another process of its pool failed (EX_TEMPFAIL:
// it did nothing wrong itself). Launchers never name such a process as the
// cause of a failure when another one is there to name.
inline constexpr int kPeerFailedExitCode = 75;
// A process whose join() failed and was left uncaught (EX_UNAVAILABLE: the
// pool could not be formed: no secret, the coordinator's port taken or
// unreachable, a refusal). Its one line says why.
inline constexpr int kJoinFailedExitCode = 69;
// A process whose StepWatchdog expired (as timeout(1)).
inline constexpr int kWatchdogExitCode = 124;

// A raw wait status in words: "exit code 3", "signal 9 (SIGKILL)".
DEW_API std::string describe_wait_status(int wait_status);

// Anything but a normal exit with code 0.
DEW_API bool is_bad_exit(int wait_status);

// A normal exit with kPeerFailedExitCode.
DEW_API bool is_peer_failure(int wait_status);

// The launcher's exit code for the process its peers blamed, from how it
// ended: its own failure code, never 0 (it left while the others waited for
// it) nor kPeerFailedExitCode (which says "not me"): those become 1.
DEW_API int blamed_exit_code(int wait_status);

// The code a shell would report for it: the exit code, or 128 + signal.
DEW_API int exit_code_of(int wait_status);

}  // namespace dew
