#include "dew/log.h"

#include <spdlog/logger.h>
#include <spdlog/sinks/base_sink.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "dew/task_contract.h"

namespace dew {
namespace {

// spdlog's stderr sinks write through stdio; this one writes each formatted
// line with write(2), so lines from threads, and from ranks that share a
// terminal or a launcher's pipe, never cut into each other.
class StderrLineSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& message) override {
    spdlog::memory_buf_t text;
    formatter_->format(message, text);
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // a closed stderr: the line is lost, the process goes on
      done += static_cast<std::size_t>(n);
    }
  }
  void flush_() override {}
};

constexpr std::array<std::pair<std::string_view, LogLevel>, 6> kLevels = {{{"trace", LogLevel::kTrace},
                                                                           {"debug", LogLevel::kDebug},
                                                                           {"info", LogLevel::kInfo},
                                                                           {"warn", LogLevel::kWarn},
                                                                           {"error", LogLevel::kError},
                                                                           {"off", LogLevel::kOff}}};

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return spdlog::level::trace;
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kOff:
      return spdlog::level::off;
  }
  return spdlog::level::info;
}

// The process's logger, made on first use and never destroyed, so a line
// logged from a static destructor or an exit path still has somewhere to go.
spdlog::logger& logger() {
  static spdlog::logger* const instance = [] {
    auto* made = new spdlog::logger("dew", std::make_shared<StderrLineSink>());
    made->set_pattern("%v");
    made->set_level(spdlog::level::info);
    made->flush_on(spdlog::level::trace);
    return made;
  }();
  return *instance;
}

std::mutex g_level_mutex;
LogLevel g_level = LogLevel::kInfo;

}  // namespace

Result<LogLevel> parse_log_level(std::string_view text, std::string_view name) {
  for (const auto& [word, level] : kLevels) {
    if (text == word) return level;
  }
  return not_allowed(name, text, "trace, debug, info, warn, error or off");
}

Result<LogLevel> configure_log_level_from_env() {
  const char* text = std::getenv(contract::kLogLevel.name);
  if (text == nullptr || *text == '\0') return log_level();
  auto level = parse_log_level(text);
  if (level.ok()) set_log_level(level.value());
  return level;
}

void set_log_level(LogLevel level) {
  std::lock_guard lock(g_level_mutex);
  g_level = level;
  logger().set_level(to_spdlog(level));
}

LogLevel log_level() {
  std::lock_guard lock(g_level_mutex);
  return g_level;
}

void set_log_prefix(std::string_view prefix) {
  // The prefix is literal text in the pattern: '%' must be doubled.
  std::string pattern;
  for (const char c : prefix) pattern += c == '%' ? std::string("%%") : std::string(1, c);
  logger().set_pattern(pattern + "%v");
}

void log_trace(std::string_view line) { logger().trace("{}", line); }
void log_debug(std::string_view line) { logger().debug("{}", line); }
void log_info(std::string_view line) { logger().info("{}", line); }
void log_warn(std::string_view line) { logger().warn("{}", line); }
void log_error(std::string_view line) { logger().error("{}", line); }

}  // namespace dew
