// Text for mesh errors (private to mesh/): a message is one line, whatever
// bytes the user's input held (common's printable, quoted, one_line).
#pragma once

#include <string>
#include <string_view>

#include "dew/text.h"

namespace dew::mesh {

// 'text' with control and non-ASCII bytes as \xNN, cut after 60 bytes.
inline std::string quote(std::string_view text) { return quoted(text, 60); }

// A number as %g writes it: 25, 0.5, -1, nan.
std::string number_text(double value);

// Sizes and replicas: larger ones cannot describe a real mesh, and the bound
// keeps the product of all axes within 64 bits.
inline constexpr int kMaxSize = 1 << 20;

// "mesh spec: NAME = 'VALUE' is not allowed; allowed: a whole number from 1
// to 1048576".
std::string bad_size(std::string_view name, std::string_view value);

}  // namespace dew::mesh
