// DirectoryLock: one holder per directory, named to the next; nothing held
// once the holder is gone, even after SIGKILL.
#include "dew/directory_lock.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>

namespace dew {
namespace {

using ::testing::HasSubstr;

std::string fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

TEST(DirectoryLock, ASecondHolderIsRefusedNamingTheFirstUntilItLetsGo) {
  const std::string dir = fresh_dir("dew-lock");
  std::optional<DirectoryLock> first;
  {
    auto taken = DirectoryLock::take(dir, "pool A (host n1, pid 1)");
    ASSERT_TRUE(taken.ok()) << taken.error().message;
    first.emplace(std::move(taken.value()));
  }
  auto second = DirectoryLock::take(dir, "pool B");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code, ErrorCode::kUnavailable);
  EXPECT_EQ(second.error().message, dir +
                                        " is in use by pool A (host n1, pid 1); allowed: a directory no other "
                                        "running pool uses (it is free again once that pool ends)");
  first.reset();
  EXPECT_TRUE(DirectoryLock::take(dir, "pool B").ok());
  std::filesystem::remove_all(dir);
}

TEST(DirectoryLock, AHolderKilledWithSigkillHoldsNothing) {
  const std::string dir = fresh_dir("dew-lock-killed");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    auto taken = DirectoryLock::take(dir, "the child");
    const char byte = taken.ok() ? '1' : '0';
    [[maybe_unused]] auto wrote = ::write(ready[1], &byte, 1);
    ::pause();
    ::_exit(0);
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ASSERT_EQ(byte, '1');
  auto while_alive = DirectoryLock::take(dir, "the parent");
  ASSERT_FALSE(while_alive.ok());
  EXPECT_THAT(while_alive.error().message, HasSubstr("is in use by the child"));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(DirectoryLock::take(dir, "the parent").ok());
  ::close(ready[0]);
  ::close(ready[1]);
  std::filesystem::remove_all(dir);
}

TEST(DirectoryLock, ALockFileThatIsASymlinkIsNotFollowed) {
  const std::string dir = fresh_dir("dew-lock-link");
  const std::string target = dir + "/elsewhere";
  std::filesystem::create_symlink(target, dir + "/" + kDirectoryLockName);
  auto taken = DirectoryLock::take(dir, "pool");
  EXPECT_FALSE(taken.ok());
  EXPECT_FALSE(std::filesystem::exists(target)) << "nothing made through the symlink";
  std::filesystem::remove_all(dir);
}

TEST(DirectoryLock, ALockFileReplacedByRenameDoesNotLetASecondHolderIn) {
  const std::string dir = fresh_dir("dew-lock-renamed");
  auto first = DirectoryLock::take(dir, "pool A");
  ASSERT_TRUE(first.ok()) << first.error().message;
  const std::string planted = dir + "/planted";
  std::ofstream(planted) << "nobody\n";
  std::filesystem::rename(planted, dir + "/" + kDirectoryLockName);
  auto second = DirectoryLock::take(dir, "pool B");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code, ErrorCode::kUnavailable);
  EXPECT_THAT(second.error().message, HasSubstr(dir + " is in use by "));
  auto held = first.value().still_held(dir);
  ASSERT_FALSE(held.ok());
  EXPECT_EQ(held.error().message, dir + "/" + kDirectoryLockName +
                                      " was removed or replaced while this pool held it: another pool may use the "
                                      "directory; allowed: a lock file left as it is while its pool runs");
  std::filesystem::remove_all(dir);
}

TEST(DirectoryLock, AHeldLockLeftAloneIsStillHeld) {
  const std::string dir = fresh_dir("dew-lock-kept");
  auto first = DirectoryLock::take(dir, "pool A");
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_TRUE(first.value().still_held(dir).ok());
  std::filesystem::remove(dir + "/" + kDirectoryLockName);
  EXPECT_FALSE(first.value().still_held(dir).ok());
  std::filesystem::remove_all(dir);
}

TEST(DirectoryLock, AHardLinkedLockFileIsRefusedAndItsTargetKept) {
  const std::string dir = fresh_dir("dew-lock-hardlink");
  const std::string target = dir + "/precious";
  std::ofstream(target) << "precious data\n";
  std::filesystem::create_hard_link(target, dir + "/" + kDirectoryLockName);
  auto taken = DirectoryLock::take(dir, "pool");
  ASSERT_FALSE(taken.ok());
  EXPECT_EQ(taken.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(taken.error().message, dir + "/" + kDirectoryLockName +
                                       " has 2 names (a hard link to another file?); allowed: a regular file Dew "
                                       "made, or none");
  std::ifstream in(target);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "precious data");
  std::filesystem::remove_all(dir);
}

TEST(DirectoryLock, ALockFileThatIsAFifoIsRefusedAtOnce) {
  const std::string dir = fresh_dir("dew-lock-fifo");
  ASSERT_EQ(::mkfifo((dir + "/" + kDirectoryLockName).c_str(), 0600), 0);
  auto taken = DirectoryLock::take(dir, "pool");  // hung before O_NONBLOCK
  ASSERT_FALSE(taken.ok());
  EXPECT_EQ(taken.error().code, ErrorCode::kInvalidArgument);
  EXPECT_THAT(taken.error().message, HasSubstr("is a FIFO; allowed: a regular file Dew made, or none"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dew
