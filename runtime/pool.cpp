// join() and Pool: the edge that ties identity (identity.cpp), PMIx
// (pmix_session.cpp) and the coordination service (coordination_*.cpp)
// together, and the process-wide failure path.
#include "pool.h"

#include <unistd.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sodium.h>
#include <thread>

#include "auth.h"
#include "coordination.h"
#include "failure.h"
#include "pmix_session.h"

namespace dew::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// One write per line, so lines from threads (and ranks sharing a terminal)
// never cut into each other.
void say(const std::string& line) {
  const std::string text = line + "\n";
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (int rank : ranks) out += (out.empty() ? "" : ",") + std::to_string(rank);
  return out;
}

std::string processes(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "process " : "processes ") + join_ranks(ranks);
}

std::string seconds_text(std::chrono::milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", static_cast<double>(duration.count()) / 1000.0);
  return text;
}

constexpr int kFatalSignals[] = {SIGSEGV, SIGABRT, SIGBUS, SIGFPE};

}  // namespace

struct Pool::State {
  Identity identity;
  Settings settings;
  std::unique_ptr<PmixSession> pmix;
  std::unique_ptr<CoordinationService> service;
  std::unique_ptr<CoordinationClient> client;
  std::map<std::string, unsigned> agreement_rounds;
  unsigned gather_round = 0;
  std::map<std::string, std::string> local_kv;  // a pool of one

  std::atomic<bool> failing{false};
  std::atomic<bool> ending{false};
  bool left = false;

  // The watch thread: ends the process when a published failure has not
  // been heard at an agreement within the grace.
  std::mutex mutex;
  std::condition_variable changed;
  std::optional<Clock::time_point> failure_heard;
  bool stopping = false;
  std::thread watch;

  std::string signal_lines[std::size(kFatalSignals)];

  // "[rank] ", unless a launcher (dew launch) already prefixes every line.
  bool lines_prefixed = false;
  std::string prefix() const { return lines_prefixed ? "" : "[" + std::to_string(identity.rank) + "] "; }

  ~State() { stop_watch(); }

  void stop_watch() {
    {
      std::lock_guard lock(mutex);
      stopping = true;
      changed.notify_all();
    }
    if (watch.joinable() && watch.get_id() != std::this_thread::get_id()) watch.join();
  }

  [[noreturn]] void end_for_peer(const PeerFailure& failed) {
    if (failing.load() || ending.exchange(true)) {
      // Another thread is already ending the process.
      for (;;) pause();
    }
    say(prefix() + "ending: process " + std::to_string(failed.rank) + " failed: " + failed.message);
    // Process 0's service dies with it: let the failure reach everyone first.
    if (service) service->flush_failure(std::chrono::seconds(1));
    std::fflush(nullptr);
    ::_exit(kPeerFailedExitCode);
  }

  // Every pool call that finds the pool failed ends here: the failure has
  // been "heard at an agreement".
  template <typename T>
  T checked(Result<T> result) {
    if (!result.ok()) {
      auto failed = client ? client->failure() : std::nullopt;
      end_for_peer(failed.value_or(PeerFailure{0, result.error().message}));
    }
    return std::move(result.value());
  }

  [[noreturn]] void fail(const std::string& error, int exit_code) {
    if (failing.exchange(true) || ending.load()) {
      for (;;) pause();
    }
    say(prefix() + "error: " + error);
    if (client) {
      client->publish_failure(error, std::chrono::seconds(1));
      // Process 0 hosts the service: its own failure must reach every peer
      // before the service dies with it.
      if (service) service->flush_failure(std::chrono::seconds(1));
    }
    if (pmix) pmix->abort(exit_code, prefix() + error);
    std::fflush(nullptr);
    ::_exit(exit_code);
  }

  void start_watch() {
    watch = std::thread([this] {
      std::unique_lock lock(mutex);
      changed.wait(lock, [&] { return stopping || failure_heard.has_value(); });
      if (stopping) return;
      if (changed.wait_until(lock, *failure_heard + settings.failure_grace, [&] { return stopping; })) return;
      lock.unlock();
      auto failed = client->failure().value_or(PeerFailure{0, "unknown failure"});
      failed.message += " (not heard at an agreement within " + seconds_text(settings.failure_grace) +
                        ", DEW_FAILURE_GRACE_SECONDS)";
      end_for_peer(failed);
    });
  }
};

