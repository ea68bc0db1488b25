// Proof that a peer knows the pool secret, without sending it: HMAC-SHA-256
// (libsodium) over a fresh nonce from the other side. Private to pool/.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dew::runtime::auth {

inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kMacBytes = 32;

// Fails only when libsodium cannot start (no entropy source).
bool ready();
std::string random_nonce();

// The client's proof: MAC(secret, "dew hello" | service nonce | rank | size).
std::string hello_mac(std::string_view secret, std::string_view service_nonce, std::uint64_t rank, std::uint64_t size);
// The service's proof back: MAC(secret, "dew welcome" | client nonce).
std::string welcome_mac(std::string_view secret, std::string_view client_nonce);
// Constant-time comparison.
bool same_mac(std::string_view a, std::string_view b);

}  // namespace dew::runtime::auth
