// Pool's exchange calls: put/get, all_gather and agree, each refusing at
// the caller what the coordination service would drop (a frame over its
// limit). The join and the pool's life are in pool.cpp.
#include <malloc.h>

#include "dew/pool.h"
#include "dew/text.h"
#include "pool_state.h"
#include "wire.h"

namespace dew::runtime {
namespace {

// After a gather round this large, glibc's freed buffers are given back.
constexpr std::size_t kTrimAfterBytes = std::size_t{16} << 20;

std::string mib(std::size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// Refuses, before anything is sent, a message the coordination service
// would drop: one frame holds at most wire::kMaxFrameBytes.
Result<Done> check_frame_size(std::size_t frame_bytes, std::size_t payload_bytes, const std::string& what) {
  if (frame_bytes <= wire::kMaxFrameBytes) return Done{};
  // What the frame holds besides the payload: its header and the other
  // items (a put's key). Alone over the limit, no payload fits at all.
  const std::size_t rest = frame_bytes - payload_bytes;
  if (rest >= wire::kMaxFrameBytes) {
    return invalid_argument(what + ": the key and the frame take " + std::to_string(rest) +
                            " bytes, over the coordination service's limit of " + mib(wire::kMaxFrameBytes) +
                            " a message; allowed: a short key");
  }
  return invalid_argument(what + ": the payload of " + std::to_string(payload_bytes) +
                          " bytes is over the coordination service's limit of " +
                          std::to_string(wire::kMaxFrameBytes - rest) + " bytes a message (" +
                          mib(wire::kMaxFrameBytes) +
                          " with the frame); send large data over a communicator (dew/comm.h)");
}

}  // namespace

Result<Done> Pool::try_put(const std::string& key, const std::string& value) {
  auto fits =
      check_frame_size(wire::encoded_size({key.size(), value.size()}), value.size(), "put('" + printable(key) + "')");
  if (!fits.ok()) return fits;
  if (!state_->client) {
    // A pool of one may still run several device threads that rendezvous here.
    std::lock_guard lock(state_->mutex);
    state_->local_kv[key] = value;
    state_->changed.notify_all();
    return Done{};
  }
  state_->client->put(key, value);
  return Done{};
}

Result<std::string> Pool::try_get(const std::string& key, std::chrono::milliseconds timeout) {
  // A key over the frame limit was dropped by the service as a bad frame,
  // and the pool ended: refused here, as put refuses it.
  auto fits = check_frame_size(wire::encoded_size({key.size(), 8}), 0, "get('" + printable(key) + "')");
  if (!fits.ok()) return fits.error();
  const auto not_there = [&] {
    return timeout_error("get('" + key + "'): no process put it within " + seconds_text(timeout));
  };
  if (!state_->client) {
    // Another thread of this process may put it: wait, as a pooled get does.
    std::unique_lock lock(state_->mutex);
    if (!state_->changed.wait_for(lock, timeout, [&] { return state_->local_kv.count(key) > 0; })) return not_there();
    return state_->local_kv.at(key);
  }
  auto value = state_->checked(state_->client->get(key, timeout));
  if (!value) return not_there();
  return std::move(*value);
}

void Pool::put(const std::string& key, const std::string& value) { value_or_throw(try_put(key, value)); }

std::string Pool::get(const std::string& key, std::chrono::milliseconds timeout) {
  return value_or_throw(try_get(key, timeout));
}

Gathered::Gathered(std::shared_ptr<const void> owner, std::vector<std::string_view> parts)
    : owner_(std::move(owner)), parts_(std::move(parts)) {}

// The strings stay where they are (the vector is never changed again), so
// views into them, short ones' inline bytes included, stay valid.
Gathered::Gathered(std::vector<std::string> parts) {
  auto owned = std::make_shared<const std::vector<std::string>>(std::move(parts));
  parts_.assign(owned->begin(), owned->end());
  owner_ = std::move(owned);
}

std::vector<std::string> Gathered::strings() const { return std::vector<std::string>(begin(), end()); }

Result<Gathered> Pool::try_all_gather(const std::string& bytes) {
  // Checked in a pool of one too: a program must not pass alone and fail in a pool.
  const unsigned round = state_->gather_round;
  const std::string name = "gather#" + std::to_string(round);
  const std::string what = "all_gather round " + std::to_string(round);
  auto fits = check_frame_size(wire::encoded_size({8, name.size(), bytes.size(), 8}), bytes.size(), what);
  if (!fits.ok()) return fits.error();
  // Every process's part comes back in one reply to each.
  const auto per_process = wire::kMaxGatheredBytes / static_cast<std::size_t>(size()) - 4;
  if (bytes.size() > per_process) {
    return invalid_argument(what + ": the payload of " + std::to_string(bytes.size()) + " bytes is over the limit of " +
                            std::to_string(per_process) + " bytes a process for a pool of " + std::to_string(size()) +
                            " (" + mib(wire::kMaxGatheredBytes) +
                            " a round); send large data over a communicator (dew/comm.h)");
  }
  ++state_->gather_round;
  if (!state_->client) return Gathered(std::vector<std::string>{bytes});
  // glibc keeps a large round's freed buffers (its mmap threshold rises to
  // the largest freed block), and the next rounds' buffers grow the heap
  // beside them: after a round of 16 MiB or more, give them back first.
  if (state_->last_gather_bytes >= kTrimAfterBytes) ::malloc_trim(0);
  if (state_->pmix) {
    auto gathered = state_->pmix->all_gather(bytes, state_->settings.agreement_patience);
    if (!gathered.ok()) {
      if (auto failed = state_->client->failure()) state_->end_for_peer(*failed);
      return gathered.error();
    }
    return Gathered(std::move(gathered.value()));
  }
  std::vector<int> missing;
  auto parts = state_->checked(state_->client->gather(name, bytes, state_->settings.agreement_patience, missing));
  if (!missing.empty()) {
    return Error{ErrorCode::kTimeout,
                 what + " ran out of patience after " + seconds_text(state_->settings.agreement_patience) + ": " +
                     processes_text(missing) + " never arrived",
                 missing};
  }
  state_->last_gather_bytes = 0;
  for (const auto& part : parts) state_->last_gather_bytes += part.size();
  return parts;
}

Result<Done> Pool::try_agree(const std::string& name) { return try_agree(name, state_->settings.agreement_patience); }

Result<Done> Pool::try_agree(const std::string& name, std::chrono::milliseconds patience) {
  // Checked alone too: a program must not pass alone and fail in a pool.
  auto fits = check_frame_size(wire::encoded_size({name.size() + 16, 8}), 0, "agree('" + printable(name) + "')");
  if (!fits.ok() || !state_->client) return fits;
  const unsigned round = state_->agreement_rounds[name]++;
  auto missing = state_->checked(state_->client->agree(name + "#" + std::to_string(round), patience));
  if (!missing.empty()) {
    return Error{ErrorCode::kTimeout,
                 "agreement '" + name + "' ran out of patience after " + seconds_text(patience) + ": " +
                     processes_text(missing) + " never arrived",
                 missing};
  }
  return Done{};
}

Gathered Pool::all_gather(const std::string& bytes) { return value_or_throw(try_all_gather(bytes)); }

void Pool::agree(const std::string& name) { value_or_throw(try_agree(name)); }

void Pool::agree(const std::string& name, std::chrono::milliseconds patience) {
  value_or_throw(try_agree(name, patience));
}

}  // namespace dew::runtime
