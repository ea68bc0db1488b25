// Shared by the launch plan's tests: options, facts and plans of a launch.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "dew/launch_plan.h"

namespace dew::launch::testing {

inline LaunchOptions options_with(std::vector<std::string> command) {
  LaunchOptions o;
  o.command = std::move(command);
  return o;
}

inline LaunchFacts facts() {
  LaunchFacts f;
  f.port = 41234;
  f.framework_port = 11234;
  f.secret = std::string(64, 'a');
  f.notice_tag = "0123456789abcdef";
  f.launcher_cwd = "/srv/here";
  f.local_hostname = "me";
  f.private_root = "/tmp/dew-launch-0123456789ab";
  return f;
}

// The plan of a launch that must succeed.
inline LaunchPlan planned(const LaunchOptions& o, const std::vector<EnvVar>& env, const LaunchFacts& f) {
  auto plan = plan_launch(o, env, f);
  EXPECT_TRUE(plan.ok()) << plan.error().message;
  return plan.ok() ? plan.value() : LaunchPlan{};
}

inline std::map<std::string, std::string> env_map(const ProcessSpec& p) {
  std::map<std::string, std::string> out;
  for (const auto& [name, value] : p.env) out[name] = value;
  return out;
}

}  // namespace dew::launch::testing
