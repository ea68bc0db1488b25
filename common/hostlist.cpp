// Slurm hostlist expansion ("n[1-3,7]", "gpu[01-10]", "r[1-2]-n[1-2]", "a,b").
#include "dew/hostlist.h"

#include <charconv>
#include <cstdint>
#include <optional>

namespace dew {
namespace {

struct NumberRange {
  std::uint64_t low;
  std::uint64_t high;
  std::size_t width;  // zero padding: the width of the lower bound as written
};

Error bad_hostlist(std::string_view hostlist, std::string_view why) {
  return invalid_argument("hostlist '" + std::string(hostlist) + "': " + std::string(why));
}

std::optional<std::uint64_t> parse_number(std::string_view digits) {
  // Nine digits keep every product below 2^64 and exceed any real node count.
  if (digits.empty() || digits.size() > 9) return std::nullopt;
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return value;
}

// "1-3,7,09-11" inside one pair of brackets.
Result<std::vector<NumberRange>> parse_ranges(std::string_view body, std::string_view hostlist) {
  std::vector<NumberRange> ranges;
  std::size_t start = 0;
  while (start <= body.size()) {
    auto comma = body.find(',', start);
    auto item = body.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    auto dash = item.find('-');
    auto low_text = item.substr(0, dash);
    auto high_text = dash == std::string_view::npos ? low_text : item.substr(dash + 1);
    auto low = parse_number(low_text);
    auto high = parse_number(high_text);
    if (!low || !high) {
      return bad_hostlist(hostlist,
                          "'[" + std::string(body) + "]' must hold numbers or ranges LOW-HIGH of up to 9 digits");
    }
    if (*low > *high) {
      return bad_hostlist(hostlist, "range '" + std::string(item) + "' runs backwards");
    }
    ranges.push_back({*low, *high, low_text.size()});
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return ranges;
}

std::string padded(std::uint64_t number, std::size_t width) {
  std::string digits = std::to_string(number);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// One comma-free element such as "r[1-2]-n[01-03]x": the product of its
// bracket groups, the first group varying slowest, as Slurm orders them.
Result<std::vector<std::string>> expand_element(std::string_view element, std::string_view hostlist, std::size_t room) {
  if (element.empty()) return bad_hostlist(hostlist, "empty host name");
  std::vector<std::string> names{""};
  std::size_t at = 0;
  while (at < element.size()) {
    auto open = element.find_first_of("[]", at);
    auto literal = element.substr(at, open == std::string_view::npos ? std::string_view::npos : open - at);
    for (auto& name : names) name += literal;
    if (open == std::string_view::npos) break;
    if (element[open] == ']') return bad_hostlist(hostlist, "']' without '['");
    auto close = element.find_first_of("[]", open + 1);
    if (close == std::string_view::npos || element[close] == '[') {
      return bad_hostlist(hostlist, "'[' without a matching ']'");
    }
    auto ranges = parse_ranges(element.substr(open + 1, close - open - 1), hostlist);
    if (!ranges.ok()) return ranges.error();
    std::size_t count = 0;
    for (const auto& range : ranges.value()) count += range.high - range.low + 1;
    if (count > room || names.size() > room / count) {
      return bad_hostlist(hostlist, "expands to more than the allowed number of hosts");
    }
    std::vector<std::string> product;
    product.reserve(names.size() * count);
    for (const auto& name : names) {
      for (const auto& range : ranges.value()) {
        for (auto n = range.low; n <= range.high; ++n) product.push_back(name + padded(n, range.width));
      }
    }
    names = std::move(product);
    at = close + 1;
  }
  return names;
}

}  // namespace

Result<std::vector<std::string>> expand_hostlist(std::string_view hostlist, std::size_t max_hosts) {
  if (hostlist.empty()) return bad_hostlist(hostlist, "empty");
  std::vector<std::string> hosts;
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= hostlist.size(); ++i) {
    const bool end = i == hostlist.size();
    if (!end && hostlist[i] == '[') ++depth;
    if (!end && hostlist[i] == ']') --depth;
    if (end || (hostlist[i] == ',' && depth == 0)) {
      const std::size_t room = max_hosts - hosts.size();
      auto expanded = expand_element(hostlist.substr(start, i - start), hostlist, room);
      if (!expanded.ok()) return expanded.error();
      if (expanded.value().size() > room) {
        return bad_hostlist(hostlist, "expands to more than the allowed number of hosts");
      }
      hosts.insert(hosts.end(), expanded.value().begin(), expanded.value().end());
      start = i + 1;
    }
  }
  return hosts;
}

}  // namespace dew
