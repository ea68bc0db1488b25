// join() and Pool's calls: the edge that ties identity (identity.cpp), PMIx
// (pmix_session.cpp) and the coordination service (coordination_*.cpp)
// together. The failure path is in failure.cpp.
#include "dew/pool.h"

#include <unistd.h>

#include <atomic>
#include <memory>

#include "dew/framework_env.h"
#include "dew/hex.h"
#include "dew/log.h"
#include "dew/task_contract.h"
#include "dew/text.h"
#include "munge_auth.h"
#include "pool_munge.h"
#include "pool_state.h"
#include "wait_reporter.h"

namespace dew::runtime {
namespace {

std::string hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

Result<std::unique_ptr<CoordinationService>> start_service(const Pool::State& state, const std::string& secret,
                                                           std::uint16_t port,
                                                           std::function<Result<std::string>()> credential = {}) {
  auto service = CoordinationService::start(
      ServiceConfig{state.identity.size, secret, port, state.settings.heartbeat_timeout, state.settings.slow_after,
                    [](const std::string& line) { log_warn("coordination service: " + line); }, std::move(credential)});
  if (!service.ok()) {
    const auto& id = state.identity;
    const std::string where = id.coordinator ? " (" + id.coordinator_from + "=" + id.coordinator->text() + ")" : "";
    return Error{service.error().code, service.error().message + where};
  }
  log_debug("join: the coordination service listens on port " + std::to_string(service.value()->port()));
  return service;
}

// Under PMIx: PMIx fences cannot say who is missing and PMIx keys belong to
// one process, so the service runs here too: process 0 posts its address and
// (without DEW_POOL_SECRET) a fresh secret, which only this job's processes
// can read, and the others fetch them from it (no fence: one process that
// never comes holds nobody, and the service's join agreement names it).
// Returns the secret.
Result<std::string> bootstrap_over_pmix(Pool::State& state, std::string secret) {
  Identity& id = state.identity;
  std::string contribution;
  if (id.rank == 0) {
    if (secret.empty()) {
      auto fresh = random_hex(32);
      if (!fresh.ok()) return fresh.error();
      secret = fresh.value();
    }
    auto service = start_service(state, secret, 0);
    if (!service.ok()) return service.error();
    state.service = std::move(service.value());
    contribution = hostname() + "\n" + std::to_string(state.service->port()) + "\n" + secret;
  }
  auto fetched = state.pmix->from_process_zero("dew.coordinator", contribution, state.settings.join_timeout);
  if (!fetched.ok()) return fetched.error();
  const std::string& zero = fetched.value();
  const auto first = zero.find('\n');
  const auto second = first == std::string::npos ? first : zero.find('\n', first + 1);
  const auto port = second == std::string::npos
                        ? std::nullopt
                        : parse_whole<std::uint16_t>(zero.substr(first + 1, second - first - 1));
  if (!port) return internal_error("process 0 sent no coordinator over PMIx");
  id.coordinator = Address{zero.substr(0, first), *port};
  id.coordinator_from = "process 0, over PMIx";
  return zero.substr(second + 1);
}

// Without PMIx: the coordinator's address and the secret come from the
// environment; process 0 listens at the address's port.
Result<Done> check_tcp_pool(const Pool::State& state, const std::string& secret) {
  const Identity& id = state.identity;
  if (!id.coordinator) {
    return invalid_argument(std::string(source_name(id.source)) +
                            " gives rank and size but no coordinator: set "
                            "DEW_COORDINATOR_ADDRESS=host:port for every process");
  }
  if (secret.empty() && munge_context(state).empty()) {
    return invalid_argument(
        "DEW_POOL_SECRET is not set: the coordination service admits only processes that know the pool's secret "
        "(srun --dew-pool and dew launch set it; plain srun uses MUNGE instead; elsewhere export the same "
        "DEW_POOL_SECRET, e.g. $(openssl rand -hex 32), to every process)");
  }
  return Done{};
}

Result<Done> connect_client(Pool::State& state, const std::string& secret, Clock::time_point deadline,
                            bool open_with_munge = false) {
  const Identity& id = state.identity;
  // Process 0 reaches its own service on the loopback.
  const bool local = id.rank == 0;
  const std::string host = local ? "127.0.0.1" : id.coordinator->host;
  const std::uint16_t port = local && state.service ? state.service->port() : id.coordinator->port;
  log_debug("join: connecting to the coordination service at " + host_port(host, std::to_string(port)));
  Pool::State* raw = &state;
  ClientConfig config{host,
                      port,
                      id.rank,
                      id.size,
                      secret,
                      state.settings.heartbeat_timeout,
                      deadline,
                      state.settings.join_timeout,
                      [raw](const PeerFailure&) {
                        std::lock_guard lock(raw->mutex);
                        if (!raw->failure_heard) raw->failure_heard = Clock::now();
                        raw->changed.notify_all();
                      },
                      {}};
  config.slow_after = state.settings.slow_after;
  // Whether the join failed at MUNGE's word (said by the callback itself,
  // not read back from the error's text).
  auto munge_refused = std::make_shared<std::atomic<bool>>(false);
  if (open_with_munge) {
    config.secret_from_credential = [where = munge_auth::where_from_env(), context = munge_context(state),
                                     munge_refused](const std::string& credential) {
      auto secret = munge_auth::open(where, context, credential);
      if (!secret.ok()) munge_refused->store(true);
      return secret;
    };
  }
  auto client = CoordinationClient::connect(std::move(config));
  if (!client.ok()) {
    if (!munge_refused->load()) return client.error();
    return Error{client.error().code, "DEW_POOL_SECRET is not set and " + client.error().message +
                                          ": run munged (MUNGE) on every node, or export the same "
                                          "DEW_POOL_SECRET (64 hex digits) to every process"};
  }
  state.client = std::move(client.value());
  return Done{};
}

std::string backend_of(const Pool::State& state) {
  if (!state.client) return "none";
  return state.pmix ? "pmix+tcp" : "tcp";
}

}  // namespace

std::string pool_secret_problem(std::string_view secret) {
  if (is_pool_secret(secret)) return "";
  return "DEW_POOL_SECRET has " + counted(static_cast<long long>(secret.size()), "character") +
         (secret.size() == 64 ? " but not all hex digits" : "") +
         "; allowed: 64 hex digits (srun --dew-pool and dew launch draw them; elsewhere export the same "
         "$(openssl rand -hex 32) to every process)";
}

Result<Identity> describe_identity(const Environment& env, const JoinOptions& options) {
  auto resolved = resolve_identity(env, options);
  if (!resolved.ok()) return resolved;
  Identity id = resolved.value();
  if (id.source == PoolSource::kPmix) {
    auto pmix = PmixSession::init();
    if (!pmix.ok()) return pmix.error();
    pmix.value()->fill(id);
  }
  if (id.hostname.empty()) id.hostname = hostname();
  return id;
}

Pool::Pool(std::unique_ptr<State> state) : state_(std::move(state)) {}
Pool::Pool(Pool&&) noexcept = default;
Pool& Pool::operator=(Pool&&) noexcept = default;
Pool::~Pool() {
  if (state_) leave();
}

const Identity& Pool::identity() const { return state_->identity; }
int Pool::rank() const { return state_->identity.rank; }
int Pool::size() const { return state_->identity.size; }
std::string Pool::backend() const { return backend_of(*state_); }
const Address& Pool::framework_coordinator() const { return *state_->identity.framework_coordinator; }

std::vector<std::pair<std::string, std::string>> Pool::framework_variables() const {
  const Identity& id = state_->identity;
  const auto count = [](int n) { return static_cast<std::uint32_t>(std::max(n, 0)); };
  return dew::framework_variables({count(id.rank), count(id.size), count(id.local_rank), count(id.local_size),
                                   count(id.node), id.framework_coordinator->host, id.framework_coordinator->port});
}

namespace {

// The join's last phase: every process has connected. Bounded by the join's
// deadline even when process 0's service stops answering (SIGSTOP).
void agree_joined(Pool::State& state, Clock::time_point started) {
  const auto deadline = started + state.settings.join_timeout;
  const auto patience = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                                 std::chrono::milliseconds(0));
  WaitReporter reporter("every process to join the pool", started, state.settings.join_timeout);
  // Slurm tells no one of a task that ended before it joined: said, so a
  // user does not wait out the timeout in silence wondering.
  const std::string unseen =
      state.loss_before_join_unseen
          ? "under srun without --dew-pool a process that ended before joining is seen only when the join's " +
                seconds_text(state.settings.join_timeout) +
                " run out (DEW_JOIN_TIMEOUT_SECONDS); srun's own lines say whether a task exited"
          : "";
  TickerThread ticker([&] {
    const auto missing = state.service ? state.service->unconnected_ranks() : std::vector<int>{};
    std::string detail = missing.empty() ? "" : processes_text(missing) + " not connected yet";
    if (!unseen.empty()) detail += detail.empty() ? unseen : " (" + unseen + ")";
    reporter.tick(detail);
  });
  // The service answers at the patience's end; a little longer is its silence.
  auto agreed = state.client->agree("dew.joined", patience, deadline + std::chrono::seconds(2));
  if (!agreed.ok() && agreed.error().code == ErrorCode::kTimeout && !state.client->failure()) {
    state.end_for_peer(PeerFailure{0, "the coordination service at " + state.identity.coordinator->text() +
                                          " stopped answering during the join (process 0 stopped or overloaded); "
                                          "waited " +
                                          seconds_text(state.settings.join_timeout) + " (DEW_JOIN_TIMEOUT_SECONDS)"});
  }
  const auto missing = state.checked(std::move(agreed));
  if (!missing.empty()) {
    state.fail_for_late(missing, processes_text(missing) + " never joined the pool within " +
                                     seconds_text(state.settings.join_timeout) + " (DEW_JOIN_TIMEOUT_SECONDS)");
  }
}

// Without PMIx: the secret (or MUNGE standing for it), process 0's
// service, and this process's client.
Result<Done> connect_over_tcp(Pool::State& state, std::string secret, Clock::time_point started) {
  const Identity& id = state.identity;
  if (auto checked = check_tcp_pool(state, secret); !checked.ok()) return checked;
  log_debug("join: coordinator " + id.coordinator->text() + " from " + id.coordinator_from);
  const bool munge = secret.empty();
  if (munge) {
    log_debug("join: no DEW_POOL_SECRET: MUNGE stands for it (" + munge_context(state) + ")");
    if (auto probed = require_munge(munge_auth::where_from_env(), munge_context(state)); !probed.ok()) return probed;
  }
  if (id.rank == 0) {
    std::function<Result<std::string>()> credential;
    if (munge) {
      auto sealing = seal_with_munge(state, secret);
      if (!sealing.ok()) return sealing.error();
      credential = std::move(sealing.value());
    }
    auto service = start_service(state, secret, id.coordinator->port, std::move(credential));
    if (!service.ok()) return service.error();
    state.service = std::move(service.value());
  }
  return connect_client(state, secret, started + state.settings.join_timeout, munge && id.rank != 0);
}

// The join once the identity and the log prefix are known: the secret's
// check, the service and the client, the first agreement.
Result<Done> join_with(Pool::State& state, const JoinOptions& options, Clock::time_point started, std::string secret) {
  Identity& id = state.identity;
  // A guessable secret would let anyone who can reach the port into the pool.
  if (!secret.empty()) {
    if (auto problem = pool_secret_problem(secret); !problem.empty()) return invalid_argument(problem);
  }
  log_debug("join: identity from " + std::string(source_name(id.source)) + ": " + id.why);
  if (id.hostname.empty()) id.hostname = hostname();

  if (id.size > 1 && id.source != PoolSource::kAlone) {
    if (state.pmix) {
      auto bootstrapped = bootstrap_over_pmix(state, secret);
      if (!bootstrapped.ok()) return bootstrapped.error();
      auto connected = connect_client(state, bootstrapped.value(), started + state.settings.join_timeout);
      if (!connected.ok()) return connected;
    } else if (auto connected = connect_over_tcp(state, std::move(secret), started); !connected.ok()) {
      return connected;
    }
  }

  if (state.client) log_debug("join: connected to the coordination service; the join's agreement next");
  attach_failure_path(state, options.failure_handlers);
  if (auto offered = offer_framework_coordinator(state); !offered.ok()) return offered;
  if (state.client) {
    state.start_watch();
    agree_joined(state, started);
    if (auto taken = take_framework_coordinator(state); !taken.ok()) return taken;
  }
  log_info("Joined the pool: process " + std::to_string(id.rank) + " of " + std::to_string(id.size) + " (" +
           std::string(source_name(id.source)) + ", " + backend_of(state) + ")");
  return Done{};
}

Result<std::unique_ptr<Pool::State>> join_pool(const JoinOptions& options, Clock::time_point started) {
  if (auto level = configure_log_level_from_env(); !level.ok()) return level.error();
  const Environment env = current_environment();
  auto identity = resolve_identity(env, options);
  if (!identity.ok()) return identity.error();
  auto settings = resolve_settings(env, options);
  if (!settings.ok()) return settings.error();

  auto state = std::make_unique<Pool::State>();
  state->identity = identity.value();
  state->settings = settings.value();
  state->lines_prefixed = env.count(contract::kLinesPrefixed.name) && env.at(contract::kLinesPrefixed.name) == "1";
  state->loss_before_join_unseen =
      identity.value().source == PoolSource::kSlurm && !env.count(contract::kProcessId.name);
  Identity& id = state->identity;
  std::string secret =
      options.secret.value_or(env.count(contract::kPoolSecret.name) ? env.at(contract::kPoolSecret.name) : "");

  if (id.source == PoolSource::kPmix) {
    auto pmix = PmixSession::init();
    if (!pmix.ok()) return pmix.error();
    state->pmix = std::move(pmix.value());
    state->pmix->fill(id);
    if (id.size == 1 && !options.multi_host) id.why += "; one process: no pool";
  }
  set_log_prefix(state->prefix());  // the rank is known now, PMIx's too
  auto joined = join_with(*state, options, started, std::move(secret));
  if (!joined.ok()) {
    // Under PMIx an uncaught join failure aborts the job step (as a failure
    // after joining does): srun would otherwise wait for every task.
    if (state->pmix) keep_pmix_for_join_failure(std::move(state->pmix));
    return joined.error();
  }
  return state;
}

}  // namespace

