// Whether a peer counts as lost for its silence (pure): the one rule the
// service (about each process) and every process (about the service) apply
// at each heartbeat look. Private to pool/.
#pragma once

#include <chrono>
#include <cstddef>

namespace dew::runtime {

struct SilenceFacts {
  std::chrono::steady_clock::duration since_heard;      // since the peer's bytes were last taken
  std::chrono::steady_clock::duration since_last_look;  // since the watcher's previous look
  std::chrono::steady_clock::duration look_interval;    // how often the watcher means to look
  std::chrono::steady_clock::duration timeout;          // the heartbeat timeout
  std::size_t bytes_unread = 0;                         // the peer's bytes in the socket, not taken yet
};

// Lost only when nothing was heard for the timeout, judged by a watcher that
// ran on time, with nothing from the peer waiting unread. A watcher that was
// itself stopped or starved (its look over two intervals late: a loaded
// machine, 1,024 processes on two cores) first lets its reader take what
// arrived meanwhile and judges at its next look; bytes in the socket mean
// the peer spoke and this process has not read it yet.
bool lost_for_silence(const SilenceFacts& facts);

// How long a joining process waits for process 0's service to answer its
// hello before it counts process 0 as stopped: the heartbeat timeout, and
// 10 ms more for each process of the pool. The service answers the hellos
// one at a time on one thread; 1,024 processes joining on a loaded machine
// (two cores, a load of 400) kept some waiting over 10 s for a service
// that was only busy.
std::chrono::steady_clock::duration handshake_silence_bound(std::chrono::milliseconds heartbeat_timeout, int pool_size);

}  // namespace dew::runtime
