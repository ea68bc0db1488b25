// The coordination service's notices: strangers (capped, and said at most
// once a second), rounds that wait past DEW_SLOW_SECONDS, and processes whose
// heartbeats come late. Runs on the service's thread (see service_impl.h).
#include <algorithm>
#include <cstdio>

#include "service_impl.h"

namespace dew::runtime {

bool CoordinationService::Impl::room_for_stranger() {
  if (pending.size() < max_strangers()) return true;
  const auto oldest = std::min_element(pending.begin(), pending.end(),
                                       [](const SessionPtr& a, const SessionPtr& b) { return a->opened < b->opened; });
  if (Clock::now() - (*oldest)->opened < kStrangerGrace) return false;
  note_stranger("closed the unauthenticated connection from " + (*oldest)->peer + " to make room: " +
                std::to_string(pending.size()) + " are open, the limit for a pool of " + std::to_string(config.size));
  // A copy: close() erases the set's element, which *oldest is (TSan found
  // close() reading the session through the freed node).
  close(SessionPtr(*oldest), "");
  return true;
}

void CoordinationService::Impl::note_stranger(const std::string& line) {
  const auto now = Clock::now();
  if (now - strangers.last_line < std::chrono::seconds(1)) {
    ++strangers.held_back;
    return;
  }
  const int held = std::exchange(strangers.held_back, 0);
  log(line +
      (held ? " (" + std::to_string(held) + " more notices about outside connections held back before it)" : ""));
  strangers.last_line = now;
}

void CoordinationService::Impl::flush_stranger_notices() {
  if (strangers.held_back == 0 || Clock::now() - strangers.last_line < std::chrono::seconds(1)) return;
  log(std::to_string(std::exchange(strangers.held_back, 0)) +
      " more notices about outside connections held back (refused, closed or not accepted; one line a second at most)");
  strangers.last_line = Clock::now();
}

namespace {

std::string seconds_since(std::chrono::steady_clock::duration waited) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", std::chrono::duration<double>(waited).count());
  return text;
}

// "agreement 'step' (round 4)" from "step#4"; "all_gather round 2" from "gather#2".
std::string round_text(const std::string& name) {
  const auto hash = name.rfind('#');
  if (hash == std::string::npos) return "agreement '" + name + "'";
  const std::string base = name.substr(0, hash);
  const std::string round = name.substr(hash + 1);
  if (base == "gather") return "all_gather round " + round;
  return "agreement '" + base + "' (round " + round + ")";
}

// "process 3", "processes 1, 4 and 9", the first 8 then "and N more".
std::string processes_named(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "process " : "processes ";
  const std::size_t shown = std::min<std::size_t>(ranks.size(), 8);
  for (std::size_t i = 0; i < shown; ++i) {
    if (i > 0) text += i + 1 == ranks.size() ? " and " : ", ";
    text += std::to_string(ranks[i]);
  }
  if (ranks.size() > shown) text += " and " + std::to_string(ranks.size() - shown) + " more";
  return text;
}

}  // namespace

// Slow rounds are looked for a few times per DEW_SLOW_SECONDS (at most once
// a second, at least every 50 ms), apart from heartbeats, whose interval
// follows the heartbeat timeout.
void CoordinationService::Impl::watch_slow_rounds() {
  const auto interval = std::clamp<std::chrono::milliseconds>(config.slow_after / 4, std::chrono::milliseconds(50),
                                                              std::chrono::milliseconds(1000));
  slow_check.expires_after(interval);
  slow_check.async_wait([this](std::error_code ec) {
    if (ec) return;
    say_slow_rounds(Clock::now());
    watch_slow_rounds();
  });
}

void CoordinationService::Impl::say_slow_rounds(Clock::time_point now) {
  const auto say = [&](const std::string& name, Slowness& slowness, const std::set<int>& arrived) {
    const auto waited = now - slowness.started;
    if (slowness.next_word == Clock::duration::zero()) slowness.next_word = config.slow_after;
    if (waited < slowness.next_word) return;
    // Many slow rounds in a row (a slow link slows every one): one line per
    // DEW_SLOW_SECONDS for them all; one round's own lines still come at
    // slow_after, twice, four times ... that.
    if (slowness.next_word == config.slow_after && now - last_slow_line < config.slow_after) return;
    last_slow_line = now;
    slowness.next_word *= 2;
    log(round_text(name) + " has waited " + seconds_since(waited) + " for " + processes_named(missing_from(arrived)) +
        " (" + std::to_string(arrived.size()) + " of " + std::to_string(config.size) + " processes arrived)");
  };
  for (auto& [name, agreement] : agreements) say(name, agreement.slowness, agreement.arrived);
  for (auto& [name, gathering] : gatherings) say(name, gathering.slowness, arrived_in(gathering));
}

void CoordinationService::Impl::note_gap(Session& session, Clock::time_point now) {
  const auto gap = now - session.last_heard;
  const auto beat_interval = std::max(config.heartbeat_timeout / 4, std::chrono::milliseconds(20));
  const bool paused = paused_at > session.last_heard || now - last_beat > 2 * beat_interval;
  if (paused || gap <= config.heartbeat_timeout / 2 || now - session.said_slow < config.slow_after) return;
  session.said_slow = now;
  log("process " + std::to_string(session.rank) + " is slow: nothing heard from it for " + seconds_since(gap) +
      " (heartbeats are due every " +
      seconds_since(std::max(config.heartbeat_timeout / 4, std::chrono::milliseconds(20))) +
      "; it is counted as failed after " + seconds_since(config.heartbeat_timeout) + " of silence)");
}

}  // namespace dew::runtime