namespace {

// The process's pool, for the signal and terminate handlers.
std::atomic<Pool::State*> g_pool{nullptr};
std::terminate_handler g_previous_terminate = nullptr;

void on_fatal_signal(int signal_number) {
  Pool::State* state = g_pool.load();
  if (state && !state->failing.exchange(true)) {
    std::size_t slot = 0;
    while (slot < std::size(kFatalSignals) && kFatalSignals[slot] != signal_number) ++slot;
    const std::string& line = state->signal_lines[slot];
    [[maybe_unused]] ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
    if (state->client) {
      state->client->publish_prepared_from_signal(static_cast<int>(slot));
      // Give the frame time to leave (and process 0's service thread time
      // to push it) before the process dies.
      const timespec pause{0, state->service ? 300'000'000 : 100'000'000};
      nanosleep(&pause, nullptr);
    }
  }
  // Re-raise with the default action: the exit status still says "signal".
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

void on_terminate() {
  std::string message = "uncaught exception";
  if (auto current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::exception& error) {
      message += ": " + std::string(error.what());
    } catch (...) {
      message += " (not a std::exception)";
    }
  }
  if (Pool::State* state = g_pool.load()) state->fail(message, 1);
  if (g_previous_terminate) g_previous_terminate();
  std::abort();
}

void install_handlers(Pool::State& state) {
  for (std::size_t slot = 0; slot < std::size(kFatalSignals); ++slot) {
    const int number = kFatalSignals[slot];
    const std::string message = std::string("fatal signal ") + sigabbrev_np(number) + " (" + strsignal(number) + ")";
    state.signal_lines[slot] = state.prefix() + "error: " + message + "\n";
    if (state.client) state.client->prepare_signal_frame(static_cast<int>(slot), message);
    struct sigaction action {};
    action.sa_handler = on_fatal_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND;
    sigaction(number, &action, nullptr);
  }
  g_previous_terminate = std::set_terminate(on_terminate);
}

void remove_handlers() {
  for (int number : kFatalSignals) std::signal(number, SIG_DFL);
  if (g_previous_terminate) std::set_terminate(g_previous_terminate);
}

std::string hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

}  // namespace

Pool::Pool(std::unique_ptr<State> state) : state_(std::move(state)) {}
Pool::Pool(Pool&&) noexcept = default;
Pool& Pool::operator=(Pool&&) noexcept = default;
Pool::~Pool() {
  if (state_) leave();
}

const Identity& Pool::identity() const { return state_->identity; }
int Pool::rank() const { return state_->identity.rank; }
int Pool::size() const { return state_->identity.size; }
std::string Pool::backend() const {
  if (!state_->client) return "none";
  return state_->pmix ? "pmix+tcp" : "tcp";
}

