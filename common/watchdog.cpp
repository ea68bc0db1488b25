#include "dew/watchdog.h"

#include <cctype>
#include <cstdint>

#include "dew/task_contract.h"
#include "dew/text.h"

namespace dew {
namespace {

constexpr std::string_view kDurationAllowed = "a duration such as 90s, 30m, 2h or 1h30m (at most 8760h), or off";

// True when `flags` holds `flag` as a word of its own ("--flag" or "--flag=...").
bool sets_flag(const std::string& flags, std::string_view flag) {
  for (auto at = flags.find(flag); at != std::string::npos; at = flags.find(flag, at + 1)) {
    const bool starts_word = at == 0 || std::isspace(static_cast<unsigned char>(flags[at - 1]));
    const auto after = at + flag.size();
    const bool ends_word =
        after == flags.size() || flags[after] == '=' || std::isspace(static_cast<unsigned char>(flags[after]));
    if (starts_word && ends_word) return true;
  }
  return false;
}

}  // namespace

Result<Watchdog> parse_watchdog(std::string_view text, std::string_view name) {
  if (text == "off") return Watchdog{};
  std::chrono::seconds total{0};
  std::string_view rest = text;
  std::string_view units_left = "hms";
  if (rest.empty()) return not_allowed(name, text, kDurationAllowed);
  while (!rest.empty()) {
    const auto digits_end = rest.find_first_not_of("0123456789");
    if (digits_end == 0 || digits_end == std::string_view::npos) return not_allowed(name, text, kDurationAllowed);
    const auto number = parse_whole<std::uint64_t>(rest.substr(0, digits_end));
    const auto unit_at = units_left.find(rest[digits_end]);
    if (!number || unit_at == std::string_view::npos ||
        *number > static_cast<std::uint64_t>(kLongestWatchdog.count())) {
      return not_allowed(name, text, kDurationAllowed);
    }
    const char unit = units_left[unit_at];
    const std::int64_t scale = unit == 'h' ? 3600 : unit == 'm' ? 60 : 1;
    total += std::chrono::seconds(static_cast<std::int64_t>(*number) * scale);
    units_left = units_left.substr(unit_at + 1);
    rest = rest.substr(digits_end + 1);
  }
  if (total <= std::chrono::seconds(0) || total > kLongestWatchdog) return not_allowed(name, text, kDurationAllowed);
  return Watchdog{total};
}

std::string format_duration(std::chrono::seconds duration) {
  const auto seconds = duration.count();
  std::string out;
  if (seconds >= 3600) out += std::to_string(seconds / 3600) + "h";
  if (seconds % 3600 >= 60) out += std::to_string(seconds % 3600 / 60) + "m";
  if (seconds % 60 != 0 || out.empty()) out += std::to_string(seconds % 60) + "s";
  return out;
}

std::optional<std::string> merge_xla_flags(const std::optional<std::string>& xla_flags, const Watchdog& watchdog) {
  if (!watchdog) return std::nullopt;
  const std::string flag = std::string(kXlaWatchdogFlag) + "=" + format_duration(*watchdog);
  if (!xla_flags || xla_flags->find_first_not_of(" \t\n") == std::string::npos) return flag;
  if (sets_flag(*xla_flags, kXlaWatchdogFlag)) return std::nullopt;
  return *xla_flags + " " + flag;
}

Result<Watchdog> chosen_watchdog(std::string_view flag, std::string_view flag_name,
                                 const std::optional<std::string>& inherited) {
  if (!flag.empty()) return parse_watchdog(flag, flag_name);
  if (inherited) return parse_watchdog(*inherited, contract::kWatchdog.name);
  return Watchdog(kDefaultWatchdog);
}

}  // namespace dew
