// Value-or-error, shared by every Dew library: the pure cores return it, the
// edges (SPANK callbacks, the dew command, the pool's throwing API) turn an
// Error into one line, an exit code or an exception carrying the same code.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "dew/export.h"

namespace dew {

// What kind of failure an Error is: a closed set, so callers (and tests)
// branch on the kind, never on the sentence.
enum class ErrorCode {
  kInvalidArgument,   // a value given (option, variable, spec, file, frame) is not allowed
  kNotFound,          // something named does not exist (a file, key, device, program)
  kUnsupported,       // well-formed, but not something this build or machine does
  kTimeout,           // a bound ran out (a join, a get, a patience, a collective)
  kPeerFailed,        // another process of the pool failed
  kUnavailable,       // a peer, service, library or device cannot be reached or is not there
  kPermissionDenied,  // refused for want of the pool's secret
  kSystem,            // the operating system refused (fork, pipe, socket, a write)
  kInternal,          // a broken invariant: a bug in Dew
};

// "invalid argument", "timeout", ...: for logs and for `dew` JSON output.
constexpr std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kNotFound:
      return "not found";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kTimeout:
      return "timeout";
    case ErrorCode::kPeerFailed:
      return "peer failed";
    case ErrorCode::kUnavailable:
      return "unavailable";
    case ErrorCode::kPermissionDenied:
      return "permission denied";
    case ErrorCode::kSystem:
      return "system";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

// The kind, and one user-facing line naming the bad value and what is allowed.
struct DEW_API Error {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
  // For a pool's agreement or gather whose patience ran out (kTimeout): the
  // processes that never arrived, which a caller may end the pool for
  // (runtime::Pool::fail_for_late). Empty for every other error.
  std::vector<int> late_processes = {};

  // The same kind with context in front: "SLURM_STEP_NODELIST: " + message.
  [[nodiscard]] Error prefixed(std::string_view context) const {
    return {code, std::string(context) + message, late_processes};
  }
};

inline Error invalid_argument(std::string message) { return {ErrorCode::kInvalidArgument, std::move(message)}; }
inline Error not_found(std::string message) { return {ErrorCode::kNotFound, std::move(message)}; }
inline Error unsupported(std::string message) { return {ErrorCode::kUnsupported, std::move(message)}; }
inline Error timeout_error(std::string message) { return {ErrorCode::kTimeout, std::move(message)}; }
inline Error peer_failed(std::string message) { return {ErrorCode::kPeerFailed, std::move(message)}; }
inline Error unavailable(std::string message) { return {ErrorCode::kUnavailable, std::move(message)}; }
inline Error permission_denied(std::string message) { return {ErrorCode::kPermissionDenied, std::move(message)}; }
inline Error system_error(std::string message) { return {ErrorCode::kSystem, std::move(message)}; }
inline Error internal_error(std::string message) { return {ErrorCode::kInternal, std::move(message)}; }

// The form every "bad value" error takes: "<what>: '<value>' is not allowed;
// allowed: <allowed>" (kInvalidArgument).
inline Error not_allowed(std::string_view what, std::string_view value, std::string_view allowed) {
  return invalid_argument(std::string(what) + ": '" + std::string(value) +
                          "' is not allowed; allowed: " + std::string(allowed));
}

// Value or Error. Nothing in the cores throws across a C boundary; callers
// test ok() and read value() or error().
template <typename T>
class [[nodiscard]] Result {
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

// The value of a call that returns nothing but may fail: Result<Done>.
struct Done {};

}  // namespace dew
