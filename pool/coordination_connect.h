// A joining process's way to the coordination service: connect and prove
// both sides know the pool's secret, every phase bounded by the join's
// deadline, saying every few seconds what it waits for. Private to
// pool/ (coordination_client.cpp is the only user).
#pragma once

#include <asio.hpp>
#include <string>

#include "auth.h"
#include "coordination.h"
#include "dew/result.h"

namespace dew::runtime {

struct ServiceConnection {
  asio::ip::tcp::socket socket;
  std::string leftover;  // bytes read past the handshake: the first frames after it
  auth::FrameKeys keys;  // the connection's tag keys (auth.h)
};

// Errors name the address, the phase (connecting, handshake) and what was
// heard: nothing, bytes no Dew service sends, a refusal, a wrong secret.
// An unresolvable host name fails at once (kNotFound).
Result<ServiceConnection> connect_to_service(asio::io_context& io, const ClientConfig& config);

}  // namespace dew::runtime
