//===- Sha256.cpp - SHA-256 through OpenSSL's EVP interface -----------------===//
#include "dflex/Support/Sha256.h"

#include "dflex/Support/Hex.h"

#include <openssl/err.h>
#include <openssl/evp.h>

#include <cstdio>
#include <cstdlib>

namespace dflex {

namespace {

[[noreturn]] void fail(const char *call) {
  std::fprintf(stderr, "dflex: OpenSSL %s failed for SHA-256\n", call);
  ERR_print_errors_fp(stderr);
  std::abort();
}

// Fetched once: EVP_sha256() makes every EVP_DigestInit_ex look the
// algorithm up again in the provider store, which costs more than hashing a
// short string. Never freed; it lives as long as the process.
const EVP_MD *sha256() {
  static const EVP_MD *md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  if (md == nullptr)
    fail("EVP_MD_fetch");
  return md;
}

EVP_MD_CTX *newContext() {
  EVP_MD_CTX *context = EVP_MD_CTX_new();
  if (context == nullptr)
    fail("EVP_MD_CTX_new");
  return context;
}

} // namespace

Sha256::Sha256() : context_(newContext()) { reset(); }

Sha256::Sha256(const Sha256 &other) : context_(newContext()) {
  if (EVP_MD_CTX_copy_ex(context_, other.context_) != 1)
    fail("EVP_MD_CTX_copy_ex");
}

Sha256 &Sha256::operator=(const Sha256 &other) {
  if (this != &other && EVP_MD_CTX_copy_ex(context_, other.context_) != 1)
    fail("EVP_MD_CTX_copy_ex");
  return *this;
}

Sha256::~Sha256() { EVP_MD_CTX_free(context_); }

void Sha256::reset() {
  if (EVP_DigestInit_ex(context_, sha256(), nullptr) != 1)
    fail("EVP_DigestInit_ex");
}

void Sha256::update(const void *data, size_t size) {
  if (EVP_DigestUpdate(context_, data, size) != 1)
    fail("EVP_DigestUpdate");
}

Sha256::Digest Sha256::finish() {
  Digest digest;
  if (EVP_DigestFinal_ex(context_, digest.data(), nullptr) != 1)
    fail("EVP_DigestFinal_ex");
  return digest;
}

Sha256::Digest Sha256::digest(std::string_view bytes) {
  Digest digest;
  if (EVP_Digest(bytes.data(), bytes.size(), digest.data(), nullptr, sha256(),
                 nullptr) != 1)
    fail("EVP_Digest");
  return digest;
}

std::string Sha256::hexDigest(std::string_view bytes) {
  return toHex(digest(bytes));
}

std::string toHex(const Sha256::Digest &digest) {
  return toHex(std::string_view(reinterpret_cast<const char *>(digest.data()),
                                digest.size()));
}

} // namespace dflex
