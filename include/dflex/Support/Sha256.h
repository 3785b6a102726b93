//===- Sha256.h - SHA-256 (FIPS 180-4), computed by OpenSSL -----------------===//
#ifndef DFLEX_SUPPORT_SHA256_H
#define DFLEX_SUPPORT_SHA256_H

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

// OpenSSL's EVP_MD_CTX, declared here so that callers need no OpenSSL headers.
struct evp_md_ctx_st;

namespace dflex {

/// Incremental SHA-256 (FIPS 180-4) over OpenSSL's libcrypto. Copying a
/// hasher copies its state, so a copy can finish while the original goes on.
/// OpenSSL failing to hash (it fails only when out of memory or when its
/// providers cannot be loaded) ends the process with a message on stderr.
class Sha256 {
public:
  using Digest = std::array<uint8_t, 32>;

  Sha256();
  Sha256(const Sha256 &other);
  Sha256 &operator=(const Sha256 &other);
  ~Sha256();

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
  evp_md_ctx_st *context_;
};

/// The digest as 64 lowercase hex digits.
std::string toHex(const Sha256::Digest &digest);

} // namespace dflex

#endif // DFLEX_SUPPORT_SHA256_H
