#include "auth.h"

#include <sodium.h>

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

}  // namespace dew::runtime::auth
