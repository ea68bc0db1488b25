#include "dew/text.h"

#include <cstdio>

namespace dew {

std::vector<std::string> split(std::string_view text, char separator) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (;;) {
    const auto at = text.find(separator, start);
    parts.emplace_back(text.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return parts;
    start = at + 1;
  }
}

std::optional<std::vector<int>> parse_index_list(std::string_view text) {
  std::vector<int> out;
  for (const auto& entry : split(text, ',')) {
    const auto value = parse_whole<int>(entry);
    if (!value) return std::nullopt;
    out.push_back(*value);
  }
  return out;
}

std::string join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += separator;
    out += parts[i];
  }
  return out;
}

std::string join(const std::vector<int>& numbers, std::string_view separator) {
  std::vector<std::string> parts;
  parts.reserve(numbers.size());
  for (const int n : numbers) parts.push_back(std::to_string(n));
  return join(parts, separator);
}

std::string processes_text(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "process " : "processes ") + join(ranks, ",");
}

std::string counted(long long count, std::string_view noun, std::string_view plural) {
  std::string out = std::to_string(count) + " ";
  if (count == 1) return out.append(noun);
  if (!plural.empty()) return out.append(plural);
  return out.append(noun).append("s");
}

bool is_pool_secret(std::string_view text) {
  return text.size() == 64 && text.find_first_not_of("0123456789abcdefABCDEF") == std::string_view::npos;
}

std::string printable(std::string_view text, std::size_t limit) {
  constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < limit; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte >= 0x20 && byte < 0x7f) {
      out += static_cast<char>(byte);
    } else {
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    }
  }
  if (text.size() > limit) out += "...";
  return out;
}

std::string quoted(std::string_view text, std::size_t limit) { return "'" + printable(text, limit) + "'"; }

std::string one_line(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  return out;
}

std::string host_port(std::string_view host, std::string_view port) {
  const bool bare_ipv6 = host.find(':') != std::string_view::npos && host.front() != '[';
  std::string out = bare_ipv6 ? "[" + std::string(host) + "]" : std::string(host);
  return out + ":" + std::string(port);
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", seconds);
  return text;
}

}  // namespace dew
