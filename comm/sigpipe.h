// Gloo writes to its sockets with writev, which raises SIGPIPE when a peer
// has closed; SIGPIPE's default action kills the whole process, so a rank
// that fails (or whose peer failed) would end "killed by SIGPIPE" instead of
// with its own exit code. A library must not change the process's signal
// dispositions, so SIGPIPE is blocked in the threads that write instead:
// while a thread runs Gloo code (NoSigpipe), and for good in the threads
// Gloo starts (they inherit the blocked mask from the thread that creates
// the device). A SIGPIPE raised while blocked stays pending on its thread;
// NoSigpipe takes it back before it unblocks, so it is never delivered.
#pragma once

#include <signal.h>

namespace dew::comm {

class NoSigpipe {
 public:
  NoSigpipe();
  ~NoSigpipe();
  NoSigpipe(const NoSigpipe&) = delete;
  NoSigpipe& operator=(const NoSigpipe&) = delete;

 private:
  sigset_t previous_;
  bool was_pending_ = false;
};

}  // namespace dew::comm