Pool join(JoinOptions options) {
  static std::atomic<bool> joined{false};
  if (joined.exchange(true)) throw PoolError("join() was called twice: a process belongs to one pool");
  const Environment env = current_environment();
  auto identity = resolve_identity(env, options);
  if (!identity.ok()) throw PoolError(identity.error().message);
  auto settings = resolve_settings(env, options);
  if (!settings.ok()) throw PoolError(settings.error().message);

  auto state = std::make_unique<Pool::State>();
  state->identity = identity.value();
  state->settings = settings.value();
  state->lines_prefixed = env.count("DEW_LINES_PREFIXED") && env.at("DEW_LINES_PREFIXED") == "1";
  Identity& id = state->identity;
  std::string secret = options.secret.value_or(env.count("DEW_POOL_SECRET") ? env.at("DEW_POOL_SECRET") : "");

  if (id.source == PoolSource::kPmix) {
    auto pmix = PmixSession::init();
    if (!pmix.ok()) throw PoolError(pmix.error().message);
    state->pmix = std::move(pmix.value());
    state->pmix->fill(id);
    if (id.size == 1 && !options.multi_host) id.why += "; one process: no pool";
  }

  if (id.hostname.empty()) id.hostname = hostname();
  const bool pooled = id.size > 1 && id.source != PoolSource::kAlone;
  if (pooled) {
    if (state->pmix) {
      // PMIx fences cannot say who is missing and PMIx keys belong to one
      // process, so the service runs here too, bootstrapped over a fence:
      // process 0 contributes its address and (without DEW_POOL_SECRET) a
      // fresh secret, which only this job's processes can read.
      std::string contribution;
      if (id.rank == 0) {
        if (secret.empty()) secret = auth::random_secret_hex();
        auto service = CoordinationService::start(ServiceConfig{
            id.size, secret, 0, state->settings.heartbeat_timeout,
            [](const std::string& line) { say("[0] coordination service: " + line); }});
        if (!service.ok()) throw PoolError(service.error().message);
        state->service = std::move(service.value());
        contribution = hostname() + "\n" + std::to_string(state->service->port()) + "\n" + secret;
      }
      auto gathered = state->pmix->all_gather(contribution, state->settings.join_timeout);
      if (!gathered.ok()) throw PoolError(gathered.error().message);
      const std::string& zero = gathered.value()[0];
      const auto first = zero.find('\n');
      const auto second = zero.find('\n', first + 1);
      if (first == std::string::npos || second == std::string::npos) throw PoolError("process 0 sent no coordinator over PMIx");
      id.coordinator = Address{zero.substr(0, first),
                               static_cast<std::uint16_t>(std::stoi(zero.substr(first + 1, second - first - 1)))};
      id.coordinator_from = "process 0, over PMIx";
      secret = zero.substr(second + 1);
    } else {
      if (!id.coordinator) {
        throw PoolError(std::string(source_name(id.source)) + " gives rank and size but no coordinator: set "
                        "DEW_COORDINATOR_ADDRESS=host:port for every process");
      }
      if (secret.empty()) {
        throw PoolError("DEW_POOL_SECRET is not set: the coordination service admits only processes that know the "
                        "pool's secret (srun --dew-pool and dew launch set it; elsewhere export the same "
                        "DEW_POOL_SECRET, e.g. $(openssl rand -hex 32), to every process)");
      }
      if (id.rank == 0) {
        auto service = CoordinationService::start(ServiceConfig{
            id.size, secret, id.coordinator->port, state->settings.heartbeat_timeout,
            [](const std::string& line) { say("[0] coordination service: " + line); }});
        if (!service.ok()) throw PoolError(service.error().message + " (" + id.coordinator_from + "=" + id.coordinator->text() + ")");
        state->service = std::move(service.value());
      }
    }
    Pool::State* raw = state.get();
    auto client = CoordinationClient::connect(ClientConfig{
        id.rank == 0 ? std::string("127.0.0.1") : id.coordinator->host,
        id.rank == 0 ? (state->service ? state->service->port() : id.coordinator->port) : id.coordinator->port,
        id.rank, id.size, secret, state->settings.heartbeat_timeout, state->settings.join_timeout,
        [raw](const PeerFailure&) {
          std::lock_guard lock(raw->mutex);
          if (!raw->failure_heard) raw->failure_heard = Clock::now();
          raw->changed.notify_all();
        }});
    if (!client.ok()) throw PoolError(client.error().message);
    state->client = std::move(client.value());
  }

  if (options.failure_handlers) install_handlers(*state);
  g_pool.store(state.get());
  if (state->client) {
    state->start_watch();
    auto missing = state->checked(state->client->agree("dew.joined", state->settings.join_timeout));
    if (!missing.empty()) {
      state->fail(processes(missing) + " never joined the pool within " + seconds_text(state->settings.join_timeout) +
                      " (DEW_JOIN_TIMEOUT_SECONDS)",
                  1);
    }
  }
  const std::string backend = state->client ? (state->pmix ? "pmix+tcp" : "tcp") : "none";
  say(state->prefix() + "Joined the pool: process " + std::to_string(id.rank) + " of " + std::to_string(id.size) + " (" +
      std::string(source_name(id.source)) + ", " + backend + ")");
  return Pool(std::move(state));
}

