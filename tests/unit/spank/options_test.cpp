#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "expect_error.h"
#include "pool_plan.h"

namespace dew::spank {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// Every refusal here is a bad value: the code, then the sentence (naming the
// option, the value and what is allowed) is the feature.
std::string error_of(const auto& result) { return dew::testing::invalid_argument_of(result); }

TEST(PlugstackArgs, DefaultsWithoutArguments) {
  auto config = parse_plugstack_args({});
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config.value().port_range, (PortRange{20000, 29999}));
  EXPECT_TRUE(config.value().kill_on_bad_exit);
  EXPECT_EQ(config.value().watchdog, Watchdog(30min));
  EXPECT_FALSE(config.value().devices_per_process);
}

TEST(PlugstackArgs, EveryKey) {
  auto config = parse_plugstack_args(
      {"port_range=31000-31010", "kill_on_bad_exit=no", "watchdog=1h30m", "devices_per_process=2"});
  ASSERT_TRUE(config.ok()) << config.error().message;
  EXPECT_EQ(config.value().port_range, (PortRange{31000, 31010}));
  EXPECT_FALSE(config.value().kill_on_bad_exit);
  EXPECT_EQ(config.value().watchdog, Watchdog(90min));
  EXPECT_EQ(config.value().devices_per_process, 2u);
}

TEST(PlugstackArgs, WatchdogOffAndSinglePortRange) {
  auto config = parse_plugstack_args({"watchdog=off", "port_range=40000-40000", "kill_on_bad_exit=yes"});
  ASSERT_TRUE(config.ok());
  EXPECT_FALSE(config.value().watchdog.has_value());
  EXPECT_EQ(config.value().port_range, (PortRange{40000, 40000}));
  EXPECT_TRUE(config.value().kill_on_bad_exit);
}

TEST(PlugstackArgs, AFrameworkRangeSharingAPortWithDewsIsRefusedNamingBoth) {
  EXPECT_THAT(error_of(parse_plugstack_args({"port_range=15000-15100"})),
              HasSubstr("plugstack.conf: framework_port_range 10000-19999 shares ports with port_range 15000-15100"));
  auto moved = parse_plugstack_args({"port_range=15000-15100", "framework_port_range=16000-16999"});
  ASSERT_TRUE(moved.ok()) << moved.error().message;
  EXPECT_EQ(moved.value().framework_port_range, (PortRange{16000, 16999}));
  EXPECT_THAT(error_of(parse_plugstack_args({"framework_port_range=9-1"})),
              HasSubstr("plugstack.conf framework_port_range"));
}

TEST(PlugstackArgs, UnknownKeyNamesItAndTheAllowedOnes) {
  auto message = error_of(parse_plugstack_args({"prot_range=1-2"}));
  EXPECT_THAT(message, HasSubstr("unknown argument 'prot_range=1-2'"));
  EXPECT_THAT(message, HasSubstr("port_range=LOW-HIGH"));
  EXPECT_THAT(message, HasSubstr("devices_per_process=N"));
}

TEST(PlugstackArgs, NotKeyValue) {
  EXPECT_THAT(error_of(parse_plugstack_args({"verbose"})), HasSubstr("'verbose' is not key=value"));
}

TEST(PlugstackArgs, RepeatedKey) {
  EXPECT_THAT(error_of(parse_plugstack_args({"watchdog=1m", "watchdog=2m"})), HasSubstr("given twice"));
}

struct BadArg {
  std::string arg;
  std::string expected;
};

class PlugstackBadValue : public ::testing::TestWithParam<BadArg> {};

TEST_P(PlugstackBadValue, NamesKeyValueAndAllowed) {
  auto message = error_of(parse_plugstack_args({GetParam().arg}));
  const auto key = GetParam().arg.substr(0, GetParam().arg.find('='));
  const auto value = GetParam().arg.substr(GetParam().arg.find('=') + 1);
  EXPECT_THAT(message, HasSubstr("plugstack.conf " + key));
  EXPECT_THAT(message, HasSubstr("'" + value + "'"));
  EXPECT_THAT(message, HasSubstr(GetParam().expected));
}

