//===- Error.h - The exceptions of code built with them ----------*- C++ -*-===//
//
// The runtime (and the implementations of the MLIR-free libraries, which
// catch them at their public functions and return a Status) report bad input
// with these. The message names the file (and tensor, sample or key) and
// what is wrong with it.
//
//===----------------------------------------------------------------------===//
#ifndef DFLEX_SUPPORT_ERROR_H
#define DFLEX_SUPPORT_ERROR_H

#include <stdexcept>

namespace dflex {

/// Input that is malformed or inconsistent: a checkpoint, config, manifest or
/// data file, or arguments that contradict each other.
class FormatError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// A system call on a file failed (open, read, write, map, rename, ...).
class IoError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

} // namespace dflex

#endif // DFLEX_SUPPORT_ERROR_H
