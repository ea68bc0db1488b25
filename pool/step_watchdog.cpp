// StepWatchdog: a thread that ends the process when one step outlives its
// bound, for C++ steps that XLA's execution watchdog does not cover; in a
// pool, stall_inquiry.cpp names the processes behind.
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include "dew/pool.h"
#include "dew/task_contract.h"
#include "dew/text.h"
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

using Clock = std::chrono::steady_clock;

// The pace window a wall-clock moment falls in (every process's clock: the
// windows of a pool line up).
std::uint64_t pace_window(double interval_seconds) {
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return static_cast<std::uint64_t>(now / interval_seconds);
}

// DEW_PACE_SECONDS: the window of the slow-process report, 60 s unless set.
Result<double> pace_interval_from_env() {
  const char* text = std::getenv(contract::kPaceSeconds.name);
  if (!text) return 60.0;
  const auto seconds = parse_whole<unsigned>(text);
  if (!seconds || *seconds < 1) {
    return invalid_argument("DEW_PACE_SECONDS='" + printable(text) +
                            "' is not allowed; allowed: a whole number of seconds, 1 or more (default 60)");
  }
  return double(*seconds);
}

}  // namespace

struct StepWatchdog::State {
  std::optional<std::chrono::milliseconds> bound;
  std::mutex mutex;
  std::condition_variable changed;
  std::optional<Clock::time_point> started;
  std::uint64_t steps = 0;
  bool stopping = false;
  // While steps run in a pool: a look at the main thread every
  // sample_every, and this window's samples and steps (pace_verdict.h).
  double pace_interval = 60;
  std::chrono::milliseconds sample_every{1000};
  Clock::time_point next_sample{};
  PaceStats pace;
  std::thread thread;

  // At a sample's time, with the lock held (released while it looks).
  void sample(std::unique_lock<std::mutex>& lock);
  void run();
};

void StepWatchdog::State::sample(std::unique_lock<std::mutex>& lock) {
  next_sample = Clock::now() + sample_every;
  lock.unlock();
  const auto waits = detail::sample_waits_on_peers();
  const std::uint64_t window = pace_window(pace_interval);
  lock.lock();
  if (!waits) return;
  if (window != pace.window) {
    PaceStats ended = std::exchange(pace, PaceStats{window});
    if (ended.window != 0 && ended.window + 1 == window) {
      lock.unlock();
      detail::publish_pace(ended, pace_interval);
      lock.lock();
    }
  }
  ++pace.samples;
  pace.waiting += *waits ? 1 : 0;
}

void StepWatchdog::State::run() {
  std::unique_lock lock(mutex);
  while (!stopping) {
    if (!started) {
      changed.wait(lock, [&] { return stopping || started.has_value(); });
      continue;
    }
    const auto step = steps;
    const auto deadline = *started + *bound;
    const auto wake = std::min(deadline, next_sample);
    if (changed.wait_until(lock, wake, [&] { return stopping || steps != step || !started; })) continue;
    if (Clock::now() < deadline) {
      sample(lock);
      continue;
    }
    lock.unlock();
    detail::end_step_over_bound(step, "step " + std::to_string(step) + " ran longer than its bound of " +
                                          bound_text(*bound) + " (StepWatchdog, DEW_WATCHDOG)");
  }
}

struct StepWatchdog::Choice {
  std::optional<std::chrono::milliseconds> bound;  // nullopt: "off"
  double pace_interval = 60;
};

Result<StepWatchdog::Choice> StepWatchdog::choose(std::optional<std::chrono::milliseconds> bound) {
  Choice choice{bound};
  if (!bound) {
    const char* text = std::getenv(contract::kWatchdog.name);
    auto parsed = chosen_watchdog("", "", text ? std::optional<std::string>(text) : std::nullopt);
    if (!parsed.ok()) return parsed.error();
    if (parsed.value()) choice.bound = std::chrono::duration_cast<std::chrono::milliseconds>(*parsed.value());
  }
  if (!choice.bound) return choice;
  auto pace = pace_interval_from_env();
  if (!pace.ok()) return pace.error();
  choice.pace_interval = pace.value();
  return choice;
}

Result<std::unique_ptr<StepWatchdog>> StepWatchdog::create(std::optional<std::chrono::milliseconds> bound) {
  auto choice = choose(bound);
  if (!choice.ok()) return choice.error();
  return std::unique_ptr<StepWatchdog>(new StepWatchdog(choice.value()));
}

StepWatchdog::StepWatchdog(std::optional<std::chrono::milliseconds> bound)
    : StepWatchdog(value_or_throw(choose(bound))) {}

StepWatchdog::StepWatchdog(const Choice& choice) : state_(std::make_unique<State>()) {
  state_->bound = choice.bound;
  if (!state_->bound) return;  // "off"
  State* s = state_.get();
  s->pace_interval = choice.pace_interval;
  s->sample_every = std::clamp(std::chrono::milliseconds(static_cast<long long>(s->pace_interval * 1000 / 20)),
                               std::chrono::milliseconds(200), std::chrono::milliseconds(1000));
  s->next_sample = Clock::now() + s->sample_every;
  s->thread = std::thread([s] { s->run(); });
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
  if (state_->started) {
    ++state_->pace.steps;
    state_->pace.step_microseconds += static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - *state_->started).count());
  }
  state_->started.reset();
  state_->changed.notify_all();
}

StepWatchdog::Step::~Step() { owner_.end_step(); }

}  // namespace dew::runtime
