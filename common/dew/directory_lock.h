// One holder per directory: a lock that dies with its holder (flock on a file
// in the directory, held while the process lives) and, beside it in that
// file, who holds it, so that a second holder is refused at once, by name.
// For checkpoint directories: two pools writing one would delete each other's
// checkpoints.
#pragma once

#include <string>

#include "dew/result.h"

namespace dew {

class DirectoryLock {
 public:
  // Takes DIR/.dew-lock for `holder` (one line: who, such as "pool of 4
  // processes, host n1, pid 1234, since 2026-12-02 05:30:00"). Refused
  // (kUnavailable) naming the current holder when another process holds it;
  // a holder that died (SIGKILL included) holds nothing.
  static Result<DirectoryLock> take(const std::string& directory, const std::string& holder);

  DirectoryLock(DirectoryLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  DirectoryLock& operator=(DirectoryLock&& other) noexcept;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  ~DirectoryLock();

 private:
  explicit DirectoryLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// The lock file's name inside the directory.
inline constexpr const char* kDirectoryLockName = ".dew-lock";

}  // namespace dew
