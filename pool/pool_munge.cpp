// MUNGE standing for the pool's secret under plain srun (pool_munge.h).
#include "pool_munge.h"

#include <cstdlib>

#include "dew/hex.h"
#include "dew/text.h"

namespace dew::runtime {

// A pool under plain srun without DEW_POOL_SECRET: MUNGE stands for it
// (munge_auth.h), bound to the step. Empty when it cannot.
std::string munge_context(const Pool::State& state) {
  if (state.identity.source != PoolSource::kSlurm) return "";
  const char* job = std::getenv("SLURM_JOB_ID");
  const char* step = std::getenv("SLURM_STEP_ID");
  if (!job || !step) return "";
  return std::string("slurm step ") + job + "." + step;
}

// Plain srun, no secret: every process needs munged (process 0 seals with
// it, the others open with it). Checked at once on every process, so a
// cluster without munged says so everywhere before anyone waits (the others
// retried connecting to a process 0 that had failed for 300 s).
Result<Done> require_munge(const munge_auth::Where& where, const std::string& context) {
  auto probe = munge_auth::seal(where, context, "probe");
  if (!probe.ok()) {
    return Error{probe.error().code, "DEW_POOL_SECRET is not set and " + probe.error().message +
                                         ": run munged (MUNGE), use srun --dew-pool, or export the same "
                                         "DEW_POOL_SECRET (64 hex digits) to every process"};
  }
  return Done{};
}

// Process 0 draws the secret and seals it with MUNGE in every challenge; the
// others open it.
Result<std::function<Result<std::string>()>> seal_with_munge(const Pool::State& state, std::string& secret) {
  auto fresh = random_hex(32);
  if (!fresh.ok()) return fresh.error();
  secret = fresh.value();
  const auto where = munge_auth::where_from_env();
  const std::string context = munge_context(state);
  return std::function<Result<std::string>()>(
      [where, context, secret] { return munge_auth::seal(where, context, secret); });
}

}  // namespace dew::runtime
