// A pool under plain srun without DEW_POOL_SECRET: MUNGE stands for the
// secret (munge_auth.h), for join() in pool.cpp. Private to pool/.
#pragma once

#include <functional>
#include <string>

#include "munge_auth.h"
#include "pool_state.h"

namespace dew::runtime {

// "slurm step JOB.STEP" for a pool from Slurm's variables, else "" (no MUNGE).
std::string munge_context(const Pool::State& state);
// An error saying what to do when this process's munged cannot seal:
// checked on every process before it connects.
Result<Done> require_munge(const munge_auth::Where& where, const std::string& context);
// Process 0: draws `secret` and returns what seals it in each challenge.
Result<std::function<Result<std::string>()>> seal_with_munge(const Pool::State& state, std::string& secret);

}  // namespace dew::runtime
