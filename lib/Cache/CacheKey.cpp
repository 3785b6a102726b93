//===- CacheKey.cpp ----------------------------------------------------------===//
#include "dflex/Cache/CacheKey.h"

#include "dflex/Support/ByteIO.h"
#include "dflex/Support/Hex.h"

namespace dflex::cache {

namespace {
// Fixed prefix so that keys cannot collide with hashes of other data.
constexpr std::string_view kKeyDomain = "dflex cache key";
} // namespace

KeyBuilder::KeyBuilder(std::string_view purpose) {
  addString(kKeyDomain);
  addString(purpose);
}

void KeyBuilder::addString(std::string_view bytes) {
  ByteWriter length;
  length.u64(bytes.size());
  hasher_.update(length.bytes());
  hasher_.update(bytes);
}

KeyBuilder &KeyBuilder::add(std::string_view field, std::string_view value) {
  addString(field);
  addString(value);
  return *this;
}

KeyBuilder &KeyBuilder::add(std::string_view field, int64_t value) {
  return add(field, std::to_string(value));
}

std::string KeyBuilder::key() const {
  Sha256 copy = hasher_;
  return toHex(copy.finish());
}

bool isValidKey(std::string_view key) { return isLowerHex(key, 64); }

} // namespace dflex::cache
