// Hex text of bytes (libsodium's constant-time encoder), and fresh random
// hex from the system's CSPRNG: pool secrets, nonces' names, private
// directories.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "dew/result.h"

namespace dew {

// Two lowercase hex digits per byte.
std::string to_hex(std::span<const unsigned char> bytes);
// The bytes of hex text (either case); nullopt for an odd length or a byte
// that is not a hex digit.
std::optional<std::string> from_hex(std::string_view text);

// `bytes` random bytes as 2 x bytes hex digits (32 bytes: a pool secret).
// kSystem when libsodium cannot start (no entropy source).
Result<std::string> random_hex(std::size_t bytes);

// A uniformly random 32-bit number from the same source.
Result<std::uint32_t> random_u32();

}  // namespace dew
