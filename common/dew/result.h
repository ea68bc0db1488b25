// Value-or-error, shared by every Dew library: the pure cores return it, the
// edges (SPANK callbacks, the dew command) turn an Error into one line.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace dew {

// A one-line, user-facing message naming the bad value and what is allowed.
struct Error {
  std::string message;
};

// Value or Error. Nothing in the cores throws across a C boundary; callers
// test ok() and read value() or error().
template <typename T>
class Result {
 public:
  Result(T value) : state_(std::move(value)) {}      // NOLINT: implicit by design
  Result(Error error) : state_(std::move(error)) {}  // NOLINT: implicit by design
  [[nodiscard]] bool ok() const { return std::holds_alternative<T>(state_); }
  [[nodiscard]] const T& value() const { return std::get<T>(state_); }
  [[nodiscard]] T& value() { return std::get<T>(state_); }
  [[nodiscard]] const Error& error() const { return std::get<Error>(state_); }

 private:
  std::variant<T, Error> state_;
};

}  // namespace dew
