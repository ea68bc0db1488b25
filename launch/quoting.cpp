// Shell quoting: for the remote shell (byte-exact through any POSIX sh) and
// for lines a person reads (--dry-run, error messages).
#include <algorithm>
#include <cstring>

#include "dew/launch_plan.h"

namespace dew::launch {
namespace {

bool plain_word_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::strchr("_@%+=:,./-", c) != nullptr;
}

std::string join_words(const std::vector<std::string>& words, std::string (*quote)(std::string_view)) {
  std::string out;
  for (const auto& word : words) out += (out.empty() ? "" : " ") + quote(word);
  return out;
}

}  // namespace

std::string shell_quote(std::string_view word) {
  if (!word.empty() && std::all_of(word.begin(), word.end(), [](char c) { return plain_word_char(c); })) {
    return std::string(word);
  }
  std::string out = "'";
  for (const char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string display_quote(std::string_view word) {
  const bool control = std::any_of(word.begin(), word.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
  if (!control) return shell_quote(word);
  std::string out = "$'";
  for (const char c : word) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\'':
        out += "\\'";
        break;
      default:
        if (u < 0x20 || u == 0x7f) {
          static constexpr char kDigits[] = "0123456789abcdef";
          out += "\\x";
          out += kDigits[u >> 4];
          out += kDigits[u & 15];
        } else {
          out += c;
        }
    }
  }
  return out + "'";
}

std::string shown(std::string_view value) {
  const std::string quoted = display_quote(value);
  return quoted.rfind("$'", 0) == 0 ? quoted : "'" + std::string(value) + "'";
}

std::string shell_words(const std::vector<std::string>& words) { return join_words(words, shell_quote); }

std::string display_words(const std::vector<std::string>& words) { return join_words(words, display_quote); }

}  // namespace dew::launch
