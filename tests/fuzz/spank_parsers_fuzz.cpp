// libFuzzer target for the pure core of spank_dew.so (spank/pool_plan.h):
// every parser and planner gets hostile text and hostile numbers, and each
// result is checked against invariants (and, for the small parsers, against
// an independent reference implementation). A violated invariant traps.
//
// Input layout: byte 0 selects the mode (see kModes; the letters are what the
// seed corpus uses, any other byte maps to a mode by its value modulo the
// number of modes). Modes that need numbers or flags take them from the END
// of the input, so the text at the front stays readable in seeds; the text is
// split on '\n' and '\0' where a mode needs several strings.
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "dew/exit_status.h"
#include "dew/failure_record.h"
#include "dew/hex.h"
#include "dew/hostlist.h"
#include "dew/text.h"
#include "fuzz_check.h"
#include "pool_plan.h"
#include "step_verdict.h"

namespace dew::spank {
namespace {

// ------------------------------------------------------------ plumbing ---

constexpr std::int64_t kLongestWatchdogSeconds = 24 * 365 * 3600;

// Consumes numbers and flags from the end of the input; the front is text.
class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  std::uint8_t byte() {
    if (size_ == 0) return 0;
    return data_[--size_];
  }
  std::uint16_t u16() {
    const unsigned high = byte();
    return static_cast<std::uint16_t>(high << 8 | byte());
  }
  std::uint32_t u32() {
    std::uint32_t value = 0;
    for (int i = 0; i < 4; ++i) value = (value << 8) | byte();
    return value;
  }
  [[nodiscard]] std::string_view text() const { return {reinterpret_cast<const char*>(data_), size_}; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
};

// Pieces between '\n' and '\0' separators; no pieces for empty text.
std::vector<std::string> split_fields(std::string_view text) {
  std::vector<std::string> fields;
  if (text.empty()) return fields;
  constexpr std::string_view kSeparators("\n\0", 2);
  std::size_t start = 0;
  while (true) {
    auto at = text.find_first_of(kSeparators, start);
    fields.emplace_back(text.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) break;
    start = at + 1;
  }
  return fields;
}

std::vector<std::string> split_commas(std::string_view text) {
  std::vector<std::string> pieces;
  std::size_t start = 0;
  while (true) {
    auto at = text.find(',', start);
    pieces.emplace_back(text.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) break;
    start = at + 1;
  }
  return pieces;
}

std::string local_ids(std::size_t count) {
  std::string out;
  for (std::size_t i = 0; i < count; ++i) out += (i == 0 ? "" : ",") + std::to_string(i);
  return out;
}

// Every error: a message that is not empty, and one line unless the input
// itself had a newline (messages quote the bad value).
void check_error(const Error& error, std::string_view input) {
  FUZZ_CHECK(!error.message.empty());
  if (input.find('\n') == std::string_view::npos) FUZZ_CHECK(error.message.find('\n') == std::string::npos);
}

// An srun/plugstack option parser's error names the option.
void check_option_error(const Error& error, std::string_view input, std::string_view option) {
  check_error(error, input);
  FUZZ_CHECK(error.message.find(option) != std::string::npos);
}

// ------------------------------------------------- reference parsers ---
// Written independently of spank/options.cpp from the documented grammar.

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_xdigit(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// Unsigned decimal without sign or spaces; saturates far above every limit.
std::optional<std::uint64_t> ref_decimal(std::string_view text) {
  if (text.empty()) return std::nullopt;
  constexpr std::uint64_t kSaturated = 1'000'000'000'000ULL;
  std::uint64_t value = 0;
  for (char c : text) {
    if (!is_digit(c)) return std::nullopt;
    value = std::min<std::uint64_t>(value * 10 + static_cast<std::uint64_t>(c - '0'), kSaturated);
  }
  return value;
}

std::optional<std::uint16_t> ref_port(std::string_view text) {
  auto value = ref_decimal(text);
  if (!value || *value < 1024 || *value > 65535) return std::nullopt;
  return static_cast<std::uint16_t>(*value);
}

std::optional<unsigned> ref_devices(std::string_view text) {
  auto value = ref_decimal(text);
  if (!value || *value == 0 || *value > 1024) return std::nullopt;
  return static_cast<unsigned>(*value);
}

std::optional<PortRange> ref_port_range(std::string_view text) {
  auto dash = text.find('-');
  if (dash == std::string_view::npos) return std::nullopt;
  auto low = ref_port(text.substr(0, dash));
  auto high = ref_port(text.substr(dash + 1));
  if (!low || !high || *low > *high) return std::nullopt;
  return PortRange{*low, *high};
}

// nullopt: invalid; a nullopt Watchdog inside: "off".
std::optional<Watchdog> ref_watchdog(std::string_view text) {
  if (text == "off") return Watchdog{};
  if (text.empty()) return std::nullopt;
  constexpr std::string_view kUnits = "hms";
  std::size_t next_unit = 0;
  std::int64_t total = 0;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t digits_end = at;
    while (digits_end < text.size() && is_digit(text[digits_end])) ++digits_end;
    if (digits_end == at || digits_end == text.size()) return std::nullopt;
    auto unit = kUnits.find(text[digits_end], next_unit);
    auto number = ref_decimal(text.substr(at, digits_end - at));
    if (unit == std::string_view::npos || !number || *number > static_cast<std::uint64_t>(kLongestWatchdogSeconds)) {
      return std::nullopt;
    }
    const std::int64_t scale = unit == 0 ? 3600 : unit == 1 ? 60 : 1;
    total += static_cast<std::int64_t>(*number) * scale;
    next_unit = unit + 1;
    at = digits_end + 1;
  }
  if (total <= 0 || total > kLongestWatchdogSeconds) return std::nullopt;
  return Watchdog{std::chrono::seconds(total)};
}

bool ref_coordinator_ok(std::string_view text) {
  if (text.empty() || text.size() > 253) return false;
  if (text.front() == '[') {
    if (text.size() <= 2 || text.back() != ']') return false;
    return std::all_of(text.begin() + 1, text.end() - 1, [](char c) { return is_xdigit(c) || c == ':' || c == '.'; });
  }
  if (text.front() == '-' || text.front() == '.') return false;
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return is_alpha(c) || is_digit(c) || c == '.' || c == '-' || c == '_'; });
}

