#include "dew/hex.h"

#include <sodium.h>

#include <vector>

namespace dew {

std::string to_hex(std::span<const unsigned char> bytes) {
  std::string text(bytes.size() * 2 + 1, '\0');
  sodium_bin2hex(text.data(), text.size(), bytes.data(), bytes.size());
  text.pop_back();  // the terminating NUL
  return text;
}

Result<std::string> random_hex(std::size_t bytes) {
  if (sodium_init() < 0) return system_error("libsodium could not start: no entropy source");
  std::vector<unsigned char> buffer(bytes);
  randombytes_buf(buffer.data(), buffer.size());
  auto text = to_hex(buffer);
  sodium_memzero(buffer.data(), buffer.size());
  return text;
}

Result<std::uint32_t> random_u32() {
  if (sodium_init() < 0) return system_error("libsodium could not start: no entropy source");
  return randombytes_random();
}

}  // namespace dew
