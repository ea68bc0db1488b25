// The coordination service's requests: keys, agreements, gathers and the
// pool's one failure. Runs on the service's thread (see service_impl.h).
#include <malloc.h>

#include <algorithm>

#include "dew/text.h"
#include "service_impl.h"

namespace dew::runtime {
void CoordinationService::Impl::handle(const SessionPtr& session, wire::Frame& frame) {
  switch (frame.type) {
    case wire::Type::kHeartbeat:
      return;
    case wire::Type::kBye: {
      session->bye = true;
      return leaves(session->rank);
    }
    case wire::Type::kPut:
      return handle_put(frame);
    case wire::Type::kGet:
      return handle_get(session, frame);
    case wire::Type::kAgree:
      return handle_agree(session, frame);
    case wire::Type::kFail: {
      // A process may publish another's failure (one late to an agreement).
      const auto named = wire::decode_u64(frame.items[0]);
      const bool other = named && *named < static_cast<std::uint64_t>(config.size);
      return publish(PeerFailure{other ? static_cast<int>(*named) : session->rank, frame.items[1],
                                 frame.items[2] == wire::kStoppedKind});
    }
    default:
      close(session, "closed the connection of process " + std::to_string(session->rank) + ": unexpected " +
                         std::string(wire::type_name(frame.type)) + " frame");
  }
}

void CoordinationService::Impl::handle_put(wire::Frame& frame) { store(frame.items[0], std::move(frame.items[1])); }

void CoordinationService::Impl::store(const std::string& key, std::string value) {
  auto range = gets.equal_range(key);
  for (auto it = range.first; it != range.second; ++it) {
    it->second.timer->cancel();
    send(it->second.session, wire::Frame{wire::Type::kValue, {it->second.request, value}});
  }
  gets.erase(range.first, range.second);
  kv[key] = std::move(value);
}

CoordinationService::Impl::Clock::time_point CoordinationService::Impl::deadline_of(std::string_view patience_item) {
  // Patience is bounded by what a steady_clock can add (a day is typical).
  const auto ms = wire::decode_u64(patience_item).value_or(0);
  return Clock::now() + std::chrono::milliseconds(std::min<std::uint64_t>(ms, 1ULL << 40));
}

std::set<int> CoordinationService::Impl::arrived_in(const Gathering& gathering) {
  std::set<int> arrived;
  for (const auto& entry : gathering.parts) arrived.insert(entry.first);
  return arrived;
}

template <typename R>
void CoordinationService::Impl::wait_in(std::map<std::string, R>& rounds, const std::string& name, Waiter waiter) {
  R& round = rounds.at(name);
  const auto deadline = waiter.deadline;
  round.waiters.push_back(std::move(waiter));
  if (deadline >= round.timer_at) return;
  if (!round.timer) round.timer = std::make_unique<asio::steady_timer>(io);
  round.timer_at = deadline;
  round.timer->expires_at(deadline);  // cancels the wait for a later deadline
  round.timer->async_wait([this, &rounds, name](std::error_code ec) {
    if (!ec) time_out(rounds, name);
  });
}

template <typename R>
void CoordinationService::Impl::time_out(std::map<std::string, R>& rounds, const std::string& name) {
  auto found = rounds.find(name);
  if (found == rounds.end()) return;  // answered after the timer had expired
  R& round = found->second;
  const auto now = Clock::now();
  std::vector<Waiter> waiting;
  std::string missing;
  for (auto& waiter : round.waiters) {
    if (waiter.deadline > now) {
      waiting.push_back(std::move(waiter));
      continue;
    }
    if (missing.empty()) missing = dew::join(missing_from(arrived_in(round)), ",");
    send(waiter.session, wire::Frame{wire::Type::kAgreeTimeout, {waiter.request, missing}});
  }
  round.waiters.clear();
  round.timer_at = Clock::time_point::max();
  for (auto& waiter : waiting) wait_in(rounds, name, std::move(waiter));
}

void CoordinationService::Impl::handle_get(const SessionPtr& session, const wire::Frame& frame) {
  const std::string& key = frame.items[1];
  if (auto found = kv.find(key); found != kv.end()) {
    send(session, wire::Frame{wire::Type::kValue, {frame.items[0], found->second}});
    return;
  }
  const std::uint64_t id = next_waiter++;
  Waiter waiter{id, session, frame.items[0], deadline_of(frame.items[2]), std::make_shared<asio::steady_timer>(io)};
  waiter.timer->expires_at(waiter.deadline);
  waiter.timer->async_wait([this, key, id](std::error_code ec) {
    if (ec) return;  // cancelled: answered
    auto range = gets.equal_range(key);
    auto it = std::find_if(range.first, range.second, [id](const auto& entry) { return entry.second.id == id; });
    if (it == range.second) return;  // answered after the timer had expired
    send(it->second.session, wire::Frame{wire::Type::kNotFound, {it->second.request}});
    gets.erase(it);
  });
  gets.emplace(key, std::move(waiter));
}

std::vector<int> CoordinationService::Impl::missing_from(const std::set<int>& arrived) const {
  std::vector<int> missing;
  for (int rank = 0; rank < config.size; ++rank) {
    if (!arrived.count(rank)) missing.push_back(rank);
  }
  return missing;
}

void CoordinationService::Impl::handle_agree(const SessionPtr& session, const wire::Frame& frame) {
  const std::string name = frame.items[1];
  Agreement& agreement = agreements[name];
  agreement.arrived.insert(session->rank);
  if (static_cast<int>(agreement.arrived.size()) == config.size) {
    for (auto& waiter : agreement.waiters) send(waiter.session, wire::Frame{wire::Type::kAgreed, {waiter.request}});
    send(session, wire::Frame{wire::Type::kAgreed, {frame.items[0]}});
    agreements.erase(name);  // and its timer, whose wait ends cancelled
    return;
  }
  wait_in(agreements, name, Waiter{next_waiter++, session, frame.items[0], deadline_of(frame.items[2]), nullptr});
  fail_rounds_missing_a_leaver();
}

void CoordinationService::Impl::handle_gather(const SessionPtr& session, const std::string& request,
                                              const std::string& round, std::string_view patience, Part part) {
  Gathering& gathering = gatherings[round];
  gathering.parts[session->rank] = std::move(part);
  Waiter waiter{next_waiter++, session, request, deadline_of(patience), nullptr};
  if (static_cast<int>(gathering.parts.size()) < config.size) {
    wait_in(gatherings, round, std::move(waiter));
    fail_rounds_missing_a_leaver();
    return;
  }
  gathering.waiters.push_back(std::move(waiter));
  complete_gather(round);
}

// Every process gets the same parts: each reply is its own head followed by
// the parts, shared and written from where they are, so process 0 holds a
// round's payload at most once however many processes there are. Small parts
// are copied, with their lengths, into runs of at least kRunBytes (one
// buffer for a whole round of small parts: one sendmsg per reply, not one
// per part); a large part stays in the buffer it arrived in. The tail's
// hash (for the replies' tags) is computed once.
void CoordinationService::Impl::complete_gather(const std::string& round) {
  constexpr std::size_t kRunBytes = std::size_t{64} << 10;
  constexpr std::size_t kTrimPartBytes = std::size_t{1} << 20;
  Gathering& gathering = gatherings[round];
  std::vector<Chunk> tail;
  auth::TailHasher tail_hasher(tail_key);
  std::string run;
  std::size_t bytes = 0;
  const auto end_run = [&] {
    if (run.empty()) return;
    tail_hasher.add(run);
    tail.push_back(chunk_of(std::exchange(run, std::string())));
  };
  for (auto& [rank, part] : gathering.parts) {
    bytes += wire::kHeaderBytes + part.length;
    run += wire::encode_length(part.length);
    if (part.length < kRunBytes) {
      run += part.bytes();
      part = Part();
      if (run.size() >= kRunBytes) end_run();
      continue;
    }
    end_run();
    tail_hasher.add(part.bytes());
    // A part of a MiB or more, once the slowest connection is past it, is
    // freed and its pages given back at once: glibc would keep them (its mmap
    // threshold rises to the largest block freed), and process 0 grew round
    // by round (2.1-2.5x the payload over 5 rounds; 1.3-1.6x now).
    if (part.length < kTrimPartBytes) {
      tail.push_back(std::make_shared<const Part>(std::move(part)));
      continue;
    }
    tail.push_back(std::shared_ptr<const Part>(new Part(std::move(part)), [](const Part* done) {
      delete done;
      ::malloc_trim(0);
    }));
  }
  end_run();
  const auto tail_hash = tail_hasher.finish();
  for (auto& waiter : gathering.waiters) {
    send_shared(waiter.session, wire::encode_head(wire::Type::kGathered, {waiter.request}, bytes), tail, tail_hash);
  }
  gatherings.erase(round);
}

void CoordinationService::Impl::leaves(int rank) {
  left.insert(rank);
  // Readable by the others: one whose collective with it (torch's, outside
  // the pool) broke names the one that left, not itself (kLeftKeyPrefix).
  store(std::string(kLeftKeyPrefix) + std::to_string(rank), "1");
  fail_rounds_missing_a_leaver();
}

// A process that left can never arrive where the others wait for it: the
// pool fails at once, naming the one that left, rather than after the
// waiters' patience with a waiter named, or never (process 0 leaving waits
// for the others to leave, who wait for it).
void CoordinationService::Impl::fail_rounds_missing_a_leaver() {
  if (failure || left.empty()) return;
  const auto fail_for = [this](int rank, const std::string& what, const std::string& round) {
    const std::string name = round.substr(0, round.rfind('#'));
    publish(PeerFailure{rank, "process " + std::to_string(rank) +
                                  " left the pool (its program ended) while the others wait for it at " + what + " '" +
                                  name + "'"});
  };
  for (const auto& [round, agreement] : agreements) {
    for (const int rank : left) {
      if (!agreement.waiters.empty() && !agreement.arrived.count(rank)) return fail_for(rank, "agreement", round);
    }
  }
  for (const auto& [round, gathering] : gatherings) {
    for (const int rank : left) {
      if (!gathering.waiters.empty() && !gathering.parts.count(rank)) return fail_for(rank, "all_gather", round);
    }
  }
}

void CoordinationService::Impl::publish(PeerFailure failed) {
  if (failure) return;
  failure = failed;
  const wire::Frame push = wire::failure_frame(wire::Type::kFailure, static_cast<std::uint64_t>(failed.rank),
                                               failed.message, failed.stopped);
  for (const auto& client : clients) {
    if (client && !client->closed) send(client, push);
  }
  note_flushed();
}

}  // namespace dew::runtime
