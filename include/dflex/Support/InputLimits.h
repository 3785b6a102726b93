//===- InputLimits.h - reject inputs the parser cannot take safely -*- C++ -*-===//
//
// The MLIR parser recurses once per nesting level of brackets, so a few
// hundred thousand nested brackets overflow the stack. Tools check their
// input first and refuse such files with a located error.
//
//===----------------------------------------------------------------------===//

#ifndef DFLEX_SUPPORT_INPUTLIMITS_H
#define DFLEX_SUPPORT_INPUTLIMITS_H

#include <optional>
#include <string>
#include <string_view>

namespace dflex {

/// Deepest bracket nesting a dflex input may have.
constexpr int kMaxNestingDepth = 256;
/// Longest number literal: APInt parses literals in quadratic time.
constexpr int kMaxNumberLength = 1024;

struct InputProblem {
  int line = 0;   // 1-based
  int column = 0; // 1-based
  std::string message;
};

/// Scans `text` (skipping string literals and // comments) and reports the
/// first place where brackets ( [ { < nest deeper than `maxDepth` or a
/// number literal is longer than kMaxNumberLength.
std::optional<InputProblem> checkInputLimits(std::string_view text,
                                             int maxDepth = kMaxNestingDepth);

} // namespace dflex

#endif // DFLEX_SUPPORT_INPUTLIMITS_H
