#include "wire.h"

#include <algorithm>
#include <array>

namespace dew::runtime::wire {
namespace {

void put_u32(std::string& out, std::uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) {
    out.push_back(static_cast<char>((value >> shift) & 0xffU));
  }
}

std::uint32_t get_u32(std::string_view bytes, std::size_t at) {
  std::uint32_t value = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
  }
  return value;
}

struct Shape {
  std::string_view name;
  std::size_t min_items;
  std::size_t max_items;  // SIZE_MAX: no upper bound
};

constexpr std::size_t kAny = static_cast<std::size_t>(-1);

// Indexed by the type byte; entry 0 is no type.
constexpr std::array<Shape, 19> kShapes = {{
    {"", 0, 0},        {"challenge", 1, 2},     {"hello", 4, 4},  {"welcome", 1, 1},     {"refused", 1, 1},
    {"put", 2, 2},     {"get", 3, 3},           {"value", 2, 2},  {"not-found", 1, 1},   {"agree", 3, 3},
    {"agreed", 1, 1},  {"agree-timeout", 2, 2}, {"gather", 4, 4}, {"gathered", 2, kAny}, {"fail", 3, 3},
    {"failure", 3, 3}, {"heartbeat", 0, 0},     {"bye", 0, 0},    {"busy", 1, 1},
}};

bool known_type(std::uint8_t byte) { return byte >= 1 && byte < kShapes.size(); }

}  // namespace

std::string_view type_name(Type type) {
  const auto byte = static_cast<std::uint8_t>(type);
  return known_type(byte) ? kShapes[byte].name : std::string_view("unknown");
}

bool item_count_allowed(Type type, std::size_t count) {
  const auto byte = static_cast<std::uint8_t>(type);
  if (!known_type(byte)) return false;
  const Shape& shape = kShapes[byte];
  return count >= shape.min_items && (shape.max_items == kAny || count <= shape.max_items);
}

std::string encode(const Frame& frame) { return encode_head(frame.type, frame.items, 0); }

std::string encode(Type type, const std::vector<std::string_view>& items) {
  std::size_t body = 1;
  for (const auto& item : items) body += 4 + item.size();
  std::string out;
  out.reserve(kHeaderBytes + body);
  put_u32(out, static_cast<std::uint32_t>(body));
  out.push_back(static_cast<char>(type));
  for (const auto& item : items) append_item(out, item);
  return out;
}

std::string encode_items(const std::vector<std::string>& items) {
  std::size_t bytes = 0;
  for (const auto& item : items) bytes += 4 + item.size();
  std::string out;
  out.reserve(bytes);
  for (const auto& item : items) append_item(out, item);
  return out;
}

std::string encode_length(std::size_t bytes) {
  std::string out;
  put_u32(out, static_cast<std::uint32_t>(bytes));
  return out;
}

void append_item(std::string& out, std::string_view item) {
  put_u32(out, static_cast<std::uint32_t>(item.size()));
  out += item;
}

std::optional<std::size_t> announced_size(std::string_view buffer) {
  if (buffer.size() < kHeaderBytes) return std::nullopt;
  return kHeaderBytes + get_u32(buffer, 0);
}

std::string encode_head(Type type, const std::vector<std::string>& leading, std::size_t tail_bytes) {
  std::size_t body = 1 + tail_bytes;
  for (const auto& item : leading) body += 4 + item.size();
  std::string out;
  out.reserve(kHeaderBytes + body - tail_bytes);
  put_u32(out, static_cast<std::uint32_t>(body));
  out.push_back(static_cast<char>(type));
  for (const auto& item : leading) append_item(out, item);
  return out;
}

std::size_t encoded_size(const std::vector<std::size_t>& item_sizes) {
  std::size_t bytes = kHeaderBytes + 1;
  for (std::size_t size : item_sizes) bytes += 4 + size;
  return bytes;
}

std::uint32_t decode_u32(std::string_view bytes) { return get_u32(bytes, 0); }

