#include "auth.h"

#include <algorithm>

#include "wire.h"

namespace dew::runtime::auth {
namespace {

// The key is a hash of the secret, so a secret of any length (the plugin's
// 64 hex digits, a user's passphrase) gives a full-size HMAC key.
std::string mac(std::string_view secret, std::string_view message) {
  unsigned char key[crypto_auth_hmacsha256_KEYBYTES];
  crypto_generichash(key, sizeof key, reinterpret_cast<const unsigned char*>(secret.data()), secret.size(),
                     reinterpret_cast<const unsigned char*>("dew pool key"), 12);
  unsigned char out[crypto_auth_hmacsha256_BYTES];
  crypto_auth_hmacsha256(out, reinterpret_cast<const unsigned char*>(message.data()), message.size(), key);
  sodium_memzero(key, sizeof key);
  return std::string(reinterpret_cast<const char*>(out), sizeof out);
}

}  // namespace

bool ready() { return sodium_init() >= 0; }

std::string random_nonce() {
  std::string nonce(kNonceBytes, '\0');
  randombytes_buf(nonce.data(), nonce.size());
  return nonce;
}

std::string hello_mac(std::string_view secret, std::string_view service_nonce, std::uint64_t rank, std::uint64_t size) {
  std::string message = "dew hello|";
  message += service_nonce;
  message += wire::encode_u64(rank);
  message += wire::encode_u64(size);
  return mac(secret, message);
}

std::string welcome_mac(std::string_view secret, std::string_view client_nonce) {
  std::string message = "dew welcome|";
  message += client_nonce;
  return mac(secret, message);
}

bool same_mac(std::string_view a, std::string_view b) {
  return a.size() == b.size() && a.size() == kMacBytes && sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

namespace {

const unsigned char* bytes_of(std::string_view text) { return reinterpret_cast<const unsigned char*>(text.data()); }

std::string derived_key(std::string_view secret, std::string_view purpose, std::string_view message,
                        std::size_t bytes) {
  unsigned char pool_key[crypto_generichash_KEYBYTES];
  crypto_generichash(pool_key, sizeof pool_key, bytes_of(secret), secret.size(), bytes_of(purpose), purpose.size());
  std::string key(bytes, '\0');
  crypto_generichash(reinterpret_cast<unsigned char*>(key.data()), key.size(), bytes_of(message), message.size(),
                     pool_key, sizeof pool_key);
  sodium_memzero(pool_key, sizeof pool_key);
  return key;
}

std::string direction_key(std::string_view secret, std::string_view direction, std::string_view service_nonce,
                          std::string_view client_nonce, std::uint64_t rank) {
  std::string message(direction);
  message += '|';
  message += service_nonce;
  message += client_nonce;
  message += wire::encode_u64(rank);
  return derived_key(secret, "dew frame keys", message, kTagKeyBytes) + tail_key(secret);
}

// The tail key of `key`: a direction's (its last bytes) or the tail key
// itself. Never shorter (the keys are made here); all zeros rather than a
// read past a shorter one.
const unsigned char* tail_key_of(std::string_view key) noexcept {
  static constexpr unsigned char kNoKey[kTailKeyBytes] = {};
  return key.size() < kTailKeyBytes ? kNoKey : bytes_of(key.substr(key.size() - kTailKeyBytes));
}

}  // namespace

FrameKeys frame_keys(std::string_view secret, std::string_view service_nonce, std::string_view client_nonce,
                     std::uint64_t rank) {
  return FrameKeys{direction_key(secret, "to service", service_nonce, client_nonce, rank),
                   direction_key(secret, "to client", service_nonce, client_nonce, rank)};
}

std::string tail_key(std::string_view secret) { return derived_key(secret, "dew tail key", "tail", kTailKeyBytes); }

TailHasher::TailHasher(std::string_view key) noexcept { crypto_onetimeauth_init(&state_, tail_key_of(key)); }

void TailHasher::add(std::string_view bytes) noexcept {
  crypto_onetimeauth_update(&state_, bytes_of(bytes), bytes.size());
}

TailHash TailHasher::finish() noexcept {
  TailHash hash{};
  crypto_onetimeauth_final(&state_, hash.data());
  return hash;
}

Tag frame_tag(std::string_view key, std::uint64_t sequence, std::string_view head, const TailHash& tail) noexcept {
  unsigned char number[8];
  for (int i = 0; i < 8; ++i) number[i] = static_cast<unsigned char>(sequence >> (56 - 8 * i));
  crypto_generichash_state state;
  crypto_generichash_init(&state, bytes_of(key), std::min(key.size(), kTagKeyBytes), kTagBytes);
  crypto_generichash_update(&state, number, sizeof number);
  crypto_generichash_update(&state, bytes_of(head), head.size());
  crypto_generichash_update(&state, tail.data(), tail.size());
  Tag tag{};
  crypto_generichash_final(&state, tag.data(), tag.size());
  return tag;
}

Tag frame_tag(std::string_view key, std::uint64_t sequence, std::string_view frame) noexcept {
  const std::size_t head = wire::head_bytes(frame);
  TailHasher tail(key);
  tail.add(frame.substr(head));
  return frame_tag(key, sequence, frame.substr(0, head), tail.finish());
}

std::string altered_connection(int rank, const std::string& what) {
  const std::string process = "process " + std::to_string(rank);
  return "the connection of " + process + " to the coordination service was altered on the way: " + what +
         " (a relay or a faulty network between " + process + " and process 0)";
}

bool same_tag(const Tag& tag, std::string_view received) noexcept {
  return received.size() == tag.size() && sodium_memcmp(tag.data(), received.data(), tag.size()) == 0;
}

}  // namespace dew::runtime::auth
