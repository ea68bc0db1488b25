#include "dew/failure_record.h"

#include <chrono>
#include <span>

#include "dew/hex.h"
#include "dew/text.h"

namespace dew {
namespace {

constexpr std::string_view kWord = " dew-failure 2 ";
constexpr std::size_t kLongestWhy = 4096;
constexpr std::size_t kLongestNode = 255;  // a host name

// Text as hex, "-" when empty: every field holds something.
std::string hex_of(std::string_view text) {
  if (text.empty()) return "-";
  return to_hex(std::span<const unsigned char>(reinterpret_cast<const unsigned char*>(text.data()), text.size()));
}
std::optional<std::string> text_of(std::string_view field) {
  return field == "-" ? std::optional<std::string>("") : from_hex(field);
}

// The next space-separated field of `rest`, taken from it; nullopt at the end.
std::optional<std::string_view> take_field(std::string_view& rest) {
  if (rest.empty()) return std::nullopt;
  const auto space = rest.find(' ');
  const std::string_view field = rest.substr(0, space);
  rest = space == std::string_view::npos ? std::string_view() : rest.substr(space + 1);
  return field;
}

}  // namespace

std::int64_t failure_seen_now_us() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return std::max<std::int64_t>(0, std::chrono::duration_cast<std::chrono::microseconds>(now).count());
}

std::string encode_failure_record(std::string_view tag, const FailureRecord& record) {
  const std::string code = record.exit_code ? std::to_string(*record.exit_code) : "-";
  return std::string(tag) + std::string(kWord) + std::to_string(record.rank) + " " + code + " " +
         hex_of(std::string_view(record.node).substr(0, kLongestNode)) + " " + std::to_string(record.seen_at_us) + " " +
         hex_of(std::string_view(record.why).substr(0, kLongestWhy));
}

std::optional<FailureRecord> decode_failure_record(std::string_view tag, std::string_view line) {
  if (tag.empty()) return std::nullopt;
  const std::string head = std::string(tag) + std::string(kWord);
  const auto at = line.find(head);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = line.substr(at + head.size());
  while (!rest.empty() && (rest.back() == '\n' || rest.back() == '\r')) rest.remove_suffix(1);
  const auto rank_field = take_field(rest), code_field = take_field(rest), node_field = take_field(rest),
             seen_field = take_field(rest), why_field = take_field(rest);
  if (!why_field || !rest.empty()) return std::nullopt;  // five fields, no more
  FailureRecord record;
  const auto rank = parse_whole<int>(*rank_field);
  const auto seen = parse_whole<std::int64_t>(*seen_field);
  const auto node = text_of(*node_field);
  const auto why = text_of(*why_field);
  if (!rank || !seen || !node || !why || why->size() > kLongestWhy || node->size() > kLongestNode) {
    return std::nullopt;
  }
  if (*code_field != "-") {
    const auto code = parse_whole<int>(*code_field);
    if (!code || *code < 0 || *code > 255) return std::nullopt;
    record.exit_code = *code;
  }
  record.rank = *rank;
  record.why = *why;
  record.node = *node;
  record.seen_at_us = *seen;
  return record;
}

}  // namespace dew