std::size_t head_bytes(std::string_view frame) noexcept {
  constexpr std::size_t kTyped = kHeaderBytes + 1;
  if (frame.size() < kTyped + 4) return std::min(frame.size(), kTyped);
  const std::size_t first = get_u32(frame, kTyped);
  return std::min(frame.size(), kTyped + 4 + first);
}

Frame failure_frame(Type type, std::uint64_t rank, std::string message, bool stopped) {
  return Frame{type, {encode_u64(rank), std::move(message), std::string(stopped ? kStoppedKind : kFailedKind)}};
}

std::string encode_u64(std::uint64_t value) {
  std::string out;
  for (int shift = 56; shift >= 0; shift -= 8) {
    out.push_back(static_cast<char>((value >> shift) & 0xffU));
  }
  return out;
}

std::optional<std::uint64_t> decode_u64(std::string_view item) {
  if (item.size() != 8) return std::nullopt;
  std::uint64_t value = 0;
  for (char c : item) value = (value << 8) | static_cast<unsigned char>(c);
  return value;
}

DecodedViews decode_views(std::string_view buffer, std::size_t max_frame_bytes) {
  DecodedViews result;
  if (buffer.size() < kHeaderBytes) return result;
  const std::size_t length = get_u32(buffer, 0);
  auto bad = [&](std::string error) {
    result.status = DecodeStatus::kBad;
    result.error = std::move(error);
    result.items.clear();
    return result;
  };
  if (length == 0) return bad("empty frame (length 0; a frame holds at least its type byte)");
  if (length > max_frame_bytes) {
    return bad("frame of " + std::to_string(length) + " bytes is over the limit of " + std::to_string(max_frame_bytes));
  }
  // The type is checked before the whole frame arrives, so garbage is refused
  // at its first bytes rather than after waiting for a length it made up.
  if (buffer.size() < kHeaderBytes + 1) return result;
  const auto type_byte = static_cast<std::uint8_t>(buffer[kHeaderBytes]);
  if (!known_type(type_byte)) {
    return bad("unknown frame type " + std::to_string(type_byte) + " (allowed: 1-" +
               std::to_string(kShapes.size() - 1) + ")");
  }
  if (buffer.size() - kHeaderBytes < length) return result;

  const std::string_view body = buffer.substr(kHeaderBytes, length);
  result.type = static_cast<Type>(type_byte);
  const auto kind = [&] { return std::string(type_name(result.type)); };
  // Checked and counted first, so the views take one allocation (a gather's
  // reply carries an item per process) and a refused frame none.
  std::size_t count = 0;
  for (std::size_t at = 1; at < body.size(); ++count) {
    if (body.size() - at < 4) return bad("truncated item length in a " + kind() + " frame");
    const std::size_t item_length = get_u32(body, at);
    at += 4;
    if (item_length > body.size() - at) {
      return bad("item of " + std::to_string(item_length) + " bytes overruns its " + kind() + " frame");
    }
    at += item_length;
  }
  if (!item_count_allowed(result.type, count)) {
    const Shape& shape = kShapes[type_byte];
    return bad(kind() + " frame with " + std::to_string(count) + " items (allowed: " + std::to_string(shape.min_items) +
               (shape.max_items == kAny              ? " or more"
                : shape.max_items == shape.min_items ? ""
                                                     : "-" + std::to_string(shape.max_items)) +
               ")");
  }
  result.items.reserve(count);
  for (std::size_t at = 1; at < body.size();) {
    const std::size_t item_length = get_u32(body, at);
    result.items.push_back(body.substr(at + 4, item_length));
    at += 4 + item_length;
  }
  result.status = DecodeStatus::kFrame;
  result.consumed = kHeaderBytes + length;
  return result;
}

Decoded decode(std::string_view buffer, std::size_t max_frame_bytes) {
  auto views = decode_views(buffer, max_frame_bytes);
  Decoded result;
  result.status = views.status;
  result.consumed = views.consumed;
  result.error = std::move(views.error);
  if (views.status == DecodeStatus::kFrame) {
    result.frame.type = views.type;
    result.frame.items.assign(views.items.begin(), views.items.end());
  }
  return result;
}

}  // namespace dew::runtime::wire
