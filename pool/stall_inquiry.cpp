// A step over its StepWatchdog bound in a pool: the processes whose bounds
// passed tell each other their step and whether they wait on their peers,
// and the ones behind are named (stall_verdict.h), not a process that waits
// for them. Under DDP every process's whole step outlives the bound when one
// stalls; each process's own watchdog would otherwise name itself, and the
// first to reach the service (any of them) was blamed.
#include <algorithm>
#include <mutex>

#include "dew/exit_status.h"
#include "dew/failure_timings.h"
#include "dew/log.h"
#include "failure.h"
#include "pace_verdict.h"
#include "pool_state.h"
#include "stall_verdict.h"

namespace dew::runtime {
namespace {

std::mutex g_probe_mutex;
std::function<std::optional<bool>()> g_probe;

std::string report_key(int rank) { return "dew/step-bound/" + std::to_string(rank); }

// Whether this process waits on its peers: a pool call in flight on any
// thread, else the framework's probe.
bool waits_on_peers(CoordinationClient& client) {
  if (client.caller_waiting()) return true;
  std::function<std::optional<bool>()> probe;
  {
    std::lock_guard lock(g_probe_mutex);
    probe = g_probe;
  }
  return probe && probe().value_or(false);
}

// The reports of the processes whose bounds pass by the deadline; a
// failure heard meanwhile ends this process as its peer.
std::vector<std::optional<StepReport>> gather_reports(Pool::State& state, const StepReport& own) {
  CoordinationClient& client = *state.client;
  const int self = state.identity.rank;
  client.put(report_key(self), encode_step_report(own));
  std::vector<std::optional<StepReport>> reports(static_cast<std::size_t>(state.identity.size));
  reports[static_cast<std::size_t>(self)] = own;
  const auto deadline = Clock::now() + timings::kStallReportWait;
  for (int rank = 0; rank < state.identity.size; ++rank) {
    if (rank == self) continue;
    const auto left = std::max(Clock::duration::zero(), deadline - Clock::now());
    auto got = client.get(report_key(rank), std::chrono::duration_cast<std::chrono::milliseconds>(left));
    if (!got.ok()) state.end_for_peer(client.failure().value_or(PeerFailure{0, got.error().message}));
    if (got.value()) reports[static_cast<std::size_t>(rank)] = decode_step_report(*got.value());
  }
  return reports;
}

}  // namespace

void set_collective_probe(std::function<std::optional<bool>()> probe) {
  std::lock_guard lock(g_probe_mutex);
  g_probe = std::move(probe);
}

namespace detail {

std::optional<bool> sample_waits_on_peers() {
  Pool::State* state = attached_pool();
  if (!state || !state->client || state->identity.size < 2 || state->failing.load() || state->ending.load()) {
    return std::nullopt;
  }
  return waits_on_peers(*state->client);
}

// Every process puts the window that ended under its rank (keys of two
// windows alternate, so process 0 reads the one before whole); process 0
// says which processes were slow in it, one window late.
void publish_pace(const PaceStats& ended, double interval_seconds) {
  Pool::State* state = attached_pool();
  if (!state || !state->client || state->identity.size < 2 || state->failing.load() || state->ending.load()) return;
  const auto key = [](std::uint64_t window, int rank) {
    return "dew/pace/" + std::to_string(window % 2) + "/" + std::to_string(rank);
  };
  state->client->put(key(ended.window, state->identity.rank), encode_pace(ended));
  if (state->identity.rank != 0 || ended.window == 0) return;
  const std::uint64_t before = ended.window - 1;
  std::vector<std::optional<PaceStats>> stats(static_cast<std::size_t>(state->identity.size));
  for (int rank = 0; rank < state->identity.size; ++rank) {
    auto got = state->client->get(key(before, rank), std::chrono::milliseconds(0));
    if (got.ok() && got.value()) stats[static_cast<std::size_t>(rank)] = decode_pace(*got.value());
  }
  for (const auto& line : slow_processes(stats, before, interval_seconds)) log_warn(line);
}

void end_step_over_bound(std::uint64_t step, const std::string& message) {
  Pool::State* state = attached_pool();
  if (!state || !state->client || state->identity.size < 2) fail_process(message, kWatchdogExitCode);
  if (state->failing.load() || state->ending.load()) fail_process(message, kWatchdogExitCode);
  const int self = state->identity.rank;
  const auto verdict =
      stalled_processes(gather_reports(*state, StepReport{step, waits_on_peers(*state->client)}), self);
  if (std::find(verdict.behind.begin(), verdict.behind.end(), self) != verdict.behind.end()) {
    state->fail(verdict.why.empty() ? message : message + ": " + verdict.why, kWatchdogExitCode);
  }
  // Another is behind: its own watchdog names it (exit 124), or, when it
  // says nothing (outside a step, not answering), this process does.
  {
    std::unique_lock lock(state->mutex);
    state->changed.wait_for(lock, timings::kStallWordWait, [&] { return state->failure_heard.has_value(); });
  }
  if (auto heard = state->client->failure()) state->end_for_peer(*heard);
  const PeerFailure blamed{verdict.behind.front(), "it is behind: " + verdict.why + " (" + message + ")"};
  state->client->publish_blame(blamed.rank, blamed.message);
  state->end_for_peer(blamed);
}

}  // namespace detail
}  // namespace dew::runtime
