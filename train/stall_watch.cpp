#include "stall_watch.h"

#include <cstdio>

#include "dew/exit_status.h"

namespace dew::train {
namespace {

using Clock = std::chrono::steady_clock;

std::string seconds_of(Clock::duration d) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", std::chrono::duration<double>(d).count());
  return text;
}

}  // namespace

StallWatch::StallWatch(runtime::Pool& pool, std::optional<std::chrono::milliseconds> bound, int devices,
                       int first_device)
    : pool_(pool), bound_(bound), first_device_(first_device), devices_(std::size_t(devices)) {
  if (bound_) thread_ = std::thread([this] { watch(); });
}

StallWatch::~StallWatch() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StallWatch::step_begins(int local, int step) {
  std::lock_guard lock(mutex_);
  Device& d = devices_[std::size_t(local)];
  d.step = step;
  d.step_start = d.since = Clock::now();
  d.collective.clear();
}

void StallWatch::step_ends(int local) {
  std::lock_guard lock(mutex_);
  devices_[std::size_t(local)].step = 0;
}

void StallWatch::collective_begins(int local, const std::string& what) {
  std::lock_guard lock(mutex_);
  Device& d = devices_[std::size_t(local)];
  d.collective = what;
  d.since = Clock::now();
}

void StallWatch::collective_ends(int local) {
  std::lock_guard lock(mutex_);
  Device& d = devices_[std::size_t(local)];
  d.collective.clear();
  d.since = Clock::now();
}

std::optional<std::string> StallWatch::verdict(Clock::time_point now) const {
  const Clock::duration bound = *bound_;
  // The stalled one names itself once its step is past the bound; the
  // waiting ones give it max(bound, 2 s) more to do so.
  const Clock::duration grace = std::max<Clock::duration>(bound, std::chrono::seconds(2));
  const Device* waiting = nullptr;
  for (std::size_t k = 0; k < devices_.size(); ++k) {
    const Device& d = devices_[k];
    if (d.step == 0 || now - d.step_start <= bound) continue;
    const std::string device = "device " + std::to_string(first_device_ + int(k));
    if (d.collective.empty()) {
      return "step " + std::to_string(d.step) + ": " + device + " stalled outside any collective (computing or " +
             "loading data) for " + seconds_of(now - d.since) + ", past the step bound of " + seconds_of(bound) +
             " (--watchdog); its peers wait for it in collectives";
    }
    if (now - d.step_start > bound + grace && (!waiting || d.since < waiting->since)) waiting = &d;
  }
  if (!waiting) return std::nullopt;
  return "step " + std::to_string(waiting->step) + " ran past its bound of " + seconds_of(bound) +
         " (--watchdog): this process's devices waited in collectives (" + waiting->collective + ") for " +
         seconds_of(now - waiting->since) + " and no process said it stalled";
}

void StallWatch::watch() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (stop_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stopping_; })) return;
    if (auto message = verdict(Clock::now())) {
      lock.unlock();
      pool_.fail(*message, kWatchdogExitCode);
    }
  }
}

}  // namespace dew::train
