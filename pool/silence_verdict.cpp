#include "silence_verdict.h"

namespace dew::runtime {

bool lost_for_silence(const SilenceFacts& facts) {
  if (facts.since_heard <= facts.timeout) return false;
  if (facts.since_last_look > 2 * facts.look_interval) return false;  // the watcher's own pause
  return facts.bytes_unread == 0;
}

std::chrono::steady_clock::duration handshake_silence_bound(std::chrono::milliseconds heartbeat_timeout,
                                                            int pool_size) {
  return heartbeat_timeout + std::chrono::milliseconds(10) * (pool_size > 0 ? pool_size : 1);
}

}  // namespace dew::runtime