// ----------------------------------------------------- single parsers ---

std::optional<unsigned> fuzz_devices_per_process(std::string_view text, std::string_view input) {
  constexpr std::string_view option = "--dew-devices-per-process";
  auto result = parse_devices_per_process(text, option);
  auto expected = ref_devices(text);
  FUZZ_CHECK(result.ok() == expected.has_value());
  if (!result.ok()) {
    check_option_error(result.error(), input, option);
    return std::nullopt;
  }
  FUZZ_CHECK(result.value() >= 1 && result.value() <= 1024);
  FUZZ_CHECK(result.value() == *expected);
  return result.value();
}

std::optional<std::uint16_t> fuzz_port(std::string_view text, std::string_view input) {
  constexpr std::string_view option = "--dew-port";
  auto result = parse_port(text, option);
  auto expected = ref_port(text);
  FUZZ_CHECK(result.ok() == expected.has_value());
  if (!result.ok()) {
    check_option_error(result.error(), input, option);
    return std::nullopt;
  }
  FUZZ_CHECK(result.value() >= 1024);  // and <= 65535 by its type
  FUZZ_CHECK(result.value() == *expected);
  auto again = parse_port(std::to_string(result.value()), option);
  FUZZ_CHECK(again.ok() && again.value() == result.value());
  return result.value();
}

void fuzz_port_range(std::string_view text, std::string_view input) {
  constexpr std::string_view option = "plugstack.conf port_range";
  auto result = parse_port_range(text, option);
  auto expected = ref_port_range(text);
  FUZZ_CHECK(result.ok() == expected.has_value());
  if (!result.ok()) {
    check_option_error(result.error(), input, option);
    return;
  }
  FUZZ_CHECK(result.value() == *expected);
  FUZZ_CHECK(result.value().low >= 1024 && result.value().low <= result.value().high);
}

std::optional<Watchdog> fuzz_watchdog(std::string_view text, std::string_view input) {
  constexpr std::string_view option = "--dew-watchdog";
  auto result = parse_watchdog(text, option);
  auto expected = ref_watchdog(text);
  FUZZ_CHECK(result.ok() == expected.has_value());
  if (!result.ok()) {
    check_option_error(result.error(), input, option);
    return std::nullopt;
  }
  FUZZ_CHECK(result.value() == *expected);
  FUZZ_CHECK(result.value().has_value() == (text != "off"));
  if (result.value()) {
    const auto seconds = result.value()->count();
    FUZZ_CHECK(seconds >= 1 && seconds <= kLongestWatchdogSeconds);
    // What the plugin hands to XLA parses back to the same duration.
    const std::string formatted = format_duration(*result.value());
    FUZZ_CHECK(!formatted.empty() && formatted.find_first_not_of("0123456789hms") == std::string::npos);
    auto again = parse_watchdog(formatted, option);
    FUZZ_CHECK(again.ok() && again.value() == result.value());
  }
  return result.value();
}

std::optional<bool> fuzz_yes_no(std::string_view text, std::string_view input) {
  constexpr std::string_view option = "--dew-kill-on-bad-exit";
  auto result = parse_yes_no(text, option);
  FUZZ_CHECK(result.ok() == (text == "yes" || text == "no"));
  if (!result.ok()) {
    check_option_error(result.error(), input, option);
    return std::nullopt;
  }
  FUZZ_CHECK(result.value() == (text == "yes"));
  return result.value();
}

std::optional<std::string> fuzz_coordinator(std::string_view text, std::string_view input) {
  constexpr std::string_view option = "--dew-coordinator";
  auto result = parse_coordinator_host(text, option);
  FUZZ_CHECK(result.ok() == ref_coordinator_ok(text));
  if (!result.ok()) {
    check_option_error(result.error(), input, option);
    return std::nullopt;
  }
  FUZZ_CHECK(result.value() == text);
  return result.value();
}

