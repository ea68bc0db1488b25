// The task contract as a script sees it after dew.prepare_process(), the
// same under every launcher: pool_script.py's "contract" lines (one per
// process), checked against the pool's shape. Shared by the Slurm and
// local launchers' test (task_contract_test.cpp) and the ssh one.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "process.h"
#include "srun_output.h"

namespace dew::testing {

// What the process of local rank L should see of its node's GPUs: Dew's
// launchers give each an even share (4 GPUs, 2 processes: "0,1" and "2,3",
// each numbered 0,1 for JAX); nullopt for a launcher Dew did not start the
// processes with, whose GPUs stay as that launcher gave them (`given`).
struct GpuContract {
  std::optional<std::vector<std::string>> shares;
  std::optional<std::string> given;
};

// The contracts a run printed, by rank. Each is read from its "CONTRACT {"
// to the last "}" before the next one, not line by line: a line may carry a
// launcher's "[rank] " or "rank: " label in front, and mpirun forwards its
// processes' output in pieces, so one process's line can end glued to
// another's ("...}}CONTRACT {...", seen in a clean-clone CI run).
inline std::map<int, nlohmann::json> contract_lines(const std::string& out) {
  std::map<int, nlohmann::json> by_rank;
  const std::string marker = "CONTRACT {";
  for (auto at = out.find(marker); at != std::string::npos;) {
    const auto next = out.find(marker, at + marker.size());
    const std::string piece = out.substr(at + marker.size() - 1,
                                         next == std::string::npos ? std::string::npos : next - at - marker.size() + 1);
    const auto close = piece.rfind('}');
    at = next;
    if (close == std::string::npos) continue;
    const auto contract = nlohmann::json::parse(piece.substr(0, close + 1), nullptr, false);
    if (contract.is_discarded() || !contract.contains("rank")) continue;
    by_rank[contract["rank"].get<int>()] = contract;
  }
  return by_rank;
}

inline std::string env_of(const nlohmann::json& contract, const char* name) {
  const auto& value = contract["env"][name];
  return value.is_null() ? "(unset)" : value.get<std::string>();
}

// Every process of `hosts` x `per_host` (ranks in blocks per host) sees the
// same contract: rank, count, local rank, one coordinator that is the
// framework's (MASTER_ADDR:MASTER_PORT), torch's variables agreeing, the
// watchdog's default (30 min, in StepWatchdog and XLA_FLAGS) and its GPUs.
inline void expect_task_contract(const RunResult& r, int hosts, int per_host, const GpuContract& gpus) {
  const int count = hosts * per_host;
  const auto by_rank = contract_lines(r.out);
  ASSERT_EQ(static_cast<int>(by_rank.size()), count) << describe(r);
  std::optional<std::string> coordinator;
  for (const auto& [rank, c] : by_rank) {
    SCOPED_TRACE("rank " + std::to_string(rank) + ": " + c.dump());
    const int local = rank % per_host;
    EXPECT_EQ(c["size"], count);
    EXPECT_EQ(c["local_rank"], local);
    EXPECT_EQ(c["local_size"], per_host);
    const std::string framework = env_of(c, "MASTER_ADDR") + ":" + env_of(c, "MASTER_PORT");
    EXPECT_EQ(c["coordinator"], framework);
    if (!coordinator) coordinator = c["coordinator"].get<std::string>();
    EXPECT_EQ(c["coordinator"], *coordinator) << "one coordinator for the whole pool";
    EXPECT_EQ(env_of(c, "RANK"), std::to_string(rank));
    EXPECT_EQ(env_of(c, "WORLD_SIZE"), std::to_string(count));
    EXPECT_EQ(env_of(c, "LOCAL_RANK"), std::to_string(local));
    EXPECT_EQ(env_of(c, "LOCAL_WORLD_SIZE"), std::to_string(per_host));
    EXPECT_EQ(c["watchdog"], 1800.0);
    EXPECT_NE(env_of(c, "XLA_FLAGS").find("--xla_gpu_execution_terminate_timeout=30m"), std::string::npos);
    if (gpus.shares) {
      EXPECT_EQ(env_of(c, "CUDA_VISIBLE_DEVICES"), (*gpus.shares)[static_cast<std::size_t>(local)]);
      EXPECT_EQ(env_of(c, "JAX_LOCAL_DEVICE_IDS"), "0,1");
    } else {
      EXPECT_EQ(env_of(c, "CUDA_VISIBLE_DEVICES"), gpus.given.value_or("(unset)"));
      EXPECT_EQ(env_of(c, "JAX_LOCAL_DEVICE_IDS"), "(unset)");
    }
  }
}

}  // namespace dew::testing
