// The topology fixtures (tests/fixtures/topology, see SOURCES.md) for the
// topology tests: where they are, and their text.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace dew::topology::testing {

inline std::string fixture_dir() {
  const char* root = std::getenv("DEW_FIXTURES");
  return std::string(root != nullptr ? root : "tests/fixtures") + "/topology";
}

inline std::string fixture(const std::string& name) { return fixture_dir() + "/" + name; }

inline std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline std::vector<std::string> fixture_files() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(fixture_dir())) {
    const std::string name = entry.path().filename().string();
    if (name != "SOURCES.md") names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace dew::topology::testing
