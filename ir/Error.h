// Error reporting for the whole compiler.
//
// Two kinds of failure, as in Halide's user_assert/internal_assert:
//  - UserError: the input is wrong (a cell file, an IR dump, a weights file, a shape). The message
//    names the place: `file:line:col` with the source line and a caret, or the tensor with its
//    expected and actual shape. The `rnnc` tool prints it and exits with status 1.
//  - InternalError: an invariant of rnnc itself is broken. Always a bug in rnnc.
#pragma once

#include <stdexcept>
#include <string>

namespace rnnc {

// A position in a source text (cell file or IR dump). `lineText` is the whole source line so the
// error can show it with a caret under columns [col, col + length).
struct SourceLoc {
  std::string file;
  int line = 0; // 1-based; 0 means "no position known"
  int col = 0;  // 1-based
  int length = 1;
  std::string lineText;
};

class UserError : public std::runtime_error {
public:
  explicit UserError(const std::string& message) : std::runtime_error(message) {}
};

class InternalError : public std::logic_error {
public:
  explicit InternalError(const std::string& message)
      : std::logic_error("internal error: " + message) {}
};

// Formats `file:line:col: error: message`, then the source line and a caret line.
std::string formatAt(const SourceLoc& loc, const std::string& message);

[[noreturn]] void throwUserErrorAt(const SourceLoc& loc, const std::string& message);

} // namespace rnnc

// Checks an invariant of rnnc itself; never used for validating user input.
#define RNNC_INTERNAL_CHECK(cond, msg)                                                             \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      throw ::rnnc::InternalError(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " +  \
                                  (msg));                                                          \
  } while (0)