// ------------------------------------------------------------ hostlist ---

void fuzz_hostlist(std::string_view text, std::string_view input) {
  constexpr std::size_t kMax = 4096;
  auto result = expand_hostlist(text, kMax);
  if (!result.ok()) {
    check_error(result.error(), input);
    // Without brackets a hostlist is a plain comma list: it fails only for an
    // empty name (or too many names).
    if (!text.empty() && text.find_first_of("[]") == std::string_view::npos) {
      auto names = split_commas(text);
      FUZZ_CHECK(names.size() > kMax ||
                 std::any_of(names.begin(), names.end(), [](const std::string& n) { return n.empty(); }));
    }
    return;
  }
  const auto& hosts = result.value();
  FUZZ_CHECK(!hosts.empty() && hosts.size() <= kMax);
  for (const auto& host : hosts) {
    FUZZ_CHECK(!host.empty());
    FUZZ_CHECK(host.find_first_of(",[]") == std::string::npos);
  }
  if (text.find_first_of("[]") == std::string_view::npos) FUZZ_CHECK(hosts == split_commas(text));
  // The limit is exact: the same list fits max_hosts = its size, and not one less.
  auto exact = expand_hostlist(text, hosts.size());
  FUZZ_CHECK(exact.ok() && exact.value() == hosts);
  if (hosts.size() >= 2) {
    auto fewer = expand_hostlist(text, hosts.size() - 1);
    FUZZ_CHECK(!fewer.ok());
    check_error(fewer.error(), input);
  }
}

// ---------------------------------------------------------- plugstack ---

void fuzz_plugstack(const std::vector<std::string>& args, std::string_view input) {
  auto result = parse_plugstack_args(args);
  // The reference: each argument key=value, each key once, each value valid.
  PlugstackConfig expected;
  bool expected_ok = true;
  std::set<std::string> seen;
  for (const auto& arg : args) {
    auto equals = arg.find('=');
    if (equals == std::string::npos) {
      expected_ok = false;
      break;
    }
    const std::string key = arg.substr(0, equals);
    const std::string_view value = std::string_view(arg).substr(equals + 1);
    if (!seen.insert(key).second) {
      expected_ok = false;
      break;
    }
    if (key == "port_range") {
      auto range = ref_port_range(value);
      if (!range)
        expected_ok = false;
      else
        expected.port_range = *range;
    } else if (key == "kill_on_bad_exit") {
      if (value != "yes" && value != "no")
        expected_ok = false;
      else
        expected.kill_on_bad_exit = value == "yes";
    } else if (key == "watchdog") {
      auto watchdog = ref_watchdog(value);
      if (!watchdog)
        expected_ok = false;
      else
        expected.watchdog = *watchdog;
    } else if (key == "devices_per_process") {
      auto count = ref_devices(value);
      if (!count)
        expected_ok = false;
      else
        expected.devices_per_process = *count;
    } else {
      expected_ok = false;
    }
    if (!expected_ok) break;
  }
  // The two ranges never share a port (framework_port_range: only its
  // default is known here, the key itself is then a parse the plugin checks).
  if (expected_ok && input.find("framework_port_range") == std::string_view::npos &&
      !(expected.port_range.high < dew::kFrameworkPortRange.low ||
        expected.port_range.low > dew::kFrameworkPortRange.high)) {
    expected_ok = false;
  }
  if (input.find("framework_port_range") != std::string_view::npos) return;  // not modelled here
  FUZZ_CHECK(result.ok() == expected_ok);
  if (!result.ok()) {
    check_error(result.error(), input);
    FUZZ_CHECK(result.error().message.find("plugstack.conf") != std::string::npos);
  } else {
    const auto& config = result.value();
    FUZZ_CHECK(config.port_range == expected.port_range);
    FUZZ_CHECK(config.kill_on_bad_exit == expected.kill_on_bad_exit);
    FUZZ_CHECK(config.watchdog == expected.watchdog);
    FUZZ_CHECK(config.devices_per_process == expected.devices_per_process);
  }
  // The order of the arguments does not matter to whether they are valid.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  auto again = parse_plugstack_args(reversed);
  FUZZ_CHECK(again.ok() == result.ok());
}

// ---------------------------------------------------------------- port ---

PortRange range_from(std::uint16_t a, std::uint16_t b) { return PortRange{std::min(a, b), std::max(a, b)}; }

void fuzz_derive_port(Bytes& bytes) {
  const std::uint32_t job = bytes.u32();
  const std::uint32_t step = bytes.u32();
  const PortRange range = range_from(bytes.u16(), bytes.u16());
  const std::uint32_t span = static_cast<std::uint32_t>(range.high) - range.low + 1;
  const auto port = derive_port(job, step, range);
  FUZZ_CHECK(port >= range.low && port <= range.high);
  const std::uint32_t offset = static_cast<std::uint32_t>(port - range.low);
  // Consecutive steps of a job: consecutive ports, wrapping in the range.
  if (step != UINT32_MAX) {
    FUZZ_CHECK(derive_port(job, step + 1, range) == range.low + (offset + 1) % span);
  }
  // The next job's block starts 32 ports later (mod the range).
  if (job != UINT32_MAX) {
    FUZZ_CHECK(derive_port(job + 1, step, range) == range.low + (offset + 32) % span);
  }
}

