// The TCP coordination service (hosted by process 0) and its client. Private
// to pool/; Pool (pool.cpp) is the only user.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dew/pool.h"
#include "dew/result.h"
#include "wire.h"

namespace dew::runtime {

// The service puts "<prefix><rank>" when a process leaves the pool (its
// program ended): Pool::a_process_that_left() reads them.
inline constexpr std::string_view kLeftKeyPrefix = "dew/left/";

struct ServiceConfig {
  int size = 1;
  std::string secret;
  std::uint16_t port = 0;  // 0: any free port
  std::chrono::milliseconds heartbeat_timeout{10000};
  // An agreement or gather waiting this long is said, naming whom it waits for.
  std::chrono::milliseconds slow_after{30000};
  // Where the service writes its one-line notices (refused clients, ranks
  // lost). Called on the service's thread.
  std::function<void(const std::string&)> log;
  // A pool under MUNGE: a fresh credential holding the secret, sent with
  // every challenge (munge_auth.h); empty: none. Called on the service's thread.
  std::function<Result<std::string>()> credential;
};

// Key-value, agreements, all-gathers and failure publication for one pool,
// on its own thread (standalone Asio). Every rank, process 0 included,
// talks to it through a CoordinationClient.
class CoordinationService {
 public:
  static Result<std::unique_ptr<CoordinationService>> start(ServiceConfig config);
  ~CoordinationService();
  std::uint16_t port() const;
  // Blocks until a failure has been written to every connected client, or
  // for `bound` at most. For process 0's own failure before it exits.
  void flush_failure(std::chrono::milliseconds bound);
  // The ranks with no connection to the service now (never came, or gone).
  std::vector<int> unconnected_ranks() const;
  // Blocks until every process other than 0 has left (said bye, or was
  // lost after a failure). Calls `waiting` every 10 s with the ranks still in.
  void wait_until_others_left(const std::function<void(const std::vector<int>&)>& waiting);

 private:
  struct Impl;
  explicit CoordinationService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct PeerFailure {
  int rank = 0;
  std::string message;
  // Stopped from outside (a signal: scancel, a time limit, a preemption),
  // not failed: said as a stop. Carried in the frame as its own item, never
  // read from the message's words.
  bool stopped = false;
};

struct ClientConfig {
  std::string host;
  std::uint16_t port = 0;
  int rank = 0;
  int size = 1;
  std::string secret;
  std::chrono::milliseconds heartbeat_timeout{10000};
  // Connecting and the handshake end by this (DEW_JOIN_TIMEOUT_SECONDS from
  // the start of the join); join_timeout is for the messages.
  std::chrono::steady_clock::time_point join_deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  std::chrono::milliseconds join_timeout{300000};
  // Called once, when another process's failure is pushed or the service is
  // lost: on the thread that read it (the client's reader thread, or a caller
  // waiting for its reply) or the heartbeat thread.
  std::function<void(const PeerFailure&)> on_failure;
  // Without a secret: the secret from the credential in the service's
  // challenge (a pool under MUNGE), or an error saying why not.
  std::function<Result<std::string>(const std::string& credential)> secret_from_credential;
  // A service heard after a silence of over half the heartbeat timeout is
  // named as slow, at most once per this.
  std::chrono::milliseconds slow_after{30000};
};

class CoordinationClient {
 public:
  static Result<std::unique_ptr<CoordinationClient>> connect(ClientConfig config);
  ~CoordinationClient();

  void put(const std::string& key, const std::string& value);
  // nullopt: not there within timeout. The calls below return an Error when
  // the pool failed meanwhile (see failure()).
  Result<std::optional<std::string>> get(const std::string& key, std::chrono::milliseconds timeout);
  // Ok, or the ranks that never came (empty vector: came). With
  // `answer_by`, a service that has not answered by then is an Error
  // (kTimeout): for the join's agreement, which must not outwait the join.
  Result<std::vector<int>> agree(const std::string& name, std::chrono::milliseconds patience,
                                 std::optional<std::chrono::steady_clock::time_point> answer_by = std::nullopt);
  Result<Gathered> gather(const std::string& round, const std::string& bytes, std::chrono::milliseconds patience,
                          std::vector<int>& missing);
  // Publishes this process's failure, then half-closes the connection and
  // waits (up to `bound`) until the service has read it and closed its side:
  // a process that exits right after must not have its last frame reset away.
  // `stopped`: a stop from outside (PeerFailure::stopped), not a failure.
  void publish_failure(const std::string& message, std::chrono::milliseconds bound, bool stopped = false);
  // Publishes the failure of another process (`rank`, late to an agreement)
  // as this process knows it; this process then ends as its peer.
  void publish_blame(int rank, const std::string& message);
  // Async-signal-safe: writes a frame prepared by prepare_signal_frame(), if
  // no other thread is in the middle of a write.
  void publish_prepared_from_signal(int slot) noexcept;
  void prepare_signal_frame(int slot, const std::string& message);
  // True while a caller waits for the service's reply (an agreement, a
  // gather, a get): the process waits on its peers.
  bool caller_waiting() const;
  // The failure this client has heard of, if any.
  std::optional<PeerFailure> failure() const;
  // Says bye and closes.
  void leave();

 private:
  struct Impl;
  explicit CoordinationClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dew::runtime
