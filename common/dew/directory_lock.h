// One holder per directory: a lock that dies with its holder (flock on a file
// in the directory, held while the process lives) and, beside it in that
// file, who holds it, so that a second holder is refused at once, by name.
// For checkpoint directories: two pools writing one would delete each other's
// checkpoints.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>

#include "dew/result.h"

namespace dew {

class DirectoryLock {
 public:
  // Takes DIR/.dew-lock for `holder` (one line: who, such as "pool of 4
  // processes, host n1, pid 1234, since 2026-12-02 05:30:00"). Refused
  // (kUnavailable) naming the current holder when another process holds it;
  // a holder that died (SIGKILL included) holds nothing. A lock file that is
  // a symlink, a FIFO, anything but a regular file, or a file with other
  // names (hard links) is refused (kInvalidArgument) and left as it is.
  static Result<DirectoryLock> take(const std::string& directory, const std::string& holder);

  // kUnavailable when DIR/.dew-lock is no longer the file this lock took
  // (removed, or replaced by a rename: another pool could take that one).
  Result<Done> still_held(const std::string& directory) const;

  DirectoryLock(DirectoryLock&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)),
        directory_fd_(std::exchange(other.directory_fd_, -1)),
        device_(other.device_),
        inode_(other.inode_) {}
  DirectoryLock& operator=(DirectoryLock&& other) noexcept;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  ~DirectoryLock();

 private:
  DirectoryLock(int directory_fd, int fd) : fd_(fd), directory_fd_(directory_fd) {}
  void close_both();
  int fd_ = -1;            // the lock file, flocked
  int directory_fd_ = -1;  // the directory, flocked where the filesystem allows
  dev_t device_ = 0;       // the lock file's identity, for still_held()
  ino_t inode_ = 0;
};

// The lock file's name inside the directory.
inline constexpr const char* kDirectoryLockName = ".dew-lock";

}  // namespace dew