// --------------------------------------------------------- GPU binding ---

// bind_gpus against the documented rules, for any input.
void check_binding(const GpuBindingInput& input, const Result<GpuBinding>& result, std::string_view raw) {
  std::vector<std::string> tokens;
  const auto& visible = input.visible_devices;
  if (visible && !visible->empty() && *visible != "NoDevFiles") tokens = split_commas(*visible);
  const bool empty_token = std::any_of(tokens.begin(), tokens.end(), [](const std::string& t) { return t.empty(); });
  if (empty_token) {
    FUZZ_CHECK(!result.ok());
    check_error(result.error(), raw);
    return;
  }
  if (input.bound_by_slurm || !input.devices_per_process) {
    FUZZ_CHECK(result.ok());
    FUZZ_CHECK(!result.value().visible_devices);
    if (tokens.empty())
      FUZZ_CHECK(!result.value().local_device_ids);
    else
      FUZZ_CHECK(result.value().local_device_ids == local_ids(tokens.size()));
    return;
  }
  const std::uint64_t per_task = *input.devices_per_process;
  const std::uint64_t task = input.local_process;
  // Every local process of the node fits (none starts otherwise):
  // processes * per_task <= tokens, without overflow.
  const std::uint64_t processes = std::max<std::uint64_t>(input.local_process_count, task + 1);
  const bool fits = per_task == 0 || processes <= tokens.size() / per_task;
  FUZZ_CHECK(result.ok() == fits);
  if (!result.ok()) {
    check_error(result.error(), raw);
    return;
  }
  const auto& binding = result.value();
  FUZZ_CHECK(binding.visible_devices.has_value());
  // At most devices_per_process tokens: exactly that many, the task's slice.
  if (per_task == 0) {
    FUZZ_CHECK(binding.visible_devices->empty() && !binding.local_device_ids);
    return;
  }
  auto mine = split_commas(*binding.visible_devices);
  FUZZ_CHECK(mine.size() == per_task);
  FUZZ_CHECK(std::equal(mine.begin(), mine.end(), tokens.begin() + static_cast<std::ptrdiff_t>(task * per_task)));
  FUZZ_CHECK(binding.local_device_ids == local_ids(per_task));
}

void fuzz_bind_gpus(Bytes& bytes) {
  const std::uint8_t flags = bytes.byte();
  GpuBindingInput input;
  input.local_process = bytes.u32();
  input.local_process_count = bytes.u32();
  unsigned per_task = bytes.u32();
  if (flags & 0x08) {  // small numbers, where the interesting successes are
    input.local_process %= 8;
    input.local_process_count %= 9;
    per_task %= 9;  // 0 included: outside what the parsers give, still no UB
  }
  input.bound_by_slurm = flags & 0x01;
  if (flags & 0x02) input.devices_per_process = per_task;
  if (!(flags & 0x04)) input.visible_devices = std::string(bytes.text());
  check_binding(input, bind_gpus(input), bytes.text());
}

void fuzz_slurm_bound(Bytes& bytes) {
  const std::uint8_t flags = bytes.byte();
  auto fields = split_fields(bytes.text());
  std::optional<std::string> tres_bind;
  std::optional<std::string> gpus_per_task;
  if (!fields.empty() && !(flags & 0x01)) tres_bind = fields[0];
  if (fields.size() > 1 && !(flags & 0x02)) gpus_per_task = fields[1];
  const bool expected =
      (tres_bind && tres_bind->find("gpu:") != std::string::npos) || (gpus_per_task && !gpus_per_task->empty());
  FUZZ_CHECK(slurm_bound_gpus(tres_bind, gpus_per_task) == expected);
}

// ----------------------------------------------------------- XLA flags ---

void check_xla(const std::optional<std::string>& flags, const Watchdog& watchdog) {
  auto merged = merge_xla_flags(flags, watchdog);
  if (!watchdog) {
    FUZZ_CHECK(!merged);
    return;
  }
  const std::string flag = std::string(kXlaWatchdogFlag) + "=" + format_duration(*watchdog);
  const bool blank = !flags || flags->find_first_not_of(" \t\n") == std::string::npos;
  if (blank) {
    FUZZ_CHECK(merged == flag);
    return;
  }
  if (!merged) {
    // Left alone only because the flags already name the watchdog flag.
    FUZZ_CHECK(flags->find(kXlaWatchdogFlag) != std::string::npos);
    return;
  }
  FUZZ_CHECK(*merged == *flags + " " + flag);
  // Merging is idempotent: what it produced already sets the flag.
  FUZZ_CHECK(!merge_xla_flags(merged, watchdog));
}

Watchdog watchdog_from(std::uint32_t raw) {
  if (raw == 0) return Watchdog{};
  return std::chrono::seconds(1 + raw % kLongestWatchdogSeconds);
}

