#include "frame_reader.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace dew::runtime {
namespace {

// Frames above this are streamed item by item.
constexpr std::size_t kStreamAbove = std::size_t{1} << 20;

std::string receive_error(ssize_t n) {
  return n == 0 ? "connection closed" : std::string("receive failed: ") + std::strerror(errno);
}

}  // namespace

FrameReader::FrameReader(int fd, std::size_t limit, std::string leftover)
    : fd_(fd), limit_(limit), buffer_(std::move(leftover)) {}

std::optional<wire::Frame> FrameReader::next(std::string& error) {
  for (;;) {
    auto decoded = wire::decode(buffer_, limit_);
    if (decoded.status == wire::DecodeStatus::kFrame) {
      buffer_.erase(0, decoded.consumed);
      return std::move(decoded.frame);
    }
    if (decoded.status == wire::DecodeStatus::kBad) {
      error = decoded.error;
      return std::nullopt;
    }
    // decode() has checked the length and the type once both are there.
    const auto size = wire::announced_size(buffer_);
    if (size && *size > kStreamAbove && buffer_.size() > wire::kHeaderBytes) return stream(*size, error);
    if (!fill(buffer_.size() + 1, error)) return std::nullopt;
  }
}

bool FrameReader::fill(std::size_t bytes, std::string& error) {
  char chunk[65536];
  while (buffer_.size() < bytes) {
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = receive_error(n);
      return false;
    }
    buffer_.append(chunk, static_cast<std::size_t>(n));
  }
  return true;
}

bool FrameReader::read_into(std::string& item, std::size_t have, std::string& error) {
  while (have < item.size()) {
    const ssize_t n = ::recv(fd_, item.data() + have, item.size() - have, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = receive_error(n);
      return false;
    }
    have += static_cast<std::size_t>(n);
  }
  return true;
}

std::optional<wire::Frame> FrameReader::stream(std::size_t frame_bytes, std::string& error) {
  wire::Frame frame;
  frame.type = static_cast<wire::Type>(buffer_[wire::kHeaderBytes]);
  std::size_t body_left = frame_bytes - wire::kHeaderBytes - 1;
  buffer_.erase(0, wire::kHeaderBytes + 1);
  const std::string kind(wire::type_name(frame.type));
  while (body_left > 0) {
    if (body_left < 4) {
      error = "truncated item length in a " + kind + " frame";
      return std::nullopt;
    }
    if (!fill(4, error)) return std::nullopt;
    const std::size_t length = wire::decode_u32(buffer_);
    buffer_.erase(0, 4);
    body_left -= 4;
    if (length > body_left) {
      error = "item of " + std::to_string(length) + " bytes overruns its " + kind + " frame";
      return std::nullopt;
    }
    std::string item(length, '\0');
    const std::size_t have = std::min(length, buffer_.size());
    buffer_.copy(item.data(), have);
    buffer_.erase(0, have);
    if (!read_into(item, have, error)) return std::nullopt;
    body_left -= length;
    frame.items.push_back(std::move(item));
  }
  if (!wire::item_count_allowed(frame.type, frame.items.size())) {
    error = kind + " frame with " + std::to_string(frame.items.size()) + " items";
    return std::nullopt;
  }
  return frame;
}

}  // namespace dew::runtime
