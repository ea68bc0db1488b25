#include "dew/failure_record.h"

#include <span>

#include "dew/hex.h"
#include "dew/text.h"

namespace dew {
namespace {

constexpr std::string_view kWord = " dew-failure 1 ";
constexpr std::size_t kLongestWhy = 4096;

}  // namespace

std::string encode_failure_record(std::string_view tag, const FailureRecord& record) {
  const std::string_view why = std::string_view(record.why).substr(0, kLongestWhy);
  const std::span<const unsigned char> bytes(reinterpret_cast<const unsigned char*>(why.data()), why.size());
  return std::string(tag) + std::string(kWord) + std::to_string(record.rank) + " " + to_hex(bytes);
}

std::optional<FailureRecord> decode_failure_record(std::string_view tag, std::string_view line) {
  if (tag.empty()) return std::nullopt;
  const std::string head = std::string(tag) + std::string(kWord);
  const auto at = line.find(head);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = line.substr(at + head.size());
  while (!rest.empty() && (rest.back() == '\n' || rest.back() == '\r')) rest.remove_suffix(1);
  const auto space = rest.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const auto rank = parse_whole<int>(rest.substr(0, space));
  const auto why = from_hex(rest.substr(space + 1));
  if (!rank || !why || why->size() > kLongestWhy) return std::nullopt;
  return FailureRecord{*rank, *why};
}

}  // namespace dew
