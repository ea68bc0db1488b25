#include "text.h"

#include <cstdio>

namespace dew::mesh {

std::string number_text(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", value);
  return buffer;
}

std::string bad_size(std::string_view name, std::string_view value) {
  return "mesh spec: " + std::string(name) + " = " + quote(value) +
         " is not allowed; allowed: a whole number from 1 to " + std::to_string(kMaxSize);
}

}  // namespace dew::mesh