void fuzz_xla(Bytes& bytes) {
  const std::uint8_t flags = bytes.byte();
  const Watchdog watchdog = watchdog_from(bytes.u32());
  std::optional<std::string> xla;
  if (!(flags & 0x01)) xla = std::string(bytes.text());
  check_xla(xla, watchdog);
}

// ------------------------------------------------- pool options check ---

void fuzz_pool_options(Bytes& bytes) {
  const std::uint8_t flags = bytes.byte();
  auto fields = split_fields(bytes.text());
  auto field = [&fields](std::size_t i) { return i < fields.size() ? fields[i] : std::string(); };
  PoolOptions options;
  options.pool = flags & 0x01;
  options.multi_host = flags & 0x02;
  if (flags & 0x04) options.devices_per_process = DevicesPerProcess(bytes.u32());
  if (flags & 0x08) options.port = bytes.u16();
  if (flags & 0x10) options.coordinator = field(0);
  if (flags & 0x20) options.watchdog = watchdog_from(bytes.u32());
  if (flags & 0x40) options.kill_on_bad_exit = (flags & 0x80) != 0;
  auto result = check_pool_options(options);
  const bool orphans = options.multi_host || options.devices_per_process || options.port || options.coordinator ||
                       options.watchdog || options.kill_on_bad_exit;
  FUZZ_CHECK(result.ok() == (options.pool || !orphans));
  if (result.ok()) {
    const auto& same = result.value();
    FUZZ_CHECK(same.pool == options.pool && same.multi_host == options.multi_host &&
               same.devices_per_process == options.devices_per_process && same.port == options.port &&
               same.coordinator == options.coordinator && same.watchdog == options.watchdog &&
               same.kill_on_bad_exit == options.kill_on_bad_exit);
    return;
  }
  const auto& message = result.error().message;
  check_error(result.error(), "");
  FUZZ_CHECK(message.find("--dew-pool") != std::string::npos);
  if (options.multi_host) FUZZ_CHECK(message.find("--dew-multi-host") != std::string::npos);
  if (options.devices_per_process) FUZZ_CHECK(message.find("--dew-devices-per-process") != std::string::npos);
  if (options.port) FUZZ_CHECK(message.find("--dew-port") != std::string::npos);
  if (options.coordinator) FUZZ_CHECK(message.find("--dew-coordinator") != std::string::npos);
  if (options.watchdog) FUZZ_CHECK(message.find("--dew-watchdog") != std::string::npos);
  if (options.kill_on_bad_exit) FUZZ_CHECK(message.find("--dew-kill-on-bad-exit") != std::string::npos);
}

// ------------------------------------------------------ the task's env ---

const std::string* find_set(const EnvPlan& plan, std::string_view name) {
  const std::string* found = nullptr;
  for (const auto& [key, value] : plan.set) {
    if (key == name) {
      FUZZ_CHECK(found == nullptr);  // each variable set once
      found = &value;
    }
  }
  return found;
}

