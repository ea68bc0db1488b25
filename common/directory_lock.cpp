#include "dew/directory_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dew/text.h"

namespace dew {
namespace {

std::string read_holder(int fd) {
  char text[512] = {};
  const ssize_t got = ::pread(fd, text, sizeof text - 1, 0);
  std::string holder = got > 0 ? std::string(text, static_cast<std::size_t>(got)) : "";
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\r')) holder.pop_back();
  return holder.empty() ? std::string("a process that has not said who it is") : one_line(holder);
}

}  // namespace

Result<DirectoryLock> DirectoryLock::take(const std::string& directory, const std::string& holder) {
  const std::string path = directory + "/" + kDirectoryLockName;
  // O_NOFOLLOW | O_NONBLOCK: never a symlink's target, never a FIFO waited on.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0) return system_error("cannot open " + path + ": " + std::strerror(errno));
  DirectoryLock lock(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return invalid_argument(path + " is not a regular file; allowed: a regular file Dew made, or none");
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return system_error("cannot lock " + path + ": " + std::strerror(errno));
    return unavailable(directory + " is in use by " + read_holder(fd) +
                       "; allowed: a directory no other running pool uses (it is free again once that pool ends)");
  }
  const std::string line = one_line(holder) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size())) {
    return system_error("cannot write " + path + ": " + std::strerror(errno));
  }
  return lock;
}

DirectoryLock& DirectoryLock::operator=(DirectoryLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

}  // namespace dew
