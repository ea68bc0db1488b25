// What the `dew worker` integration tests share: the worker's report
// (--out), its losses and fsdp groups, how far two runs' losses are apart,
// and a checkpoint's file changed by hand and its digest as b2sum prints it.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
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

// Inverts `count` bytes of the file at `offset` in place.
inline void flip_bytes(const std::string& path, std::streamoff offset, int count) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  std::string bytes(std::size_t(count), '\0');
  file.seekg(offset);
  file.read(bytes.data(), count);
  for (char& c : bytes) c = char(~c);
  file.seekp(offset);
  file.write(bytes.data(), count);
}

// BLAKE2b-256 of the file as `b2sum -l 256` prints it, or "" without b2sum.
inline std::string b2sum(const std::string& path) {
  const auto r = run({"b2sum", "-l", "256", path});
  return r.exit_code == 0 ? r.out.substr(0, 64) : "";
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

// A small tmpfs of its own, unmounted whatever happens (root only: mount).
class SmallDisk {
 public:
  // Under `parent`: a test cluster's directory, where a mount reaches its
  // nodes' own mount namespaces (scripts/slurm-testbed --netns).
  explicit SmallDisk(const std::string& size, const std::string& parent = "/tmp") {
    std::string pattern = parent + "/dew-small-disk-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) return;
    dir_ = pattern;
    mounted_ = run({"mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", dir_}).exit_code == 0;
  }
  ~SmallDisk() {
    if (mounted_) run({"umount", dir_});
    if (!dir_.empty()) ::rmdir(dir_.c_str());
  }
  bool mounted() const { return mounted_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

// The script that runs the rest of its arguments, rank 2 (DEW_PROCESS_ID,
// set by dew launch and the plugin alike) in a mount namespace of its own
// with a 64 KiB tmpfs over the directory its first argument names: a disk
// full for that rank only (root only: unshare -m, mount).
inline const std::string kRank2DiskFull =
    R"(dir=$1; shift; if [ "$DEW_PROCESS_ID" = 2 ]; then )"
    R"(exec unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs "$0" && exec "$@"' "$dir" "$@"; fi; exec "$@")";

// The worker alone: one process with `devices` CPU devices.
inline RunResult alone_worker(int devices, std::vector<std::string> worker_args) {
  std::vector<std::string> args = {dew_exe(),     "worker", "--devices-per-process", std::to_string(devices),
                                   "--cache-dir", "off"};
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  return run(args, {}, std::chrono::seconds(120));
}

}  // namespace dew::testing
