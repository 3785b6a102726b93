#pragma once

#include <stdexcept>

namespace dflex::runtime {

/// Input that is malformed or inconsistent: a checkpoint, config or data file,
/// or arguments that contradict each other. The message names the file (and
/// tensor, sample or key) and what is wrong with it.
class FormatError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// A system call on a file failed (open, read, write, map, rename, ...).
class IoError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

} // namespace dflex::runtime
