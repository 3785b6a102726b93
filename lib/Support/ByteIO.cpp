//===- ByteIO.cpp ------------------------------------------------------------===//
#include "dflex/Support/ByteIO.h"

namespace dflex {

namespace {
template <typename T> void appendLittleEndian(std::string &out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i)
    out.push_back(static_cast<char>(value >> (8 * i)));
}

template <typename T> T loadLittleEndian(std::string_view bytes) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i)
    value |= T(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return value;
}
} // namespace

void ByteWriter::u32(uint32_t value) { appendLittleEndian(bytes_, value); }
void ByteWriter::u64(uint64_t value) { appendLittleEndian(bytes_, value); }

void ByteWriter::string(std::string_view bytes) {
  u64(bytes.size());
  raw(bytes);
}

bool ByteReader::take(size_t size, const char *what, std::string_view &out) {
  if (failed())
    return false;
  if (size > remaining()) {
    error_ = std::string("truncated data: ") + what + " needs " +
             std::to_string(size) + " bytes at offset " +
             std::to_string(offset_) + " but only " +
             std::to_string(remaining()) + " remain";
    return false;
  }
  out = bytes_.substr(offset_, size);
  offset_ += size;
  return true;
}

bool ByteReader::u32(uint32_t &value, const char *what) {
  std::string_view bytes;
  if (!take(4, what, bytes))
    return false;
  value = loadLittleEndian<uint32_t>(bytes);
  return true;
}

bool ByteReader::u64(uint64_t &value, const char *what) {
  std::string_view bytes;
  if (!take(8, what, bytes))
    return false;
  value = loadLittleEndian<uint64_t>(bytes);
  return true;
}

bool ByteReader::raw(size_t size, std::string_view &value, const char *what) {
  return take(size, what, value);
}

bool ByteReader::string(std::string &value, const char *what) {
  uint64_t size = 0;
  std::string_view bytes;
  if (!u64(size, what) || !take(size, what, bytes))
    return false;
  value.assign(bytes);
  return true;
}

} // namespace dflex