// Fields, split on '\n'/'\0': 0 SLURM_STEP_NODELIST, 1 SLURM_DISTRIBUTION,
// 2 pool secret, 3 CUDA_VISIBLE_DEVICES, 4 SLURMD_TRES_BIND,
// 5 SLURM_GPUS_PER_TASK, 6 XLA_FLAGS, 7 --dew-coordinator, 8 --dew-port,
// 9 --dew-devices-per-process, 10 --dew-watchdog, 11.. plugstack.conf args.
// Trailing bytes: flags, a 16-bit mask of fields to leave unset, 7 numbers.
void fuzz_task_env(Bytes& bytes) {
  const std::uint8_t flags = bytes.byte();
  const std::uint16_t unset_mask = bytes.u16();
  TaskFacts facts;
  facts.job_id = bytes.u32();
  facts.step_id = bytes.u32();
  facts.global_task = bytes.u32();
  facts.task_count = bytes.u32();
  facts.local_task = bytes.u32();
  facts.local_task_count = bytes.u32();
  facts.node_id = bytes.u32();
  if (flags & 0x80) {  // small numbers: mostly consistent ones
    facts.global_task %= 16;
    facts.task_count %= 17;
    facts.local_task %= 8;
    facts.local_task_count %= 9;
  }
  const std::string_view raw = bytes.text();
  const auto fields = split_fields(raw);
  auto field = [&](std::size_t i) -> std::optional<std::string> {
    if (i >= fields.size() || (i < 16 && (unset_mask >> i) & 1)) return std::nullopt;
    return fields[i];
  };
  facts.step_nodelist = field(0);
  facts.distribution = field(1);
  facts.pool_secret = field(2);
  facts.visible_devices = field(3);
  facts.tres_bind = field(4);
  facts.gpus_per_task = field(5);
  facts.xla_flags = field(6);

  // The options as the plugin would hold them: only values its parsers accepted.
  PoolOptions options;
  options.pool = true;
  options.multi_host = flags & 0x01;
  if (auto text = field(7)) options.coordinator = fuzz_coordinator(*text, raw);
  if (auto text = field(8)) options.port = fuzz_port(*text, raw);
  if (auto text = field(9)) {
    // The srun option also takes "off" (the admin's default switched off).
    if (*text == "off") {
      options.devices_per_process = DevicesPerProcess();
    } else if (auto count = fuzz_devices_per_process(*text, raw)) {
      options.devices_per_process = DevicesPerProcess(*count);
      FUZZ_CHECK(parse_devices_per_process_choice(*text, "--dew-devices-per-process").value() ==
                 DevicesPerProcess(*count));
    }
  }
  if (auto text = field(10)) {
    if (auto watchdog = fuzz_watchdog(*text, raw)) options.watchdog = *watchdog;
  }
  FUZZ_CHECK(check_pool_options(options).ok());
  PlugstackConfig config;
  if (fields.size() > 11) {
    std::vector<std::string> args(fields.begin() + 11, fields.end());
    auto parsed = parse_plugstack_args(args);
    if (parsed.ok()) config = parsed.value();
  }

  // coordinator_host on its own.
  auto host = coordinator_host(facts, options);
  if (host.ok()) {
    FUZZ_CHECK(!host.value().empty());
    if (options.coordinator) {
      FUZZ_CHECK(host.value() == *options.coordinator);
    } else {
      FUZZ_CHECK(facts.step_nodelist);
      auto hosts = expand_hostlist(*facts.step_nodelist);
      FUZZ_CHECK(hosts.ok() && host.value() == hosts.value().front());
    }
  } else {
    check_error(host.error(), raw);
    FUZZ_CHECK(!options.coordinator);
  }

  auto result = plan_task_environment(facts, options, config);
  const bool consistent = facts.task_count != 0 && facts.global_task < facts.task_count &&
                          facts.local_task_count != 0 && facts.local_task < facts.local_task_count;
  if (!consistent) FUZZ_CHECK(!result.ok());
  if (!result.ok()) {
    check_error(result.error(), raw);
    return;
  }
  const auto& plan = result.value();
  const bool pool = facts.task_count > 1 || options.multi_host;
  for (std::string_view name :
       {"DEW_PROCESS_ID", "DEW_PROCESS_COUNT", "DEW_LOCAL_PROCESS_ID", "DEW_LOCAL_PROCESS_COUNT", "DEW_NODE_ID"}) {
    FUZZ_CHECK(find_set(plan, name) != nullptr);
  }
  FUZZ_CHECK(*find_set(plan, "DEW_PROCESS_ID") == (pool ? std::to_string(facts.global_task) : "0"));
  FUZZ_CHECK(*find_set(plan, "DEW_PROCESS_COUNT") == (pool ? std::to_string(facts.task_count) : "1"));
  for (const auto& [name, value] : plan.set) FUZZ_CHECK(!name.empty());

  const auto* address = find_set(plan, "DEW_COORDINATOR_ADDRESS");
  if (pool) {
    FUZZ_CHECK(plan.unset.empty());
    FUZZ_CHECK(host.ok());
    FUZZ_CHECK(address != nullptr);
    // The framework's coordinator: the same host, never Dew's port.
    const auto* jax_address = find_set(plan, "JAX_COORDINATOR_ADDRESS");
    const auto* master_port = find_set(plan, "MASTER_PORT");
    FUZZ_CHECK(jax_address != nullptr && master_port != nullptr && *jax_address != *address);
    FUZZ_CHECK(jax_address->ends_with(":" + *master_port));
    FUZZ_CHECK(*find_set(plan, "RANK") == std::to_string(facts.global_task));
    FUZZ_CHECK(*find_set(plan, "WORLD_SIZE") == std::to_string(facts.task_count));
    const std::uint16_t port =
        options.port ? *options.port : derive_port(facts.job_id, facts.step_id, config.port_range);
    if (!options.port) FUZZ_CHECK(port >= config.port_range.low && port <= config.port_range.high);
    const bool bare_ipv6 = host.value().find(':') != std::string::npos && host.value().front() != '[';
    const std::string expected = (bare_ipv6 ? "[" + host.value() + "]" : host.value()) + ":" + std::to_string(port);
    FUZZ_CHECK(*address == expected);
    FUZZ_CHECK(facts.pool_secret && !facts.pool_secret->empty());
    const auto* secret = find_set(plan, "DEW_POOL_SECRET");
    FUZZ_CHECK(secret != nullptr && *secret == *facts.pool_secret);
  } else {
    FUZZ_CHECK(address == nullptr && find_set(plan, "DEW_POOL_SECRET") == nullptr);
    FUZZ_CHECK(plan.unset.size() == 3);  // the coordinator, the secret, DEW_MULTI_HOST
    const auto* jax_address = find_set(plan, "JAX_COORDINATOR_ADDRESS");
    FUZZ_CHECK(jax_address != nullptr && jax_address->starts_with("127.0.0.1:"));
    FUZZ_CHECK(*find_set(plan, "RANK") == "0" && *find_set(plan, "WORLD_SIZE") == "1");
  }

  // The GPU part is exactly bind_gpus on what task_gpu_binding chose, which
  // keeps the user's value, else the admin's (steps with GPUs), else an even
  // share, and never more than the node's GPUs per task.
  std::vector<std::string> notes;
  auto chosen = task_gpu_binding(facts, options, config, notes);
  FUZZ_CHECK(chosen.ok());
  const GpuBindingInput& gpus = chosen.value();
  if (options.devices_per_process) FUZZ_CHECK(gpus.devices_per_process == *options.devices_per_process);
  if (!options.devices_per_process && !config.devices_per_process && !gpus.bound_by_slurm && gpus.devices_per_process) {
    FUZZ_CHECK(*gpus.devices_per_process * facts.local_task_count <=
               dew::split(facts.visible_devices.value_or(""), ',').size());
  }
  auto binding = bind_gpus(gpus);
  check_binding(gpus, binding, raw);
  FUZZ_CHECK(binding.ok());
  const auto* cuda = find_set(plan, "CUDA_VISIBLE_DEVICES");
  FUZZ_CHECK((cuda != nullptr) == binding.value().visible_devices.has_value());
  if (cuda) FUZZ_CHECK(*cuda == *binding.value().visible_devices);
  const auto* ids = find_set(plan, "JAX_LOCAL_DEVICE_IDS");
  FUZZ_CHECK((ids != nullptr) == binding.value().local_device_ids.has_value());
  if (ids) FUZZ_CHECK(*ids == *binding.value().local_device_ids);

  const Watchdog watchdog = options.watchdog ? *options.watchdog : config.watchdog;
  const auto merged = merge_xla_flags(facts.xla_flags, watchdog);
  check_xla(facts.xla_flags, watchdog);
  const auto* xla = find_set(plan, "XLA_FLAGS");
  FUZZ_CHECK((xla != nullptr) == merged.has_value());
  if (xla) FUZZ_CHECK(*xla == *merged);
}

