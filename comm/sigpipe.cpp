#include "sigpipe.h"

#include <pthread.h>

#include <cerrno>
#include <ctime>

namespace dew::comm {
namespace {

sigset_t only_sigpipe() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  return set;
}

bool sigpipe_pending() {
  sigset_t pending;
  sigemptyset(&pending);
  return sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
}

}  // namespace

NoSigpipe::NoSigpipe() {
  const sigset_t set = only_sigpipe();
  pthread_sigmask(SIG_BLOCK, &set, &previous_);
  // One already pending (sent to the process from outside) is not ours.
  was_pending_ = sigpipe_pending();
}

NoSigpipe::~NoSigpipe() {
  if (!was_pending_ && sigpipe_pending()) {
    const sigset_t set = only_sigpipe();
    const timespec now{0, 0};
    while (sigtimedwait(&set, nullptr, &now) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

}  // namespace dew::comm
