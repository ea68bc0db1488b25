// write_file_atomically: the whole new content or the old one, no
// temporary left behind, and an error naming the file.
#include "dew/atomic_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace dew {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(AtomicFile, ReplacesTheWholeFileAndLeavesNoTemporary) {
  const auto dir = std::filesystem::temp_directory_path() / ("dew-atomic-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = dir / "out.json";
  ASSERT_TRUE(write_file_atomically(path, "first\n").ok());
  const std::string binary("a\0b", 3);
  ASSERT_TRUE(write_file_atomically(path, binary).ok());
  EXPECT_EQ(read_all(path), binary);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 1);
  auto missing = write_file_atomically((dir / "no" / "such.json").string(), "x");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::kSystem);
  EXPECT_THAT(missing.error().message, ::testing::HasSubstr("cannot create " + (dir / "no" / "such.json").string()));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dew
