// The pool's secret under MUNGE, for a pool under plain srun (no plugin, no
// DEW_POOL_SECRET): process 0 seals its fresh secret in a MUNGE credential
// that only processes of its own uid can open, one per connection (MUNGE
// refuses a credential opened twice), inside the service's challenge; a
// joining process opens it, checks who made it and for which step, and goes
// on with the usual proof of the secret. Private to pool/.
#pragma once

#include <string>
#include <string_view>

#include "dew/result.h"

namespace dew::runtime::munge_auth {

// Which munged: DEW_MUNGE_SOCKET, else MUNGE's own default socket.
struct Where {
  std::string socket;  // empty: the default
};
Where where_from_env();

// A credential holding `secret`, bound to `context` (such as "slurm step
// 42.0"), that only this process's uid can decode.
Result<std::string> seal(const Where& where, std::string_view context, std::string_view secret);

// The secret inside `credential`, once munged says it is valid, fresh and
// made by this process's uid for `context`; else an error saying which.
Result<std::string> open(const Where& where, std::string_view context, const std::string& credential);

}  // namespace dew::runtime::munge_auth
