// Reads whole frames from a blocking socket, for a process's connection to
// the coordination service. Each frame comes out as one buffer its items
// view into; a large one (a gather's reply) is read straight into it, so it
// is held once, not twice.
// With a key, every frame must be followed by its tag (auth.h) and is
// refused otherwise. Private to pool/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "auth.h"
#include "wire.h"

namespace dew::runtime {

class FrameReader {
 public:
  // `leftover`: bytes already read past the handshake. `key`: the service's
  // key towards this process; empty during the handshake (no tags yet).
  FrameReader(int fd, std::size_t limit, std::string leftover = {}, std::string key = {});
  // nullopt at the end of the stream or on an error (`error` says which).
  std::optional<wire::ReceivedFrame> next(std::string& error);
  // Called whenever bytes arrive, so a reply that takes long to arrive
  // (a large gather on a slow link) still counts as hearing from the service.
  void on_bytes(std::function<void()> heard) { heard_ = std::move(heard); }
  // Whether a whole frame (or bytes that can never be one) is already
  // buffered: next() then returns without reading.
  bool buffered() const;
  // Whether the last error was a frame that failed its tag.
  bool altered() const { return altered_; }

 private:
  bool fill(std::size_t bytes, std::string& error);  // until buffer_ holds `bytes`
  // Reads until `into` holds `size` bytes (`have` of them already).
  bool read_into(char* into, std::size_t size, std::size_t have, std::string& error);
  std::optional<wire::ReceivedFrame> stream(std::size_t frame_bytes, std::string& error);
  // Whether the tag at the front of `received` is `expected`; if not, says
  // so in `error` and marks the connection altered.
  bool check_tag(const auth::Tag& expected, std::string_view received, wire::Type type, std::string& error);

  int fd_;
  std::size_t limit_;
  std::string buffer_;
  std::string key_;
  std::uint64_t sequence_ = 0;
  std::function<void()> heard_;
  bool altered_ = false;
};

}  // namespace dew::runtime
