// Reads whole frames from a blocking socket, for a process's connection to
// the coordination service. A large frame (a gather's reply) is read item by
// item straight into the strings it returns, so it is held once, not twice.
// Private to pool/.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "wire.h"

namespace dew::runtime {

class FrameReader {
 public:
  // `leftover`: bytes already read past the handshake.
  FrameReader(int fd, std::size_t limit, std::string leftover = {});
  // nullopt at the end of the stream or on an error (`error` says which).
  std::optional<wire::Frame> next(std::string& error);

 private:
  bool fill(std::size_t bytes, std::string& error);  // until buffer_ holds `bytes`
  bool read_into(std::string& item, std::size_t have, std::string& error);
  std::optional<wire::Frame> stream(std::size_t frame_bytes, std::string& error);

  int fd_;
  std::size_t limit_;
  std::string buffer_;
};

}  // namespace dew::runtime
