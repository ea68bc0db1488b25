// MeshSpec from text: a JSON object or a key=value list, checked strictly so
// that a typo (an unknown axis, a size of 0, an axis given twice) is an error
// naming it instead of a mesh the user did not ask for.
#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "dew/mesh.h"
#include "text.h"

namespace dew::mesh {
namespace {

const std::string kAllowedSize = "allowed: a whole number from 1 to " + std::to_string(kMaxSize);
const std::string kAllowedNames = "allowed: data, stage, fsdp, expert, tensor, sequence, replicas";

// Index into MeshSpec::sizes, kAxisCount for replicas, -1 when unknown.
int key_index(std::string_view key) {
  for (int a = 0; a < kAxisCount; ++a) {
    if (kMeshAxes[a] == key) return a;
  }
  return key == "replicas" ? kAxisCount : -1;
}

// Records one key's value, refusing unknown keys and repeats.
class SpecBuilder {
 public:
  // Nullopt when the key may take a value; else the error.
  std::optional<Error> key(std::string_view key) {
    const int index = key_index(key);
    if (index < 0) {
      return invalid_argument("mesh spec: unknown axis " + quote(key) + "; " + kAllowedNames);
    }
    if (seen_[index]) {
      return invalid_argument("mesh spec: axis " + quote(key) + " is given twice; give it once");
    }
    seen_[index] = true;
    index_ = index;
    return std::nullopt;
  }
  // value_text: the value as the user wrote it, for the message.
  std::optional<Error> value(std::int64_t value, bool whole, std::string_view value_text) {
    if (!whole || value < 1 || value > kMaxSize) return invalid_argument(bad_size(current_name(), value_text));
    if (index_ == kAxisCount) {
      spec_.replicas = static_cast<int>(value);
    } else {
      spec_.sizes[index_] = static_cast<int>(value);
    }
    return std::nullopt;
  }
  [[nodiscard]] std::string_view current_name() const { return index_ == kAxisCount ? "replicas" : kMeshAxes[index_]; }
  [[nodiscard]] const MeshSpec& spec() const { return spec_; }

 private:
  MeshSpec spec_;
  std::array<bool, kAxisCount + 1> seen_{};
  int index_ = 0;
};

using json = nlohmann::json;

// A SAX handler: it sees duplicate keys (a DOM parse keeps only the last)
// and stops at the first nested value without building it.
class SpecSax final : public nlohmann::json_sax<json> {
 public:
  bool null() override { return scalar("null"); }
  bool boolean(bool val) override { return scalar(val ? "true" : "false"); }
  bool number_integer(number_integer_t val) override { return number(val, true, std::to_string(val)); }
  bool number_unsigned(number_unsigned_t val) override {
    const bool fits = val <= static_cast<number_unsigned_t>(kMaxSize);
    return number(fits ? static_cast<std::int64_t>(val) : std::int64_t{kMaxSize} + 1, true, std::to_string(val));
  }
  bool number_float(number_float_t /*val*/, const string_t& text) override {
    // 2.0 is refused too: a size is a count, written as one.
    return number(0, false, text);
  }
  bool string(string_t& val) override { return scalar(json(val).dump(-1, ' ', false, json::error_handler_t::replace)); }
  bool binary(binary_t& /*val*/) override { return scalar("binary"); }
  bool start_object(std::size_t /*elements*/) override {
    if (depth_++ == 0) return true;
    return nested("an object");
  }
  bool key(string_t& val) override {
    if (auto error = builder_.key(val)) return fail(std::move(*error));
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t /*elements*/) override {
    if (depth_++ == 0) return fail(invalid_argument("mesh spec: a JSON array is not allowed; " + kAllowedForm));
    return nested("an array");
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) override {
    // Drop the "[json.exception.parse_error.101] " prefix: the rest says
    // where and what.
    std::string what = ex.what();
    if (const auto end = what.find("] "); what.starts_with("[json.") && end != std::string::npos) {
      what.erase(0, end + 2);
    }
    return fail(invalid_argument("mesh spec: invalid JSON: " + one_line(what)));
  }

  [[nodiscard]] Result<MeshSpec> result() const {
    if (error_) return *error_;
    return builder_.spec();
  }

 private:
  static inline const std::string kAllowedForm = "allowed: a JSON object such as {\"fsdp\": 2, \"replicas\": 2}";

  bool scalar(std::string_view text) {
    if (depth_ == 0) {
      return fail(invalid_argument("mesh spec: " + quote(text) + " is not allowed; " + kAllowedForm));
    }
    return number(0, false, text);
  }
  bool number(std::int64_t value, bool whole, std::string_view text) {
    if (depth_ == 0) {
      return fail(invalid_argument("mesh spec: " + quote(text) + " is not allowed; " + kAllowedForm));
    }
    if (auto error = builder_.value(value, whole, text)) return fail(std::move(*error));
    return true;
  }
  bool nested(std::string_view what) {
    return fail(invalid_argument("mesh spec: " + std::string(builder_.current_name()) + " is " + std::string(what) +
                                 "; " + kAllowedSize));
  }
  bool fail(Error error) {
    if (!error_) error_ = std::move(error);
    return false;
  }

