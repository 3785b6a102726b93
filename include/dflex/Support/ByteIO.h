//===- ByteIO.h - Little-endian binary encoding with bounds checks ----------===//
//
// Used for the cache entry header, cache keys and serialized compile results:
// fixed-width integers are little-endian, strings are a u64 length followed
// by the bytes, so concatenations are unambiguous.
//
//===----------------------------------------------------------------------===//
#ifndef DFLEX_SUPPORT_BYTEIO_H
#define DFLEX_SUPPORT_BYTEIO_H

#include <cstdint>
#include <string>
#include <string_view>

namespace dflex {

class ByteWriter {
public:
  void u32(uint32_t value);
  void u64(uint64_t value);
  /// Bytes without a length prefix (fixed-size fields such as magics).
  void raw(std::string_view bytes) { bytes_.append(bytes); }
  /// A u64 length, then the bytes.
  void string(std::string_view bytes);

  const std::string &bytes() const { return bytes_; }
  std::string take() { return std::move(bytes_); }

private:
  std::string bytes_;
};

/// Reads what ByteWriter wrote. Every read checks the remaining length; after
/// the first failed read the reader stays failed and error() says where.
class ByteReader {
public:
  explicit ByteReader(std::string_view bytes) : bytes_(bytes) {}

  bool u32(uint32_t &value, const char *what);
  bool u64(uint64_t &value, const char *what);
  bool raw(size_t size, std::string_view &value, const char *what);
  bool string(std::string &value, const char *what);

  bool failed() const { return !error_.empty(); }
  const std::string &error() const { return error_; }
  size_t offset() const { return offset_; }
  size_t remaining() const { return bytes_.size() - offset_; }

private:
  bool take(size_t size, const char *what, std::string_view &out);

  std::string_view bytes_;
  size_t offset_ = 0;
  std::string error_;
};

} // namespace dflex

#endif // DFLEX_SUPPORT_BYTEIO_H
