//===- CacheKey.h - Unambiguous SHA-256 keys over named fields -------------===//
#ifndef DFLEX_CACHE_CACHEKEY_H
#define DFLEX_CACHE_CACHEKEY_H

#include "dflex/Support/Sha256.h"

#include <cstdint>
#include <string>
#include <string_view>

namespace dflex::cache {

/// Builds a cache key: the SHA-256 of a purpose string and a sequence of
/// (field name, value) pairs, every string preceded by its length as a u64,
/// so that no two different sequences hash the same bytes ("ab"+"c" differs
/// from "a"+"bc"). Order matters: add fields in a fixed order; repeat a field
/// name to hash a list.
class KeyBuilder {
public:
  /// `purpose` separates kinds of entries, e.g. "nvrtc-arch-binary/1".
  explicit KeyBuilder(std::string_view purpose);

  KeyBuilder &add(std::string_view field, std::string_view value);
  KeyBuilder &add(std::string_view field, int64_t value);

  /// The key: 64 lowercase hex digits. The builder can keep adding after.
  std::string key() const;

private:
  void addString(std::string_view bytes);

  Sha256 hasher_;
};

/// True if `key` is a well-formed key (64 lowercase hex digits).
bool isValidKey(std::string_view key);

} // namespace dflex::cache

#endif // DFLEX_CACHE_CACHEKEY_H
