// The worker's step watchdog, which knows who stalled. A stalled process's
// peers wait for it inside collectives, so a plain step bound would fire on
// every process at once and blame whichever spoke first. This one watches
// every device of the process: when a step outlives its bound, a process
// whose device is outside any collective (computing, loading data, asleep)
// is the stalled one and fails the pool naming itself; a process whose
// devices all wait in collectives gives the stalled one a grace period to
// say so first, and fails only if nobody does. Private to train/.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dew/pool.h"

namespace dew::train {

class StallWatch {
 public:
  // bound: nullopt for off (no thread). first_device: this process's first
  // device id, for the messages.
  StallWatch(runtime::Pool& pool, std::optional<std::chrono::milliseconds> bound, int devices, int first_device);
  ~StallWatch();
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

  void step_begins(int local_device, int step);
  void step_ends(int local_device);
  void collective_begins(int local_device, const std::string& what);
  void collective_ends(int local_device);

 private:
  struct Device {
    int step = 0;  // 0: between steps
    std::chrono::steady_clock::time_point step_start, since;
    std::string collective;  // empty: outside collectives
  };
  void watch();
  // The message to fail with now, if any.
  std::optional<std::string> verdict(std::chrono::steady_clock::time_point now) const;

  runtime::Pool& pool_;
  std::optional<std::chrono::milliseconds> bound_;
  int first_device_;
  std::mutex mutex_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::vector<Device> devices_;
  std::thread thread_;
};

}  // namespace dew::train
