#include "dew/watchdog.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "expect_error.h"

namespace dew {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(ParseWatchdog, TheFormsXlaReads) {
  EXPECT_EQ(parse_watchdog("90s", "w").value(), Watchdog(90s));
  EXPECT_EQ(parse_watchdog("2h", "w").value(), Watchdog(2h));
  EXPECT_EQ(parse_watchdog("1h2m3s", "w").value(), Watchdog(3723s));
  EXPECT_EQ(parse_watchdog("8760h", "w").value(), Watchdog(8760h));
  EXPECT_FALSE(parse_watchdog("off", "w").value().has_value());
}

TEST(ParseWatchdog, BadValuesNameTheValueAndTheAllowedForms) {
  for (const char* bad : {"1d", "30", "0m", "m", "30x", "30m1h", "1h1h", "9000h", "-5m", "", "OFF", " 5m"}) {
    const auto message = dew::testing::invalid_argument_of(parse_watchdog(bad, "--dew-watchdog"));
    EXPECT_THAT(message, HasSubstr("--dew-watchdog: '" + std::string(bad) + "' is not allowed")) << bad;
    EXPECT_THAT(message, HasSubstr("90s, 30m, 2h or 1h30m (at most 8760h), or off")) << bad;
  }
}

TEST(FormatDuration, IsWhatXlaAndParseWatchdogRead) {
  EXPECT_EQ(format_duration(30min), "30m");
  EXPECT_EQ(format_duration(5400s), "1h30m");
  EXPECT_EQ(format_duration(90s), "1m30s");
  EXPECT_EQ(format_duration(3601s), "1h1s");
  EXPECT_EQ(format_duration(7s), "7s");
  EXPECT_EQ(format_duration(2h), "2h");
  for (auto s : {1, 59, 60, 61, 3599, 3600, 3661, 86400, 31536000}) {
    EXPECT_EQ(parse_watchdog(format_duration(std::chrono::seconds(s)), "w").value(), Watchdog(std::chrono::seconds(s)));
  }
}

TEST(MergeXlaFlags, AppendsTheWatchdogFlag) {
  EXPECT_EQ(merge_xla_flags("--xla_dump_to=/tmp/x", Watchdog(90s)),
            "--xla_dump_to=/tmp/x --xla_gpu_execution_terminate_timeout=1m30s");
  EXPECT_EQ(merge_xla_flags(std::nullopt, Watchdog(2h)), "--xla_gpu_execution_terminate_timeout=2h");
  EXPECT_EQ(merge_xla_flags("  ", Watchdog(2h)), "--xla_gpu_execution_terminate_timeout=2h");
}

TEST(MergeXlaFlags, KeepsAFlagAlreadySetAndOff) {
  EXPECT_FALSE(merge_xla_flags("--xla_gpu_execution_terminate_timeout=5m", Watchdog(30min)));
  EXPECT_FALSE(merge_xla_flags("--a=1 --xla_gpu_execution_terminate_timeout=5m --b", Watchdog(30min)));
  EXPECT_FALSE(merge_xla_flags("--a", Watchdog{})) << "off: XLA_FLAGS untouched";
  // A longer flag that only starts the same is not the watchdog.
  EXPECT_TRUE(merge_xla_flags("--xla_gpu_execution_terminate_timeout_other=1", Watchdog(1h)));
}

}  // namespace
}  // namespace dew

// One rule for every process: the flag, else DEW_WATCHDOG, else 30 minutes.
TEST(ChosenWatchdog, TheFlagThenTheInheritedValueThenTheDefault) {
  EXPECT_EQ(dew::chosen_watchdog("", "", std::nullopt).value(), dew::Watchdog(dew::kDefaultWatchdog));
  EXPECT_EQ(dew::chosen_watchdog("", "", std::string("90s")).value(), dew::Watchdog(std::chrono::seconds(90)));
  EXPECT_EQ(dew::chosen_watchdog("2m", "--watchdog", std::string("90s")).value(),
            dew::Watchdog(std::chrono::minutes(2)));
  EXPECT_EQ(dew::chosen_watchdog("", "", std::string("off")).value(), dew::Watchdog());
  EXPECT_NE(dew::chosen_watchdog("", "", std::string("soon")).error().message.find("DEW_WATCHDOG"), std::string::npos);
  EXPECT_NE(dew::chosen_watchdog("x", "--watchdog", std::nullopt).error().message.find("--watchdog"),
            std::string::npos);
}
