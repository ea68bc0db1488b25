// Small text rules every library needs the same way: whole numbers written
// as digits only, comma lists, and joining.
#pragma once

#include <charconv>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dew {

// A decimal number of digits only: no sign, spaces, or anything after it.
template <typename Int>
std::optional<Int> parse_whole(std::string_view text) {
  if (text.empty()) return std::nullopt;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  Int value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// "a,b,,c" -> {"a", "b", "", "c"}; "" -> {""}.
std::vector<std::string> split(std::string_view text, char separator);

// "0,2,3" -> {0, 2, 3}, the inverse of join(numbers, ","); nullopt when any
// entry is not a whole number (a UUID, a MIG name, "-1", an empty entry).
std::optional<std::vector<int>> parse_index_list(std::string_view text);

// {"a", "b"} with ", " -> "a, b".
std::string join(const std::vector<std::string>& parts, std::string_view separator);
// {0, 2, 3} with "," -> "0,2,3".
std::string join(const std::vector<int>& numbers, std::string_view separator);

// "1 GPU", "2 GPUs": a count with its noun, singular for one. `plural`
// defaults to the noun with an "s".
std::string counted(long long count, std::string_view noun, std::string_view plural = {});

// True for what srun --dew-pool and dew launch give as DEW_POOL_SECRET: 64
// hex digits (32 random bytes).
bool is_pool_secret(std::string_view text);

// "process 2" or "processes 0,3": the ranks a message is about.
std::string processes_text(const std::vector<int>& ranks);

// A value from outside (a file, a variable, a frame) made safe for a
// one-line message: control and non-ASCII bytes as \xNN, cut after `limit`
// bytes with "...". quoted() adds single quotes around it.
std::string printable(std::string_view text, std::size_t limit = 64);
std::string quoted(std::string_view text, std::size_t limit = 64);

// Text with every line break or other control byte replaced by a space (a
// library's message, such as Gloo's, made one line).
std::string one_line(std::string_view text);

// "host:port", with brackets around a bare IPv6 address: "[fe80::1]:2345".
std::string host_port(std::string_view host, std::string_view port);

// A duration in seconds as people write it: "3 s", "0.5 s", "300 s".
std::string seconds_text(double seconds);
template <typename Rep, typename Period>
std::string seconds_text(std::chrono::duration<Rep, Period> duration) {
  return seconds_text(std::chrono::duration<double>(duration).count());
}

}  // namespace dew