  SpecBuilder builder_;
  int depth_ = 0;
  std::optional<Error> error_;
};

std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

const Error kEmpty{ErrorCode::kInvalidArgument,
                   "mesh spec is empty; allowed: a JSON object such as {\"fsdp\": 2} or axis=size pairs such as "
                   "fsdp=2 ({} for data parallel over every device)"};

}  // namespace

Result<MeshSpec> parse_mesh_spec_json(std::string_view text) {
  if (trim(text).empty()) return kEmpty;
  SpecSax sax;
  json::sax_parse(text.begin(), text.end(), &sax);
  return sax.result();
}

Result<MeshSpec> parse_mesh_spec_pairs(std::string_view text) {
  if (trim(text).empty()) return kEmpty;
  SpecBuilder builder;
  std::size_t start = 0;
  while (start <= text.size()) {
    const auto comma = std::min(text.find(',', start), text.size());
    const std::string_view entry = trim(text.substr(start, comma - start));
    start = comma + 1;
    const auto equals = entry.find('=');
    if (entry.empty() || equals == std::string_view::npos) {
      return invalid_argument("mesh spec: " + quote(entry) + " in " + quote(text) +
                              " is not axis=size; allowed: axis=size pairs separated by commas, such as "
                              "fsdp=2,replicas=2");
    }
    if (auto error = builder.key(trim(entry.substr(0, equals)))) return *error;
    const std::string_view value = trim(entry.substr(equals + 1));
    std::int64_t number = 0;
    const bool digits =
        !value.empty() && std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
    for (const char c : digits ? value : std::string_view{}) {
      number = std::min<std::int64_t>(number * 10 + (c - '0'), std::int64_t{kMaxSize} + 1);
    }
    if (auto error = builder.value(number, digits, value)) return *error;
  }
  return builder.spec();
}

Result<std::vector<int>> parse_device_order(std::string_view text) {
  std::vector<int> ids;
  for (const auto& entry : split(text, ',')) {
    const auto id = entry.size() <= 9 ? parse_whole<int>(entry) : std::nullopt;
    if (!id) {
      return invalid_argument(quote(entry) + " in " + quote(text) +
                              " is not allowed; allowed: device ids (whole numbers >= 0) separated by commas, such as "
                              "0,2,1,3");
    }
    ids.push_back(*id);
  }
  return ids;
}

Result<MeshSpec> parse_mesh_spec(std::string_view text) {
  const std::string_view body = trim(text);
  if (!body.empty() && (body.front() == '{' || body.front() == '[')) {
    return parse_mesh_spec_json(text);
  }
  return parse_mesh_spec_pairs(text);
}

std::string format_mesh_spec(const MeshSpec& spec) {
  std::string out;
  for (int a = 0; a < kAxisCount; ++a) {
    if (!spec.sizes[a]) continue;
    out += (out.empty() ? "" : ",") + std::string(kMeshAxes[a]) + "=" + std::to_string(*spec.sizes[a]);
  }
  if (spec.replicas != 1) {
    out += (out.empty() ? "" : ",") + std::string("replicas=") + std::to_string(spec.replicas);
  }
  return out.empty() ? "{}" : out;
}

Result<MeshShape> resolve_shape(const MeshSpec& spec, int devices) {
  if (devices < 1) {
    return invalid_argument("mesh: " + std::to_string(devices) + " devices to lay out; allowed: at least 1");
  }
  // Sizes are at most 2^20 each; a product past 2^40 cannot match an int
  // device count, so it is kept only as "too many".
  constexpr std::int64_t kCap = std::int64_t{1} << 40;
  std::int64_t product = 1;
  std::string named;
  for (int a = 0; a < kAxisCount; ++a) {
    if (!spec.sizes[a]) continue;
    const int size = *spec.sizes[a];
    if (size < 1 || size > kMaxSize) return invalid_argument(bad_size(kMeshAxes[a], std::to_string(size)));
    product = std::min(product * size, kCap);
    named += (named.empty() ? "" : " x ") + std::string(kMeshAxes[a]) + "=" + std::to_string(size);
  }
  const std::string made = product >= kCap ? "more than " + std::to_string(kCap) : std::to_string(product);
  // "fsdp=3 asks for 3 devices", "fsdp=3 x tensor=2 multiply to 6".
  const bool one_axis = named.find(" x ") == std::string::npos;
  const std::string makes =
      one_axis ? " asks for " + made + (product == 1 ? " device" : " devices") : " multiply to " + made;
  MeshShape shape{};
  for (int a = 0; a < kAxisCount; ++a) shape[a] = spec.sizes[a].value_or(1);
  const auto data = static_cast<int>(Axis::kData);
  if (spec.sizes[data]) {
    if (product != devices) {
      return invalid_argument("mesh spec: " + named + makes + ", but there " + (devices == 1 ? "is " : "are ") +
                              counted(devices, "device") + "; the sizes must multiply to the device count");
    }
  } else if (devices % product != 0) {
    return invalid_argument("mesh spec: " + named + makes + ", which does not divide the " +
                            counted(devices, "device") +
                            "; data takes the devices left over, so the other axes must multiply to a divisor of " +
                            std::to_string(devices));
  } else {
    shape[data] = static_cast<int>(devices / product);
  }
  return shape;
}

std::string format_mesh_shape(const MeshShape& shape) {
  std::string out;
  for (int a = 0; a < kAxisCount; ++a) {
    if (shape[a] > 1) out += (out.empty() ? "" : " ") + std::string(kMeshAxes[a]) + "=" + std::to_string(shape[a]);
  }
  return out.empty() ? "one device" : out;
}

}  // namespace dew::mesh
