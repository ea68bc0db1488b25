// Parsing of plugstack.conf arguments and srun option values: strict, with
// one-line errors that name the option, the bad value and what is allowed.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>
#include <set>

#include "pool_plan.h"

namespace dew::spank {
namespace {

constexpr unsigned kMaxDevicesPerProcess = 1024;
constexpr std::uint16_t kLowestPort = 1024;
// Longer than any training run; keeps the arithmetic far from overflow.
constexpr std::chrono::seconds kLongestWatchdog = std::chrono::hours(24 * 365);

Error bad_value(std::string_view option, std::string_view value, std::string_view allowed) {
  return Error{std::string(option) + ": '" + std::string(value) + "' is not allowed; allowed: " +
               std::string(allowed)};
}

// A decimal number with no sign, spaces or trailing characters.
template <typename Int>
std::optional<Int> parse_decimal(std::string_view text) {
  if (text.empty() || !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  Int value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

constexpr std::string_view kPortAllowed = "an integer from 1024 to 65535";
constexpr std::string_view kDurationAllowed =
    "a duration such as 90s, 30m, 2h or 1h30m (at most 8760h), or off";

}  // namespace

Result<unsigned> parse_devices_per_process(std::string_view text, std::string_view option) {
  auto value = parse_decimal<unsigned>(text);
  if (!value || *value == 0 || *value > kMaxDevicesPerProcess) {
    return bad_value(option, text, "an integer from 1 to 1024");
  }
  return *value;
}

Result<std::uint16_t> parse_port(std::string_view text, std::string_view option) {
  auto value = parse_decimal<unsigned>(text);
  if (!value || *value < kLowestPort || *value > std::numeric_limits<std::uint16_t>::max()) {
    return bad_value(option, text, kPortAllowed);
  }
  return static_cast<std::uint16_t>(*value);
}

Result<PortRange> parse_port_range(std::string_view text, std::string_view option) {
  constexpr std::string_view allowed = "LOW-HIGH, two ports from 1024 to 65535 with LOW <= HIGH";
  auto dash = text.find('-');
  if (dash == std::string_view::npos) return bad_value(option, text, allowed);
  auto low = parse_port(text.substr(0, dash), option);
  auto high = parse_port(text.substr(dash + 1), option);
  if (!low.ok() || !high.ok() || low.value() > high.value()) return bad_value(option, text, allowed);
  return PortRange{low.value(), high.value()};
}

Result<Watchdog> parse_watchdog(std::string_view text, std::string_view option) {
  if (text == "off") return Watchdog{};
  // A sequence of <digits><unit> with units h, m, s, each at most once and in
  // that order: the forms absl durations (and so XLA) accept.
  std::chrono::seconds total{0};
  std::string_view rest = text;
  std::string_view units_left = "hms";
  if (rest.empty()) return bad_value(option, text, kDurationAllowed);
  while (!rest.empty()) {
    auto digits_end = rest.find_first_not_of("0123456789");
    if (digits_end == 0 || digits_end == std::string_view::npos) {
      return bad_value(option, text, kDurationAllowed);
    }
    auto number = parse_decimal<std::uint64_t>(rest.substr(0, digits_end));
    auto unit_at = units_left.find(rest[digits_end]);
    if (!number || unit_at == std::string_view::npos ||
        *number > static_cast<std::uint64_t>(kLongestWatchdog.count())) {
      return bad_value(option, text, kDurationAllowed);
    }
    const char unit = units_left[unit_at];
    const std::int64_t scale = unit == 'h' ? 3600 : unit == 'm' ? 60 : 1;
    total += std::chrono::seconds(static_cast<std::int64_t>(*number) * scale);
    units_left = units_left.substr(unit_at + 1);
    rest = rest.substr(digits_end + 1);
  }
  if (total <= std::chrono::seconds(0) || total > kLongestWatchdog) {
    return bad_value(option, text, kDurationAllowed);
  }
  return Watchdog{total};
}

std::string format_duration(std::chrono::seconds duration) {
  auto seconds = duration.count();
  std::string out;
  if (seconds >= 3600) out += std::to_string(seconds / 3600) + "h";
  if (seconds % 3600 >= 60) out += std::to_string(seconds % 3600 / 60) + "m";
  if (seconds % 60 != 0 || out.empty()) out += std::to_string(seconds % 60) + "s";
  return out;
}

Result<bool> parse_yes_no(std::string_view text, std::string_view option) {
  if (text == "yes") return true;
  if (text == "no") return false;
  return bad_value(option, text, "yes or no");
}

Result<std::string> parse_coordinator_host(std::string_view text, std::string_view option) {
  constexpr std::string_view allowed =
      "a host name or IPv4 address (letters, digits, '.', '-', '_'; at most 253 characters), or an "
      "IPv6 address in brackets";
  if (text.empty() || text.size() > 253) return bad_value(option, text, allowed);
  if (text.front() == '[') {
    const bool ipv6 = text.size() > 2 && text.back() == ']' &&
                      std::all_of(text.begin() + 1, text.end() - 1, [](char c) {
                        return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.';
                      });
    if (!ipv6) return bad_value(option, text, allowed);
    return std::string(text);
  }
  const bool hostname = std::all_of(text.begin(), text.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
  });
  if (!hostname || text.front() == '-' || text.front() == '.') return bad_value(option, text, allowed);
  return std::string(text);
}

Result<PlugstackConfig> parse_plugstack_args(const std::vector<std::string>& args) {
  constexpr std::string_view allowed_keys =
      "port_range=LOW-HIGH, kill_on_bad_exit=yes|no, watchdog=DURATION|off, devices_per_process=N";
  PlugstackConfig config;
  std::set<std::string, std::less<>> seen;
  for (const auto& arg : args) {
    auto equals = arg.find('=');
    if (equals == std::string::npos) {
      return Error{"plugstack.conf: argument '" + arg + "' is not key=value; allowed: " +
                   std::string(allowed_keys)};
    }
    const std::string key = arg.substr(0, equals);
    const std::string_view value = std::string_view(arg).substr(equals + 1);
    const std::string option = "plugstack.conf " + key;
    if (!seen.insert(key).second) {
      return Error{"plugstack.conf: argument '" + key + "' is given twice; give it once"};
    }
    if (key == "port_range") {
      auto range = parse_port_range(value, option);
      if (!range.ok()) return range.error();
      config.port_range = range.value();
    } else if (key == "kill_on_bad_exit") {
      auto yes = parse_yes_no(value, option);
      if (!yes.ok()) return yes.error();
      config.kill_on_bad_exit = yes.value();
    } else if (key == "watchdog") {
      auto watchdog = parse_watchdog(value, option);
      if (!watchdog.ok()) return watchdog.error();
      config.watchdog = watchdog.value();
    } else if (key == "devices_per_process") {
      auto count = parse_devices_per_process(value, option);
      if (!count.ok()) return count.error();
      config.devices_per_process = count.value();
    } else {
      return Error{"plugstack.conf: unknown argument '" + arg + "'; allowed: " +
                   std::string(allowed_keys)};
    }
  }
  return config;
}

Result<PoolOptions> check_pool_options(PoolOptions options) {
  if (options.pool) return options;
  // Options without --dew-pool would be silently ignored: say so instead.
  std::vector<std::string> orphans;
  if (options.multi_host) orphans.emplace_back("--dew-multi-host");
  if (options.devices_per_process) orphans.emplace_back("--dew-devices-per-process");
  if (options.port) orphans.emplace_back("--dew-port");
  if (options.coordinator) orphans.emplace_back("--dew-coordinator");
  if (options.watchdog) orphans.emplace_back("--dew-watchdog");
  if (options.kill_on_bad_exit) orphans.emplace_back("--dew-kill-on-bad-exit");
  if (orphans.empty()) return options;
  std::string names;
  for (const auto& name : orphans) names += (names.empty() ? "" : ", ") + name;
  return Error{names + " given without --dew-pool; add --dew-pool or drop " +
               (orphans.size() == 1 ? "it" : "them")};
}

}  // namespace dew::spank
