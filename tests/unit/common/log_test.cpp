// The one logger, its lines read back from the stderr of a real process:
// the prefix, the level from DEW_LOG_LEVEL, and a bad value's error.
#include "dew/log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "expect_error.h"

namespace dew {
namespace {

using ::testing::HasSubstr;

// Runs `body` with fd 2 sent to a file, and returns what it wrote there.
template <typename Body>
std::string stderr_of(Body&& body) {
  const std::string path = "/tmp/dew-log-test-" + std::to_string(getpid());
  std::fflush(stderr);
  const int saved = dup(2);
  FILE* file = std::fopen(path.c_str(), "w");
  dup2(fileno(file), 2);
  body();
  dup2(saved, 2);
  close(saved);
  std::fclose(file);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path.c_str());
  return text.str();
}

TEST(Log, LinesCarryThePrefixAndHonourTheLevel) {
  const std::string text = stderr_of([] {
    set_log_level(LogLevel::kInfo);
    set_log_prefix("[3] ");
    log_info("Joined the pool");
    log_debug("hidden at info");
    set_log_level(LogLevel::kDebug);
    log_debug("join: shown at debug");
    set_log_prefix("100%: ");
    log_error("error: x");
    set_log_level(LogLevel::kOff);
    log_error("nothing at off");
  });
  EXPECT_EQ(text, "[3] Joined the pool\n[3] join: shown at debug\n100%: error: x\n");
  set_log_level(LogLevel::kInfo);
  set_log_prefix("");
}

TEST(Log, LevelsFromDewLogLevel) {
  EXPECT_EQ(parse_log_level("trace").value(), LogLevel::kTrace);
  EXPECT_EQ(parse_log_level("off").value(), LogLevel::kOff);
  setenv("DEW_LOG_LEVEL", "warn", 1);
  ASSERT_TRUE(configure_log_level_from_env().ok());
  EXPECT_EQ(log_level(), LogLevel::kWarn);
  setenv("DEW_LOG_LEVEL", "loud", 1);
  EXPECT_THAT(dew::testing::invalid_argument_of(configure_log_level_from_env()),
              HasSubstr("DEW_LOG_LEVEL: 'loud' is not allowed; allowed: trace, debug, info, warn, error or off"));
  EXPECT_EQ(log_level(), LogLevel::kWarn) << "a bad value changes nothing";
  unsetenv("DEW_LOG_LEVEL");
  set_log_level(LogLevel::kInfo);
}

}  // namespace
}  // namespace dew
