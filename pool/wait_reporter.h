// Says every few seconds, at info level, what a join waits for, so a user
// is never left with silence: at 5, 10, ... 30 s, then every 30 s.
// Private to pool/.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "dew/log.h"

namespace dew::runtime {

class WaitReporter {
 public:
  using Clock = std::chrono::steady_clock;
  WaitReporter(std::string what, Clock::time_point start, Clock::duration timeout)
      : what_(std::move(what)), start_(start), timeout_(timeout), next_(start + std::chrono::seconds(5)) {}

  // "waiting for WHAT (12 s of 300 s): DETAIL", when one is due.
  void tick(const std::string& detail) {
    const auto now = Clock::now();
    if (now < next_) return;
    log_info("waiting for " + what_ + " (" + whole_seconds(now - start_) + " of " + whole_seconds(timeout_) + ")" +
             (detail.empty() ? "" : ": " + detail));
    next_ = now + (now - start_ < std::chrono::seconds(30) ? std::chrono::seconds(5) : std::chrono::seconds(30));
  }

 private:
  static std::string whole_seconds(Clock::duration d) {
    return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(d).count()) + " s";
  }
  std::string what_;
  Clock::time_point start_;
  Clock::duration timeout_;
  Clock::time_point next_;
};

// Calls `tick` twice a second on its own thread while a blocking call waits.
class TickerThread {
 public:
  explicit TickerThread(std::function<void()> tick)
      : thread_([this, tick = std::move(tick)] {
          std::unique_lock lock(mutex_);
          while (!changed_.wait_for(lock, std::chrono::milliseconds(500), [&] { return stop_; })) {
            lock.unlock();
            tick();
            lock.lock();
          }
        }) {}
  ~TickerThread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  TickerThread(const TickerThread&) = delete;
  TickerThread& operator=(const TickerThread&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is ready
};

}  // namespace dew::runtime
