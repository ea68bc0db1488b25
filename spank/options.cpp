// Parsing of plugstack.conf arguments and srun option values: strict, with
// one-line errors that name the option, the bad value and what is allowed.
#include <algorithm>
#include <cctype>
#include <limits>
#include <set>

#include "dew/coordinator_port.h"
#include "dew/gpu_binding.h"
#include "dew/text.h"
#include "pool_plan.h"

namespace dew::spank {
namespace {

constexpr std::string_view kPortAllowed = "an integer from 1024 to 65535";

}  // namespace

Result<unsigned> parse_devices_per_process(std::string_view text, std::string_view option) {
  auto value = parse_whole<unsigned>(text);
  if (!value || *value == 0 || *value > kMaxDevicesPerProcess) {
    return not_allowed(option, text, "an integer from 1 to 1024");
  }
  return *value;
}

Result<std::uint16_t> parse_port(std::string_view text, std::string_view option) {
  auto value = parse_whole<unsigned>(text);
  if (!value || *value < kLowestPort || *value > std::numeric_limits<std::uint16_t>::max()) {
    return not_allowed(option, text, kPortAllowed);
  }
  return static_cast<std::uint16_t>(*value);
}

Result<PortRange> parse_port_range(std::string_view text, std::string_view option) {
  constexpr std::string_view allowed = "LOW-HIGH, two ports from 1024 to 65535 with LOW <= HIGH";
  auto dash = text.find('-');
  if (dash == std::string_view::npos) return not_allowed(option, text, allowed);
  auto low = parse_port(text.substr(0, dash), option);
  auto high = parse_port(text.substr(dash + 1), option);
  if (!low.ok() || !high.ok() || low.value() > high.value()) return not_allowed(option, text, allowed);
  return PortRange{low.value(), high.value()};
}

Result<bool> parse_yes_no(std::string_view text, std::string_view option) {
  if (text == "yes") return true;
  if (text == "no") return false;
  return not_allowed(option, text, "yes or no");
}

Result<std::string> parse_coordinator_host(std::string_view text, std::string_view option) {
  constexpr std::string_view allowed =
      "a host name or IPv4 address (letters, digits, '.', '-', '_'; at most 253 characters), or an "
      "IPv6 address in brackets";
  if (text.empty() || text.size() > 253) return not_allowed(option, text, allowed);
  if (text.front() == '[') {
    const bool ipv6 =
        text.size() > 2 && text.back() == ']' && std::all_of(text.begin() + 1, text.end() - 1, [](char c) {
          return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.';
        });
    if (!ipv6) return not_allowed(option, text, allowed);
    return std::string(text);
  }
  const bool hostname = std::all_of(text.begin(), text.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
  });
  if (!hostname || text.front() == '-' || text.front() == '.') return not_allowed(option, text, allowed);
  return std::string(text);
}

Result<PlugstackConfig> parse_plugstack_args(const std::vector<std::string>& args) {
  constexpr std::string_view allowed_keys =
      "port_range=LOW-HIGH, framework_port_range=LOW-HIGH, kill_on_bad_exit=yes|no, watchdog=DURATION|off, "
      "devices_per_process=N";
  PlugstackConfig config;
  std::set<std::string, std::less<>> seen;
  for (const auto& arg : args) {
    auto equals = arg.find('=');
    if (equals == std::string::npos) {
      return invalid_argument("plugstack.conf: argument '" + arg +
                              "' is not key=value; allowed: " + std::string(allowed_keys));
    }
    const std::string key = arg.substr(0, equals);
    const std::string_view value = std::string_view(arg).substr(equals + 1);
    const std::string option = "plugstack.conf " + key;
    if (!seen.insert(key).second) {
      return invalid_argument("plugstack.conf: argument '" + key + "' is given twice; give it once");
    }
    if (key == "port_range") {
      auto range = parse_port_range(value, option);
      if (!range.ok()) return range.error();
      config.port_range = range.value();
    } else if (key == "framework_port_range") {
      auto range = parse_port_range(value, option);
      if (!range.ok()) return range.error();
      config.framework_port_range = range.value();
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
      return invalid_argument("plugstack.conf: unknown argument '" + arg + "'; allowed: " + std::string(allowed_keys));
    }
  }
  if (auto apart = check_framework_range(config.port_range, config.framework_port_range); !apart.ok()) {
    return apart.error().prefixed("plugstack.conf: ");
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
  const std::string names = join(orphans, ", ");
  return invalid_argument(names + " given without --dew-pool; add --dew-pool or drop " +
                          (orphans.size() == 1 ? "it" : "them"));
}

Result<Done> note_option(SeenOptions& seen, std::string_view option, std::string_view text) {
  const auto [at, added] = seen.emplace(std::string(option), std::string(text));
  if (added || at->second == text) return Done{};
  return invalid_argument(std::string(option) + " was given twice, as " + quoted(at->second) + " and " + quoted(text) +
                          "; allowed: one value (or the same one again)");
}

}  // namespace dew::spank
