//===- Status.h - Success or an error message, without exceptions ----------===//
//
// The MLIR-free libraries are built with exceptions but are called from MLIR
// tools built with -fno-exceptions, so their public functions report failure
// through these types instead of throwing.
//
//===----------------------------------------------------------------------===//
#ifndef DFLEX_SUPPORT_STATUS_H
#define DFLEX_SUPPORT_STATUS_H

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace dflex {

/// Success, or failure with a message meant for the user.
class Status {
public:
  static Status success() { return Status(); }
  static Status failure(std::string message) {
    Status status;
    status.ok_ = false;
    status.message_ = std::move(message);
    return status;
  }

  bool ok() const { return ok_; }
  /// The error message; empty on success.
  const std::string &message() const { return message_; }

private:
  bool ok_ = true;
  std::string message_;
};

/// A value, or an error message.
template <typename T> class Result {
public:
  Result(T value) : value_(std::move(value)) {}
  /// Converts a failed Status; converting a successful one is a bug.
  Result(Status status) : error_(status.message()) { assert(!status.ok()); }

  static Result failure(std::string message) {
    return Result(Status::failure(std::move(message)));
  }

  bool ok() const { return value_.has_value(); }
  const T &value() const & {
    assert(ok());
    return *value_;
  }
  T &value() & {
    assert(ok());
    return *value_;
  }
  T &&value() && {
    assert(ok());
    return std::move(*value_);
  }
  /// The error message; empty on success.
  const std::string &error() const { return error_; }
  Status status() const {
    return ok() ? Status::success() : Status::failure(error_);
  }

private:
  std::optional<T> value_;
  std::string error_;
};

} // namespace dflex

#endif // DFLEX_SUPPORT_STATUS_H
