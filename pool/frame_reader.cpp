#include "frame_reader.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace dew::runtime {
namespace {

// Frames above this are read straight into a buffer of their own.
constexpr std::size_t kStreamAbove = std::size_t{1} << 20;

// Views into a buffer that was at `from` made views into `to`, a copy of it
// or the same bytes moved (only the old address is used, never read).
void rebase(std::vector<std::string_view>& views, const char* from, std::string_view to) {
  for (auto& view : views) view = to.substr(static_cast<std::size_t>(view.data() - from), view.size());
}

std::string receive_error(ssize_t n) {
  return n == 0 ? "connection closed" : std::string("receive failed: ") + std::strerror(errno);
}

}  // namespace

FrameReader::FrameReader(int fd, std::size_t limit, std::string leftover, std::string key)
    : fd_(fd), limit_(limit), buffer_(std::move(leftover)), key_(std::move(key)) {}

// A frame is decoded once, when it and its tag are all in: until then only
// its header is looked at (decode_views refuses a bad length or type at
// once, without walking items), and the rest is read in one fill.
std::optional<wire::ReceivedFrame> FrameReader::next(std::string& error) {
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
      // One allocation of the frame's size: the buffer may leave with it.
      if (checked) buffer_.reserve(*size + tag);
      if (!fill(checked ? *size + tag : buffer_.size() + 1, error)) return std::nullopt;
      continue;
    }
    if (buffer_.size() < decoded.consumed + tag) {
      if (!fill(decoded.consumed + tag, error)) return std::nullopt;
      continue;  // the buffer may have moved
    }
    const std::string_view frame = std::string_view(buffer_).substr(0, decoded.consumed);
    if (tag != 0 && !check_tag(auth::frame_tag(key_, sequence_++, frame),
                               std::string_view(buffer_).substr(frame.size()), decoded.type, error)) {
      return std::nullopt;
    }
    // The frame's bytes move out whole: the buffer itself when it holds
    // nothing more (no copy), else a copy of the frame.
    const char* was_at = frame.data();
    auto bytes = std::make_shared<std::string>();
    if (buffer_.size() == decoded.consumed + tag) {
      bytes->swap(buffer_);
      bytes->resize(decoded.consumed);
    } else {
      bytes->assign(frame);
      buffer_.erase(0, decoded.consumed + tag);
    }
    rebase(decoded.items, was_at, *bytes);
    return wire::ReceivedFrame{decoded.type, std::move(bytes), std::move(decoded.items)};
  }
}

bool FrameReader::buffered() const {
  // A whole frame, or bytes decode_views refuses without walking them.
  const auto size = wire::announced_size(buffer_);
  if (size && buffer_.size() >= *size) return true;
  return wire::decode_views(buffer_, limit_).status == wire::DecodeStatus::kBad;
}

bool FrameReader::check_tag(const auth::Tag& expected, std::string_view received, wire::Type type, std::string& error) {
  if (auth::same_tag(expected, received.substr(0, auth::kTagBytes))) return true;
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

bool FrameReader::read_into(char* into, std::size_t size, std::size_t have, std::string& error) {
  while (have < size) {
    const ssize_t n = ::recv(fd_, into + have, size - have, 0);
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

// A large frame is read straight into its own buffer (no copy through
// buffer_), then decoded and its tag checked like any other. The buffer is
// left uninitialized: its pages are taken as the bytes arrive, while process
// 0's service gives back the parts it has sent (a zeroed one held the whole
// reply beside them: 2x the payload on process 0).
std::optional<wire::ReceivedFrame> FrameReader::stream(std::size_t frame_bytes, std::string& error) {
  std::shared_ptr<char[]> buffer(new char[frame_bytes]);
  const std::size_t have = std::min(frame_bytes, buffer_.size());
  buffer_.copy(buffer.get(), have);
  buffer_.erase(0, have);
  if (!read_into(buffer.get(), frame_bytes, have, error)) return std::nullopt;
  const std::string_view bytes(buffer.get(), frame_bytes);
  auto decoded = wire::decode_views(bytes, limit_);
  if (decoded.status != wire::DecodeStatus::kFrame) {
    error = decoded.status == wire::DecodeStatus::kBad ? decoded.error : "a frame shorter than its length";
    return std::nullopt;
  }
  if (!key_.empty()) {
    if (!fill(auth::kTagBytes, error)) return std::nullopt;
    if (!check_tag(auth::frame_tag(key_, sequence_++, bytes), buffer_, decoded.type, error)) return std::nullopt;
    buffer_.erase(0, auth::kTagBytes);
  }
  return wire::ReceivedFrame{decoded.type, std::move(buffer), std::move(decoded.items)};
}

}  // namespace dew::runtime