// ---------------------------------------------------- small utilities ---

void fuzz_misc(Bytes& bytes) {
  const std::uint32_t raw_status = bytes.u32();
  const int status = static_cast<int>(raw_status);
  const std::string description = describe_wait_status(status);
  FUZZ_CHECK(!description.empty() && description.find('\n') == std::string::npos);
  FUZZ_CHECK(is_bad_exit(status) == (description != "exit code 0"));

  const std::uint32_t rank = bytes.u32();
  const std::uint32_t job = bytes.u32();
  const std::uint32_t step = bytes.u32();
  const bool step_ending = (bytes.u32() & 1) != 0;
  const auto end = classify_task_end(status, rank, job, step, step_ending);
  FUZZ_CHECK((end.kind == TaskEnd::kClean) == !is_bad_exit(status));
  FUZZ_CHECK((end.kind == TaskEnd::kPeerFailed) == is_peer_failure(status));
  if (end.kind != TaskEnd::kClean) {
    FUZZ_CHECK(end.line.find('\n') == std::string::npos);
    FUZZ_CHECK(end.line.find("rank " + std::to_string(rank) + " ") == 0);
    FUZZ_CHECK(end.line.find(std::to_string(job) + "." + std::to_string(step)) != std::string::npos);
  }
  if (end.kind == TaskEnd::kFailed) FUZZ_CHECK(end.line.find(description) != std::string::npos);

  const std::int64_t seconds = 1 + static_cast<std::int64_t>(bytes.u32() % kLongestWatchdogSeconds);
  const std::string formatted = format_duration(std::chrono::seconds(seconds));
  auto parsed = parse_watchdog(formatted, "format_duration");
  FUZZ_CHECK(parsed.ok() && parsed.value() && parsed.value()->count() == seconds);

  const std::string_view text = bytes.text();
  const std::string hex = to_hex({reinterpret_cast<const unsigned char*>(text.data()), text.size()});
  FUZZ_CHECK(hex.size() == 2 * text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    auto nibble = [](char c) -> unsigned {
      FUZZ_CHECK(is_digit(c) || (c >= 'a' && c <= 'f'));
      return is_digit(c) ? static_cast<unsigned>(c - '0') : static_cast<unsigned>(c - 'a' + 10);
    };
    FUZZ_CHECK((nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1])) == static_cast<unsigned char>(text[i]));
  }
}

// ------------------------------------------ failure notices (srun) ---

constexpr std::string_view kNoticeSecret = "fuzz-secret";

