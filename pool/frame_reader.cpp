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

FrameReader::FrameReader(int fd, std::size_t limit, std::string leftover, std::string key)
    : fd_(fd), limit_(limit), buffer_(std::move(leftover)), key_(std::move(key)) {}

// A frame is decoded once, when it and its tag are all in: until then only
// its header is looked at (decode_views refuses a bad length or type at
// once, without walking items), and the rest is read in one fill.
std::optional<wire::Frame> FrameReader::next(std::string& error) {
  const std::size_t tag = key_.empty() ? 0 : auth::kTagBytes;
  for (;;) {
    auto decoded = wire::decode_views(buffer_, limit_);
    if (decoded.status == wire::DecodeStatus::kBad) {
      error = decoded.error;
      return std::nullopt;
    }
    if (decoded.status == wire::DecodeStatus::kNeedMore) {
      // decode_views has checked the length and the type once both are there.
      const auto size = wire::announced_size(buffer_);
      const bool checked = size && buffer_.size() > wire::kHeaderBytes;
      if (checked && *size > kStreamAbove) return stream(*size, error);
      if (!fill(checked ? *size + tag : buffer_.size() + 1, error)) return std::nullopt;
      continue;
    }
    if (buffer_.size() < decoded.consumed + tag) {
      if (!fill(decoded.consumed + tag, error)) return std::nullopt;
      continue;  // the buffer may have moved
    }
    wire::Frame whole{decoded.type, std::vector<std::string>(decoded.items.begin(), decoded.items.end())};
    if (tag == 0) {
      buffer_.erase(0, decoded.consumed);
      return whole;
    }
    const std::string_view frame = std::string_view(buffer_).substr(0, decoded.consumed);
    const std::size_t head = wire::head_bytes(frame);
    auth::TailHasher tail(key_);
    tail.add(frame.substr(head));
    const std::string head_bytes(frame.substr(0, head));
    buffer_.erase(0, decoded.consumed);
    if (!take_tag(head_bytes, tail.finish(), whole.type, error)) return std::nullopt;
    return whole;
  }
}

bool FrameReader::buffered() const {
  // A whole frame, or bytes decode_views refuses without walking them.
  const auto size = wire::announced_size(buffer_);
  if (size && buffer_.size() >= *size) return true;
  return wire::decode_views(buffer_, limit_).status == wire::DecodeStatus::kBad;
}

bool FrameReader::take_tag(std::string_view head, const auth::TailHash& tail, wire::Type type, std::string& error) {
  if (!fill(auth::kTagBytes, error)) return false;
  const auto expected = auth::frame_tag(key_, sequence_++, head, tail);
  const bool same = auth::same_tag(expected, std::string_view(buffer_).substr(0, auth::kTagBytes));
  buffer_.erase(0, auth::kTagBytes);
  if (same) return true;
  altered_ = true;
  error = "its " + std::string(wire::type_name(type)) + " frame " + std::to_string(sequence_ - 1) +
          " from the coordination service failed its integrity check";
  return false;
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
    if (heard_) heard_();
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
    if (heard_) heard_();
    have += static_cast<std::size_t>(n);
  }
  return true;
}

// The frame's head (length, type, first item) is kept for its tag; every
// byte after it goes through the tail's hash as it arrives.
std::optional<wire::Frame> FrameReader::stream(std::size_t frame_bytes, std::string& error) {
  wire::Frame frame;
  frame.type = static_cast<wire::Type>(buffer_[wire::kHeaderBytes]);
  std::string head = buffer_.substr(0, wire::kHeaderBytes + 1);
  auth::TailHasher tail(key_);
  std::size_t body_left = frame_bytes - wire::kHeaderBytes - 1;
  buffer_.erase(0, wire::kHeaderBytes + 1);
  const std::string kind(wire::type_name(frame.type));
  while (body_left > 0) {
    if (body_left < 4) {
      error = "truncated item length in a " + kind + " frame";
      return std::nullopt;
    }
    if (!fill(4, error)) return std::nullopt;
    const std::string_view length_bytes = std::string_view(buffer_).substr(0, 4);
    const std::size_t length = wire::decode_u32(buffer_);
    const bool first = frame.items.empty();
    if (first) {
      head += length_bytes;
    } else {
      tail.add(length_bytes);
    }
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
    if (first) {
      head += item;
    } else {
      tail.add(item);
    }
    body_left -= length;
    frame.items.push_back(std::move(item));
  }
  if (!wire::item_count_allowed(frame.type, frame.items.size())) {
    error = kind + " frame with " + std::to_string(frame.items.size()) + " items";
    return std::nullopt;
  }
  if (!key_.empty() && !take_tag(head, tail.finish(), frame.type, error)) return std::nullopt;
  return frame;
}

}  // namespace dew::runtime
