// What the `dew worker` integration tests share: the worker's report
// (--out), its losses and fsdp groups, and how far two runs' losses are apart.
#pragma once

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launch_helpers.h"

namespace dew::testing {

struct WorkerReport {
  std::vector<double> losses;
  std::vector<std::vector<int>> fsdp_groups;
  std::string exchange;
  nlohmann::json json;
};

inline WorkerReport read_report(const std::string& path) {
  WorkerReport r;
  const std::string text = read_text(path);
  if (text.empty()) return r;
  r.json = nlohmann::json::parse(text);
  r.losses = r.json.at("losses").get<std::vector<double>>();
  r.fsdp_groups = r.json.at("fsdp_groups").get<std::vector<std::vector<int>>>();
  r.exchange = r.json.at("exchange").get<std::string>();
  return r;
}

// The largest |a - b| over the steps both have; infinity when the step
// counts differ or either is empty.
inline double loss_gap(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.empty() || a.size() != b.size()) return INFINITY;
  double gap = 0;
  for (std::size_t k = 0; k < a.size(); ++k) gap = std::max(gap, std::abs(a[k] - b[k]));
  return gap;
}

// `dew worker ARGS` under `dew launch --processes-per-host P`, without the
// shared dataset cache.
inline RunResult launch_worker(int processes, std::vector<std::string> worker_args,
                               std::vector<std::string> launch_args = {}, std::map<std::string, std::string> env = {},
                               std::chrono::milliseconds timeout = std::chrono::seconds(120)) {
  std::vector<std::string> args = launch_args;
  args.insert(args.end(), {"--processes-per-host", std::to_string(processes), "--", dew_exe(), "worker"});
  if (std::find(worker_args.begin(), worker_args.end(), "--cache-dir") == worker_args.end()) {
    worker_args.insert(worker_args.end(), {"--cache-dir", "off"});
  }
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  return dew_launch(args, env, timeout);
}

// The worker alone: one process with `devices` CPU devices.
inline RunResult alone_worker(int devices, std::vector<std::string> worker_args) {
  std::vector<std::string> args = {dew_exe(),     "worker", "--devices-per-process", std::to_string(devices),
                                   "--cache-dir", "off"};
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  return run(args, {}, std::chrono::seconds(120));
}

}  // namespace dew::testing
