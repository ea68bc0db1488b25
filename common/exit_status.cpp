#include "dew/exit_status.h"

#include <sys/wait.h>

#include <cstring>

namespace dew {

std::string describe_wait_status(int wait_status) {
  if (WIFEXITED(wait_status)) return "exit code " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int signal = WTERMSIG(wait_status);
    const char* name = sigabbrev_np(signal);
    return "signal " + std::to_string(signal) + (name ? " (SIG" + std::string(name) + ")" : "");
  }
  return "wait status " + std::to_string(wait_status);
}

bool is_bad_exit(int wait_status) { return !(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0); }

bool is_peer_failure(int wait_status) {
  return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == kPeerFailedExitCode;
}

int blamed_exit_code(int wait_status) {
  const int code = exit_code_of(wait_status);
  return code == 0 || is_peer_failure(wait_status) ? 1 : code;
}

int exit_code_of(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

}  // namespace dew
