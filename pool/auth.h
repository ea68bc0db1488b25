// Proof that a peer knows the pool secret, without sending it: HMAC-SHA-256
// (libsodium) over a fresh nonce from the other side; then every frame of the
// connection is tagged, so that a relay on the path cannot alter one. Private
// to pool/.
#pragma once

#include <sodium.h>

#include <array>
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

// After the handshake every frame is followed by a 16-byte tag: BLAKE2b keyed
// by the direction's tag key over the frame's sequence number in its
// direction (8 bytes, from 0), the frame's head (its length, type and first
// item) and the hash of its tail (the rest). The sequence number refuses a
// replayed, dropped or reordered frame.
// The tail's hash is Poly1305 (4x BLAKE2b's speed here: at 1024 processes
// every client hashes a 74 KiB gather reply each round) keyed by the pool's
// tail key, one for every connection, so the service hashes a gather's
// shared parts once a round, not once per reply. Poly1305 is a universal
// hash: two tails collide only by chance (< 2^-90 for 74 KiB) for whoever
// lacks the key, and the key comes from the secret. Its outputs never go
// on the wire (only into the keyed BLAKE2b tag), so using one key for many
// tails reveals nothing of it.
inline constexpr std::size_t kTagBytes = 16;
inline constexpr std::size_t kTagKeyBytes = 32;
inline constexpr std::size_t kTailKeyBytes = crypto_onetimeauth_KEYBYTES;
// A direction's key: its tag key, then the pool's tail key.
inline constexpr std::size_t kKeyBytes = kTagKeyBytes + kTailKeyBytes;
using TailHash = std::array<unsigned char, crypto_onetimeauth_BYTES>;
using Tag = std::array<unsigned char, kTagBytes>;

// Keys of one connection, one per direction, from the secret and both
// nonces of its handshake: no two connections (nor two runs) share a tag
// key; every connection of a pool has its tail key.
struct FrameKeys {
  std::string to_service;
  std::string to_client;
};
FrameKeys frame_keys(std::string_view secret, std::string_view service_nonce, std::string_view client_nonce,
                     std::uint64_t rank);
// The pool's tail key (the last kTailKeyBytes of every direction's key).
std::string tail_key(std::string_view secret);

// A tail's hash, fed in pieces (the service's shared parts, a streamed frame).
// `key`: a direction's key, or the tail key alone.
class TailHasher {
 public:
  explicit TailHasher(std::string_view key) noexcept;
  void add(std::string_view bytes) noexcept;
  TailHash finish() noexcept;

 private:
  crypto_onetimeauth_state state_;
};

// The tag of a frame whose head and tail hash are given. Allocates
// nothing: a signal handler tags its last frame with it.
Tag frame_tag(std::string_view key, std::uint64_t sequence, std::string_view head, const TailHash& tail) noexcept;
// The tag of a whole frame (its head is found in it: wire::head_bytes).
Tag frame_tag(std::string_view key, std::uint64_t sequence, std::string_view frame) noexcept;
bool same_tag(const Tag& tag, std::string_view received) noexcept;
// The one line a failed tag ends the pool with, whichever side found it:
// "the connection of process R to the coordination service was altered on
// the way: <what> (a relay or a faulty network between process R and
// process 0)", `what` naming the frame ("its put frame 2 failed ...").
std::string altered_connection(int rank, const std::string& what);

}  // namespace dew::runtime::auth
