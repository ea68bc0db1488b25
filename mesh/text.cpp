#include "text.h"

#include <cstdio>

namespace dew::mesh {

std::string quote(std::string_view text) {
  constexpr std::size_t kLimit = 60;
  std::string out = "'";
  for (std::size_t i = 0; i < text.size() && i < kLimit; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte >= 0x20 && byte < 0x7f) {
      out += static_cast<char>(byte);
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    }
  }
  if (text.size() > kLimit) out += "...";
  return out + "'";
}

std::string one_line(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  return out;
}

std::string number_text(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", value);
  return buffer;
}

std::string bad_size(std::string_view name, std::string_view value) {
  return "mesh spec: " + std::string(name) + " = " + quote(value) +
         " is not allowed; allowed: a whole number from 1 to " + std::to_string(kMaxSize);
}

}  // namespace dew::mesh
