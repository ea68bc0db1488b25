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

std::optional<std::string> from_hex(std::string_view text) {
  if (text.size() % 2 != 0) return std::nullopt;
  std::string bytes(text.size() / 2, '\0');
  std::size_t length = 0;
  const char* end = nullptr;
  if (sodium_hex2bin(reinterpret_cast<unsigned char*>(bytes.data()), bytes.size(), text.data(), text.size(), nullptr,
                     &length, &end) != 0 ||
      length != bytes.size() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return bytes;
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
