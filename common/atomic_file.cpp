#include "dew/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace dew {
namespace {

Error failed(const std::string& what, const std::string& path) {
  return system_error("cannot " + what + " " + path + ": " + std::strerror(errno));
}

std::string kind_of(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

Result<Done> refuse_unless_regular(const std::string& path, std::string_view what) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Done{};
    return failed("inspect", path);
  }
  if (S_ISREG(st.st_mode)) return Done{};
  return invalid_argument(std::string(what) + ": " + path + " is " + kind_of(st.st_mode) +
                          "; allowed: a regular file or a path that does not exist yet (Dew replaces only a "
                          "regular file)");
}

Result<Done> write_file_atomically(const std::string& path, std::string_view bytes) {
  if (auto regular = refuse_unless_regular(path, "cannot replace"); !regular.ok()) return regular;
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  // O_EXCL | O_NOFOLLOW: whatever is at the temporary's name (a planted
  // symlink) is neither followed nor replaced.
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return failed("create", temporary);
  const auto give_up = [&](const std::string& what) {
    Error error = failed(what, temporary);
    ::close(fd);
    ::unlink(temporary.c_str());
    return error;
  };
  for (std::size_t done = 0; done < bytes.size();) {
    const ssize_t wrote = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote < 0) return give_up("write");
    done += std::size_t(wrote);
  }
  if (::fsync(fd) != 0) return give_up("fsync");
  ::close(fd);
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    Error error = failed("rename to", path);
    ::unlink(temporary.c_str());
    return error;
  }
  // The rename itself survives a crash only once the directory is synced.
  const std::string directory = std::filesystem::path(path).parent_path().string();
  const int dir = ::open(directory.empty() ? "." : directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  return Done{};
}

}  // namespace dew
