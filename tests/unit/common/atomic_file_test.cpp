// write_file_atomically: the whole new content or the old one, no
// temporary left behind, and an error naming the file.
#include "dew/atomic_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

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

// Issue 26: `dew worker --out /dev/full` run as root replaced the machine's
// /dev/full. Whatever is not a regular file is refused and left as it was.
TEST(AtomicFile, NeverReplacesWhatIsNotARegularFile) {
  const auto dir = std::filesystem::temp_directory_path() / ("dew-atomic-kinds-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "a-directory");
  const std::string fifo = dir / "a-fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const std::string target = dir / "target.json";
  { std::ofstream(target) << "kept\n"; }
  const std::string link = dir / "a-symlink";
  std::filesystem::create_symlink(target, link);
  std::vector<std::pair<std::string, std::string>> cases = {
      {fifo, "is a FIFO"}, {link, "is a symbolic link"}, {(dir / "a-directory").string(), "is a directory"}};
  // A character device like /dev/full, made here (root only: mknod).
  const std::string device = dir / "a-device";
  if (::mknod(device.c_str(), S_IFCHR | 0666, makedev(1, 7)) == 0) cases.emplace_back(device, "is a character device");
  for (const auto& [path, kind] : cases) {
    SCOPED_TRACE(path);
    struct stat before {};
    ASSERT_EQ(::lstat(path.c_str(), &before), 0);
    auto written = write_file_atomically(path, "replaced\n");
    ASSERT_FALSE(written.ok());
    EXPECT_EQ(written.error().code, ErrorCode::kInvalidArgument);
    EXPECT_THAT(written.error().message, ::testing::HasSubstr(path + " " + kind + "; allowed: a regular file"));
    EXPECT_EQ(written.error().message.find('\n'), std::string::npos);
    struct stat after {};
    ASSERT_EQ(::lstat(path.c_str(), &after), 0);
    EXPECT_EQ(after.st_mode, before.st_mode);
    EXPECT_EQ(after.st_ino, before.st_ino) << "left as it was";
  }
  EXPECT_EQ(read_all(target), "kept\n") << "nothing written through the symlink";
  EXPECT_TRUE(write_file_atomically(target, "replaced\n").ok()) << "a regular file is replaced";
  EXPECT_EQ(read_all(target), "replaced\n");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dew
