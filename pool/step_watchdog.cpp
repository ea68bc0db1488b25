// StepWatchdog: a thread that ends the process when one step outlives its
// bound, for C++ steps that XLA's execution watchdog does not cover; in a
// pool, stall_inquiry.cpp names the processes behind.
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "dew/pool.h"
#include "dew/watchdog.h"
#include "failure.h"

namespace dew::runtime {

namespace {

// "30m", "1h30m" as DEW_WATCHDOG writes them; a bound with milliseconds
// (only a program's own) as "300 ms", "1500 ms", not rounded to "0s".
std::string bound_text(std::chrono::milliseconds bound) {
  if (bound.count() % 1000 != 0) return std::to_string(bound.count()) + " ms";
  return format_duration(std::chrono::duration_cast<std::chrono::seconds>(bound));
}

}  // namespace

struct StepWatchdog::State {
  std::optional<std::chrono::milliseconds> bound;
  std::mutex mutex;
  std::condition_variable changed;
  std::optional<std::chrono::steady_clock::time_point> started;
  std::uint64_t steps = 0;
  bool stopping = false;
  std::thread thread;
};

StepWatchdog::StepWatchdog(std::optional<std::chrono::milliseconds> bound) : state_(std::make_unique<State>()) {
  if (bound) {
    state_->bound = bound;
  } else {
    const char* text = std::getenv("DEW_WATCHDOG");
    auto parsed = chosen_watchdog("", "", text ? std::optional<std::string>(text) : std::nullopt);
    if (!parsed.ok()) throw PoolError(parsed.error());
    if (parsed.value()) state_->bound = std::chrono::duration_cast<std::chrono::milliseconds>(*parsed.value());
  }
  if (!state_->bound) return;  // "off"
  State* s = state_.get();
  s->thread = std::thread([s] {
    std::unique_lock lock(s->mutex);
    while (!s->stopping) {
      if (!s->started) {
        s->changed.wait(lock, [&] { return s->stopping || s->started.has_value(); });
        continue;
      }
      const auto step = s->steps;
      const auto deadline = *s->started + *s->bound;
      if (s->changed.wait_until(lock, deadline, [&] { return s->stopping || s->steps != step || !s->started; }))
        continue;
      const auto bound = *s->bound;
      lock.unlock();
      detail::end_step_over_bound(step, "step " + std::to_string(step) + " ran longer than its bound of " +
                                            bound_text(bound) + " (StepWatchdog, DEW_WATCHDOG)");
    }
  });
}

StepWatchdog::~StepWatchdog() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stopping = true;
    state_->changed.notify_all();
  }
  if (state_->thread.joinable()) state_->thread.join();
}

std::optional<std::chrono::milliseconds> StepWatchdog::bound() const { return state_->bound; }

StepWatchdog::Step StepWatchdog::step() {
  begin_step();
  return Step(*this);
}

void StepWatchdog::begin_step() {
  std::lock_guard lock(state_->mutex);
  state_->started = std::chrono::steady_clock::now();
  ++state_->steps;
  state_->changed.notify_all();
}

void StepWatchdog::end_step() {
  std::lock_guard lock(state_->mutex);
  state_->started.reset();
  state_->changed.notify_all();
}

StepWatchdog::Step::~Step() { owner_.end_step(); }

}  // namespace dew::runtime