Result<Pool> try_join(JoinOptions options) {
  static std::atomic<bool> joined{false};
  if (joined.exchange(true)) return invalid_argument("join() was called twice: a process belongs to one pool");
  auto state = join_pool(options, Clock::now());
  if (!state.ok()) return state.error();
  // The secret lets anyone who has it into the pool: once joined, this
  // process needs it no more, and its children (a shell, a data loader,
  // a user's subprocess) should not carry it.
  if (!options.secret) ::unsetenv(contract::kPoolSecret.name);
  return Pool(std::move(state.value()));
}

Pool join(JoinOptions options) {
  // A join that fails throws; left uncaught, that is one line and
  // kJoinFailedExitCode rather than std::terminate's abort.
  if (options.failure_handlers) guard_join_failure();
  auto pool = try_join(std::move(options));
  if (!pool.ok()) note_join_failure(pool.error().message);
  return value_or_throw(std::move(pool));
}

// A failed process never exits 0 (a launcher would count it a success) nor
// outside 1..255: those become 1.
void Pool::fail(const std::string& error, int exit_code) {
  state_->fail(error, exit_code >= 1 && exit_code <= 255 ? exit_code : 1);
}

bool Pool::ending() const {
  const State& s = *state_;
  return s.failing.load() || s.ending.load() || (s.client && s.client->failure().has_value());
}