void Pool::put(const std::string& key, const std::string& value) {
  if (!state_->client) {
    // A pool of one may still run several device threads that rendezvous here.
    std::lock_guard lock(state_->mutex);
    state_->local_kv[key] = value;
    state_->changed.notify_all();
    return;
  }
  state_->client->put(key, value);
}

std::string Pool::get(const std::string& key, std::chrono::milliseconds timeout) {
  if (!state_->client) {
    // Another thread of this process may put it: wait, as a pooled get does.
    std::unique_lock lock(state_->mutex);
    if (!state_->changed.wait_for(lock, timeout, [&] { return state_->local_kv.count(key) > 0; }))
      throw PoolError("get('" + key + "'): no process put it within " + seconds_text(timeout));
    return state_->local_kv.at(key);
  }
  auto value = state_->checked(state_->client->get(key, timeout));
  if (!value) throw PoolError("get('" + key + "'): no process put it within " + seconds_text(timeout));
  return *value;
}

std::vector<std::string> Pool::all_gather(const std::string& bytes) {
  if (!state_->client) return {bytes};
  if (state_->pmix) {
    auto gathered = state_->pmix->all_gather(bytes, state_->settings.agreement_patience);
    if (!gathered.ok()) {
      if (auto failed = state_->client->failure()) state_->end_for_peer(*failed);
      throw PoolError(gathered.error().message);
    }
    return std::move(gathered.value());
  }
  const unsigned round = state_->gather_round++;
  std::vector<int> missing;
  auto parts = state_->checked(state_->client->gather("gather#" + std::to_string(round), bytes,
                                                      state_->settings.agreement_patience, missing));
  if (!missing.empty()) {
    throw PoolError("all_gather round " + std::to_string(round) + " ran out of patience after " +
                    seconds_text(state_->settings.agreement_patience) + ": " + processes(missing) + " never arrived");
  }
  return parts;
}

void Pool::agree(const std::string& name) { agree(name, state_->settings.agreement_patience); }

void Pool::agree(const std::string& name, std::chrono::milliseconds patience) {
  if (!state_->client) return;
  const unsigned round = state_->agreement_rounds[name]++;
  auto missing = state_->checked(state_->client->agree(name + "#" + std::to_string(round), patience));
  if (!missing.empty()) {
    throw PoolError("agreement '" + name + "' ran out of patience after " + seconds_text(patience) + ": " +
                    processes(missing) + " never arrived");
  }
}

void Pool::fail(const std::string& error, int exit_code) { state_->fail(error, exit_code); }

void Pool::require_shared_directory(const std::string& path) {
  namespace fs = std::filesystem;
  // Step 1: everybody writes a token (or says why it could not).
  unsigned char random[8];
  randombytes_buf(random, sizeof random);
  char hex[2 * sizeof random + 1];
  sodium_bin2hex(hex, sizeof hex, random, sizeof random);
  const std::string token = std::string(".dew-shared-") + std::to_string(rank()) + "-" + hex;
  const fs::path mine = fs::path(path) / token;
  std::string report = "ok:" + token;
  {
    std::ofstream out(mine);
    out << token;
    if (!out) report = "error:cannot write " + mine.string() + ": " + std::strerror(errno);
  }
  const auto tokens = all_gather(report);
  std::vector<std::string> problems;
  for (int r = 0; r < size(); ++r) {
    if (tokens[static_cast<std::size_t>(r)].rfind("error:", 0) == 0) {
      problems.push_back("process " + std::to_string(r) + ": " + tokens[static_cast<std::size_t>(r)].substr(6));
    }
  }
  if (!problems.empty()) {
    std::error_code ignored;
    fs::remove(mine, ignored);
    std::string text;
    for (auto& p : problems) text += (text.empty() ? "" : "; ") + p;
    throw PoolError("directory '" + path + "' is not usable by every process: " + text);
  }
  // Step 2: everybody says whose tokens it sees.
  std::string seen;
  for (int r = 0; r < size(); ++r) {
    if (fs::exists(fs::path(path) / tokens[static_cast<std::size_t>(r)].substr(3))) seen += (seen.empty() ? "" : ",") + std::to_string(r);
  }
  const auto views = all_gather(seen);
  std::string everyone;
  for (int r = 0; r < size(); ++r) everyone += (everyone.empty() ? "" : ",") + std::to_string(r);
  agree("dew.shared-directory");
  std::error_code ignored;
  fs::remove(mine, ignored);
  // Group processes by what they see: "processes 0,1 see the tokens of
  // processes 0,1; process 2 sees process 2's".
  std::map<std::string, std::vector<int>> groups;
  for (int r = 0; r < size(); ++r) groups[views[static_cast<std::size_t>(r)]].push_back(r);
  if (groups.size() == 1 && groups.begin()->first == everyone) return;
  std::string text;
  for (auto& [view, who] : groups) {
    text += (text.empty() ? "" : "; ") + processes(who) + (who.size() == 1 ? " sees" : " see") + " the tokens of " +
            (view.empty() ? "no process" : "processes " + view);
  }
  throw PoolError("directory '" + path + "' is not one directory shared by all " + std::to_string(size()) +
                  " processes: " + text);
}

