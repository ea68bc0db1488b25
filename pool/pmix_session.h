// The PMIx client: identity, all-gathers over fences, abort. Private to
// pool/; the only file that includes <pmix.h> is pmix_session.cpp.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dew/pool.h"
#include "dew/result.h"

namespace dew::runtime {

struct PmixIdentity {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int node = 0;
  std::string hostname;  // empty when the server does not say
  std::string nspace;
};

class PmixSession {
 public:
  static Result<std::unique_ptr<PmixSession>> init();
  ~PmixSession();  // PMIx_Finalize
  const PmixIdentity& identity() const;
  // Copies rank, size, local rank and size, node and hostname into `id`.
  void fill(Identity& id) const;
  // Put/Commit/Fence(PMIX_COLLECT_DATA, PMIX_TIMEOUT) under a key fresh for
  // each round, then everybody's value in rank order.
  Result<std::vector<std::string>> all_gather(const std::string& bytes, std::chrono::milliseconds timeout);
  // Process 0 posts `bytes` under `key`; every other process waits for them,
  // at most `timeout` (a direct fetch from process 0, no fence: a process
  // that never comes does not hold the others, who go on to the
  // coordination service, which can say who is missing).
  Result<std::string> from_process_zero(const std::string& key, const std::string& bytes,
                                        std::chrono::milliseconds timeout);
  // Asks the PMIx server (Slurm, prterun) to end every process of the job.
  void abort(int code, const std::string& message);

 private:
  PmixSession() = default;
  PmixIdentity identity_;
  unsigned round_ = 0;
};

}  // namespace dew::runtime