bool Pool::wait_until_ending(std::chrono::milliseconds bound) {
  const auto until = Clock::now() + bound;
  std::unique_lock lock(state_->mutex);
  // The client's word of a failure notifies `changed`; this process's own
  // failing or ending (set elsewhere without it) is seen within a slice.
  while (!ending()) {
    const auto now = Clock::now();
    if (now >= until) return false;
    state_->changed.wait_until(lock, std::min(until, now + std::chrono::milliseconds(50)));
  }
  return true;
}

void Pool::fail_for_late(const std::vector<int>& late, const std::string& error) { state_->fail_for_late(late, error); }

void Pool::leave() {
  State& s = *state_;
  if (s.left.exchange(true)) return;
  if (s.service) {
    s.service->wait_until_others_left([&](const std::vector<int>& still) {
      log_info("waiting for " + processes_text(still) + " to leave the pool before stopping the coordination service");
    });
  }
  if (s.client) {
    // Unless the failure is this process's own leaving, which its peers
    // waited for: it ends as its program does.
    if (auto failed = s.client->failure(); failed && failed->rank != s.identity.rank) s.end_for_peer(*failed);
    s.client->leave();
  }
  s.stop_watch();
  detach_failure_path(s);
  s.client.reset();
  s.service.reset();
  s.pmix.reset();
}

}  // namespace dew::runtime