std::optional<std::string> Pool::compile_cache_key() {
  const auto fingerprints = all_gather(accelerator_fingerprint());
  std::map<std::string, std::vector<int>> groups;
  for (int r = 0; r < size(); ++r) groups[fingerprints[static_cast<std::size_t>(r)]].push_back(r);
  if (groups.size() == 1) {
    crypto_generichash_state hash;
    crypto_generichash_init(&hash, nullptr, 0, 32);
    for (const auto& fingerprint : fingerprints) {
      const std::string framed = std::to_string(fingerprint.size()) + ":" + fingerprint;
      crypto_generichash_update(&hash, reinterpret_cast<const unsigned char*>(framed.data()), framed.size());
    }
    unsigned char digest[32];
    crypto_generichash_final(&hash, digest, sizeof digest);
    char hex[65];
    sodium_bin2hex(hex, sizeof hex, digest, sizeof digest);
    return std::string(hex);
  }
  // Name the lines that differ from process 0's fingerprint, per group.
  auto lines = [](const std::string& text) {
    std::set<std::string> out;
    std::size_t at = 0;
    while (at < text.size()) {
      auto end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      if (end > at) out.insert(text.substr(at, end - at));
      at = end + 1;
    }
    return out;
  };
  const auto reference = lines(fingerprints[0]);
  std::string text;
  for (auto& [fingerprint, who] : groups) {
    if (who.front() == 0) continue;
    std::string differs;
    for (const auto& line : lines(fingerprint)) {
      if (!reference.count(line)) differs += (differs.empty() ? "" : ", ") + line;
    }
    text += (text.empty() ? "" : "; ") + processes(who) + " differ" + (who.size() == 1 ? "s" : "") + " from process 0: " +
            (differs.empty() ? "fewer fingerprint lines" : differs);
  }
  say(state_->prefix() + "compile cache off: the processes do not compile for the same accelerators: " + text);
  return std::nullopt;
}

void Pool::leave() {
  State& s = *state_;
  if (s.left) return;
  s.left = true;
  if (s.service) {
    s.service->wait_until_others_left([&](const std::vector<int>& still) {
      say(s.prefix() + "waiting for " + processes(still) + " to leave the pool before stopping the coordination service");
    });
  }
  if (s.client) {
    if (auto failed = s.client->failure()) s.end_for_peer(*failed);
    s.client->leave();
  }
  s.stop_watch();
  if (g_pool.load() == &s) {
    g_pool.store(nullptr);
    remove_handlers();
  }
  s.client.reset();
  s.service.reset();
  s.pmix.reset();
}

namespace detail {

void fail_process(const std::string& message, int exit_code) {
  if (Pool::State* state = g_pool.load()) state->fail(message, exit_code);
  say("error: " + message);
  std::fflush(nullptr);
  ::_exit(exit_code);
}

}  // namespace detail
}  // namespace dew::runtime