// srun reads a notice from the network: refused with one line, or read
// back to the same notice; a notice made from any text reads back as one
// line each; the verdict over any notices names one of them once.
void fuzz_failure_notice(Bytes& bytes) {
  const std::uint32_t job = bytes.u32() % 1000, step = bytes.u32() % 4;
  const std::string_view text = bytes.text();
  auto read = decode_failure_notice(text, job, step, kNoticeSecret);
  if (!read.ok()) {
    FUZZ_CHECK(read.error().message.starts_with("failure notice refused: "));
    FUZZ_CHECK(read.error().message.find('\n') == std::string::npos);
  } else {
    FUZZ_CHECK(read.value().line.find('\n') == std::string::npos);
    const auto again = encode_failure_notice(read.value(), job, step, kNoticeSecret);
    FUZZ_CHECK(decode_failure_notice(again, job, step, kNoticeSecret).value().line == read.value().line);
  }
  const auto cut = text.find('\0');
  FailureNotice made{job, static_cast<std::int64_t>(text.size()) - 100, std::string(text.substr(0, cut)),
                     std::string(cut == std::string_view::npos ? "" : text.substr(cut + 1)),
                     static_cast<int>(text.size() % 256)};
  const auto encoded = encode_failure_notice(made, job, step, kNoticeSecret);
  FUZZ_CHECK(encoded.size() <= kFailureNoticeMaxBytes && encoded.find('\n') == encoded.size() - 1);
  auto back = decode_failure_notice(encoded, job, step, kNoticeSecret);
  FUZZ_CHECK(back.ok() && back.value().rank == made.rank && back.value().exit_code == made.exit_code &&
             back.value().ended_at_us == std::max<std::int64_t>(made.ended_at_us, 0));
  FUZZ_CHECK(back.value().line.find('\n') == std::string::npos && back.value().node.find('\n') == std::string::npos);
  FUZZ_CHECK(!decode_failure_notice(encoded, job, step + 1, kNoticeSecret).ok());
  StepVerdict verdict;
  verdict.add(back.value());
  if (read.ok()) verdict.add(read.value());
  const auto lines = verdict.say();
  FUZZ_CHECK(lines && lines->after.size() == (read.ok() ? 1u : 0u) && !verdict.say());
}

// A failure record (dew/failure_record.h): what is read from a line writes
// back to the same record; any rank and reason round-trip (the reason cut
// at its bound), as one line; another tag reads nothing.
void fuzz_failure_record(Bytes& bytes) {
  constexpr std::string_view kTag = "0123456789abcdef";
  const auto rank = static_cast<int>(bytes.u32() & 0x7fffffff);
  const auto code = bytes.u32() % 300;
  const auto seen = static_cast<std::int64_t>(bytes.u32());
  const std::string_view text = bytes.text();
  if (const auto read = decode_failure_record(kTag, text)) {
    FUZZ_CHECK(decode_failure_record(kTag, encode_failure_record(kTag, *read)) == read);
  }
  const FailureRecord made{rank, std::string(text),
                           code < 256 ? std::optional<int>(static_cast<int>(code)) : std::nullopt,
                           std::string(text.substr(0, text.size() / 2)), seen};
  const std::string line = encode_failure_record(kTag, made);
  FUZZ_CHECK(line.find('\n') == std::string::npos);
  const auto back = decode_failure_record(kTag, line);
  FUZZ_CHECK(back && back->rank == rank && made.why.starts_with(back->why) && back->exit_code == made.exit_code &&
             made.node.starts_with(back->node) && back->seen_at_us == seen);
  FUZZ_CHECK(!decode_failure_record("ffffffffffffffff", line));
}

// All the one-string parsers on the same text.
void fuzz_all_text(std::string_view text) {
  fuzz_devices_per_process(text, text);
  fuzz_port(text, text);
  fuzz_port_range(text, text);
  fuzz_watchdog(text, text);
  fuzz_yes_no(text, text);
  fuzz_coordinator(text, text);
  fuzz_hostlist(text, text);
  fuzz_plugstack({std::string(text)}, text);
  check_xla(std::string(text), std::chrono::minutes(30));
}

// The selector letters the seed corpus uses; other bytes: by value modulo.
constexpr std::string_view kModes = "adprwychngbxtsovf*";

}  // namespace
}  // namespace dew::spank

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dew::spank;
  if (size == 0) return 0;
  const auto letter = static_cast<char>(data[0]);
  auto mode_at = kModes.find(letter);
  const char mode = mode_at != std::string_view::npos ? letter : kModes[data[0] % kModes.size()];
  Bytes bytes(data + 1, size - 1);
  const std::string_view text = bytes.text();
  switch (mode) {
    case 'a':
      fuzz_plugstack(split_fields(text), text);
      break;
    case 'd':
      fuzz_devices_per_process(text, text);
      break;
    case 'p':
      fuzz_port(text, text);
      break;
    case 'r':
      fuzz_port_range(text, text);
      break;
    case 'w':
      fuzz_watchdog(text, text);
      break;
    case 'y':
      fuzz_yes_no(text, text);
      break;
    case 'c':
      fuzz_coordinator(text, text);
      break;
    case 'h':
      fuzz_hostlist(text, text);
      break;
    case 'n':
      fuzz_derive_port(bytes);
      break;
    case 'g':
      fuzz_bind_gpus(bytes);
      break;
    case 'b':
      fuzz_slurm_bound(bytes);
      break;
    case 'x':
      fuzz_xla(bytes);
      break;
    case 't':
      fuzz_task_env(bytes);
      break;
    case 's':
      fuzz_misc(bytes);
      break;
    case 'o':
      fuzz_pool_options(bytes);
      break;
    case 'v':
      fuzz_failure_notice(bytes);
      break;
    case 'f':
      fuzz_failure_record(bytes);
      break;
    default:
      fuzz_all_text(text);
      break;
  }
  return 0;
}
