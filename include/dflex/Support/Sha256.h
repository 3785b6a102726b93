//===- Sha256.h - SHA-256 (FIPS 180-4) --------------------------------------===//
#ifndef DFLEX_SUPPORT_SHA256_H
#define DFLEX_SUPPORT_SHA256_H

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dflex {

/// Incremental SHA-256 as specified in FIPS 180-4, section 6.2.
class Sha256 {
public:
  using Digest = std::array<uint8_t, 32>;

  Sha256();
  void update(const void *data, size_t size);
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }
  /// Pads the message and returns the digest; the object must not be used
  /// afterwards except through reset().
  Digest finish();
  void reset();

  /// One-shot digest of `bytes`.
  static Digest digest(std::string_view bytes);
  /// One-shot digest of `bytes` as 64 lowercase hex digits.
  static std::string hexDigest(std::string_view bytes);

private:
  void compressBlock(const uint8_t *block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_;
  size_t buffered_ = 0;
  uint64_t messageBytes_ = 0;
};

/// The digest as 64 lowercase hex digits.
std::string toHex(const Sha256::Digest &digest);

} // namespace dflex

#endif // DFLEX_SUPPORT_SHA256_H
