#include "dew/directory_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "dew/text.h"

namespace dew {
namespace {

std::string read_holder(int directory_fd) {
  const int fd = ::openat(directory_fd, kDirectoryLockName, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  char text[512] = {};
  const ssize_t got = fd >= 0 ? ::pread(fd, text, sizeof text - 1, 0) : -1;
  if (fd >= 0) ::close(fd);
  std::string holder = got > 0 ? std::string(text, static_cast<std::size_t>(got)) : "";
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\r')) holder.pop_back();
  return holder.empty() ? std::string("a process that has not said who it is") : one_line(holder);
}

Error in_use(const std::string& directory, int directory_fd) {
  return unavailable(directory + " is in use by " + read_holder(directory_fd) +
                     "; allowed: a directory no other running pool uses (it is free again once that pool ends)");
}

std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symlink";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

}  // namespace

// Two locks: one on the directory itself, which a lock file replaced by
// rename cannot sidestep, and one on the lock file, for filesystems that
// lock no directory (NFS takes flock as a POSIX lock, which needs a file
// open for writing). The file is opened relative to the directory, never
// through a link, and written only when it is this lock's own: a regular
// file with no other name (a hard link's target is someone else's file).
Result<DirectoryLock> DirectoryLock::take(const std::string& directory, const std::string& holder) {
  const std::string path = directory + "/" + kDirectoryLockName;
  DirectoryLock lock(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC), -1);
  if (lock.directory_fd_ < 0) return system_error("cannot open " + directory + ": " + std::strerror(errno));
  if (::flock(lock.directory_fd_, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    return in_use(directory, lock.directory_fd_);
  }
  // O_NOFOLLOW | O_NONBLOCK: never a symlink's target, never a FIFO waited on.
  lock.fd_ =
      ::openat(lock.directory_fd_, kDirectoryLockName, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (lock.fd_ < 0) {
    if (errno == ELOOP || errno == ENXIO) {
      return invalid_argument(path + " is a symlink or a FIFO; allowed: a regular file Dew made, or none");
    }
    return system_error("cannot open " + path + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(lock.fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    return invalid_argument(path + " is " + kind_of(st.st_mode) + "; allowed: a regular file Dew made, or none");
  }
  if (st.st_nlink != 1) {
    return invalid_argument(path + " has " + std::to_string(st.st_nlink) +
                            " names (a hard link to another file?); allowed: a regular file Dew made, or none");
  }
  lock.device_ = st.st_dev;
  lock.inode_ = st.st_ino;
  if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return system_error("cannot lock " + path + ": " + std::strerror(errno));
    return in_use(directory, lock.directory_fd_);
  }
  if (auto held = lock.still_held(directory); !held.ok()) return held.error();
  const std::string line = one_line(holder) + "\n";
  if (::ftruncate(lock.fd_, 0) != 0 ||
      ::pwrite(lock.fd_, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size())) {
    return system_error("cannot write " + path + ": " + std::strerror(errno));
  }
  return lock;
}

Result<Done> DirectoryLock::still_held(const std::string& directory) const {
  struct stat st {};
  if (fd_ < 0 || ::fstatat(directory_fd_, kDirectoryLockName, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_dev != device_ ||
      st.st_ino != inode_) {
    return unavailable(directory + "/" + kDirectoryLockName +
                       " was removed or replaced while this pool held it: another pool may use the directory; "
                       "allowed: a lock file left as it is while its pool runs");
  }
  return Done{};
}

DirectoryLock& DirectoryLock::operator=(DirectoryLock&& other) noexcept {
  if (this != &other) {
    close_both();
    fd_ = std::exchange(other.fd_, -1);
    directory_fd_ = std::exchange(other.directory_fd_, -1);
    device_ = other.device_;
    inode_ = other.inode_;
  }
  return *this;
}

void DirectoryLock::close_both() {
  // Closing releases the flocks.
  if (fd_ >= 0) ::close(fd_);
  if (directory_fd_ >= 0) ::close(directory_fd_);
  fd_ = directory_fd_ = -1;
}

DirectoryLock::~DirectoryLock() { close_both(); }

}  // namespace dew