INSTANTIATE_TEST_SUITE_P(
    EveryKey, PlugstackBadValue,
    ::testing::Values(BadArg{"port_range=30000", "LOW-HIGH"}, BadArg{"port_range=30010-30000", "LOW <= HIGH"},
                      BadArg{"port_range=80-90", "1024 to 65535"}, BadArg{"port_range=30000-70000", "LOW-HIGH"},
                      BadArg{"port_range=-", "LOW-HIGH"}, BadArg{"port_range=a-b", "LOW-HIGH"},
                      BadArg{"port_range=", "LOW-HIGH"}, BadArg{"kill_on_bad_exit=true", "yes or no"},
                      BadArg{"kill_on_bad_exit=", "yes or no"}, BadArg{"kill_on_bad_exit=YES", "yes or no"},
                      BadArg{"watchdog=30", "duration such as"}, BadArg{"watchdog=0m", "duration such as"},
                      BadArg{"watchdog=m", "duration such as"}, BadArg{"watchdog=30x", "duration such as"},
                      BadArg{"watchdog=30m1h", "duration such as"}, BadArg{"watchdog=1h1h", "duration such as"},
                      BadArg{"watchdog=9000h", "at most 8760h"}, BadArg{"watchdog=-5m", "duration such as"},
                      BadArg{"watchdog=", "duration such as"}, BadArg{"watchdog=OFF", "or off"},
                      BadArg{"devices_per_process=0", "1 to 1024"}, BadArg{"devices_per_process=-1", "1 to 1024"},
                      BadArg{"devices_per_process=2048", "1 to 1024"}, BadArg{"devices_per_process=1.5", "1 to 1024"},
                      BadArg{"devices_per_process=99999999999999999999", "1 to 1024"},
                      BadArg{"devices_per_process=", "1 to 1024"}));

TEST(OptionValues, Port) {
  EXPECT_EQ(parse_port("1024", "--dew-port").value(), 1024);
  EXPECT_EQ(parse_port("65535", "--dew-port").value(), 65535);
  for (const char* bad : {"1023", "65536", "0", "", " 2000", "2000 ", "+2000", "0x800", "abc", "99999999999"}) {
    auto message = error_of(parse_port(bad, "--dew-port"));
    EXPECT_THAT(message, HasSubstr("--dew-port: '" + std::string(bad) + "'")) << bad;
    EXPECT_THAT(message, HasSubstr("1024 to 65535")) << bad;
  }
}

TEST(OptionValues, DevicesPerProcess) {
  EXPECT_EQ(parse_devices_per_process("1", "--dew-devices-per-process").value(), 1u);
  EXPECT_EQ(parse_devices_per_process("1024", "--dew-devices-per-process").value(), 1024u);
  EXPECT_THAT(error_of(parse_devices_per_process("0", "--dew-devices-per-process")),
              HasSubstr("--dew-devices-per-process: '0' is not allowed; allowed: an integer from 1 to 1024"));
}

TEST(OptionValues, YesNo) {
  EXPECT_TRUE(parse_yes_no("yes", "k").value());
  EXPECT_FALSE(parse_yes_no("no", "k").value());
  EXPECT_THAT(error_of(parse_yes_no("1", "--dew-kill-on-bad-exit")),
              HasSubstr("--dew-kill-on-bad-exit: '1' is not allowed; allowed: yes or no"));
}

TEST(OptionValues, CoordinatorHost) {
  for (const char* good : {"node0", "n1.cluster.example", "10.0.0.1", "[::1]", "[fe80::1]", "gpu_01"}) {
    EXPECT_TRUE(parse_coordinator_host(good, "--dew-coordinator").ok()) << good;
  }
  for (const char* bad : {"", "node0:1234", "a b", "-n1", ".n1", "[::1", "[]", "n1;rm", "[zz::1]"}) {
    EXPECT_THAT(error_of(parse_coordinator_host(bad, "--dew-coordinator")),
                HasSubstr("--dew-coordinator: '" + std::string(bad) + "'"))
        << bad;
  }
  EXPECT_FALSE(parse_coordinator_host(std::string(254, 'a'), "c").ok());
}

TEST(PoolOptionsCheck, OptionsWithoutPoolAreRefusedByName) {
  PoolOptions options;
  EXPECT_TRUE(check_pool_options(options).ok());
  options.port = 4000;
  options.multi_host = true;
  auto message = error_of(check_pool_options(options));
  EXPECT_THAT(message, HasSubstr("--dew-multi-host, --dew-port given without --dew-pool"));
  options.pool = true;
  EXPECT_TRUE(check_pool_options(options).ok());
}

}  // namespace
}  // namespace dew::spank

namespace dew::spank {
namespace {

// srun and slurmstepd may hand the plugin one option twice: the same text is
// kept; another text is refused naming both, never the last one winning.
TEST(RepeatedOption, TheSameValueIsAcceptedAnotherIsRefusedNamingBoth) {
  SeenOptions seen;
  EXPECT_TRUE(note_option(seen, "--dew-port", "30001").ok());
  EXPECT_TRUE(note_option(seen, "--dew-port", "30001").ok());
  EXPECT_TRUE(note_option(seen, "--dew-pool", "").ok());
  EXPECT_TRUE(note_option(seen, "--dew-pool", "").ok()) << "a flag, twice";
  EXPECT_EQ(dew::testing::invalid_argument_of(note_option(seen, "--dew-port", "30002")),
            "--dew-port was given twice, as '30001' and '30002'; allowed: one value (or the same one again)");
  EXPECT_TRUE(note_option(seen, "--dew-watchdog", "30m").ok()) << "each option on its own";
}

}  // namespace
}  // namespace dew::spank
