#include "dew/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace dew {
namespace {

Error failed(const std::string& what, const std::string& path) {
  return system_error("cannot " + what + " " + path + ": " + std::strerror(errno));
}

}  // namespace

Result<Done> write_file_atomically(const std::string& path, std::string_view bytes) {
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
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
