// Where the tests find what they run and read: meson passes the paths in
// the environment (DEW_EXE, DEW_FIXTURES); the fallbacks serve a test run by
// hand from the source root.
#pragma once

#include <cstdlib>
#include <string>

namespace dew::testing {

// The built `dew` command.
inline std::string dew_exe() {
  const char* path = std::getenv("DEW_EXE");
  return path != nullptr ? path : "dew";
}

// tests/unit/pool/pool_worker: joins a pool and plays a scenario.
inline std::string pool_worker() {
  const char* path = std::getenv("DEW_POOL_WORKER");
  return path != nullptr ? path : "pool_worker";
}

// A file under tests/fixtures/topology/.
inline std::string topology_fixture(const std::string& name) {
  const char* root = std::getenv("DEW_FIXTURES");
  return std::string(root != nullptr ? root : "tests/fixtures") + "/topology/" + name;
}

}  // namespace dew::testing
