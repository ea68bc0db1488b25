// Checking errors by their kind: a test asserts the ErrorCode, and reads the
// message only where the sentence is the feature (a parser naming the bad
// value and what is allowed).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "dew/result.h"

namespace dew::testing {

// The message of `result`'s Error, after expecting that it failed with `code`
// (an empty string when it did not fail).
template <typename R>
std::string message_of(const R& result, ErrorCode code) {
  EXPECT_FALSE(result.ok()) << "expected an error of kind " << error_code_name(code);
  if (result.ok()) return {};
  EXPECT_EQ(result.error().code, code) << "the error was: " << result.error().message << " (kind "
                                       << error_code_name(result.error().code) << ")";
  return result.error().message;
}

// The same for the most common kind.
template <typename R>
std::string invalid_argument_of(const R& result) {
  return message_of(result, ErrorCode::kInvalidArgument);
}

}  // namespace dew::testing
