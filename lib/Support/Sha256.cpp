//===- Sha256.cpp - SHA-256 following FIPS 180-4 ----------------------------===//
#include "dflex/Support/Sha256.h"

#include "dflex/Support/Hex.h"

#include <cassert>
#include <cstring>

namespace dflex {

namespace {

// Section 4.2.2: the first 32 bits of the fractional parts of the cube roots
// of the first 64 primes.
constexpr uint32_t kRoundConstants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
    0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
    0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

// Section 5.3.3: the first 32 bits of the fractional parts of the square
// roots of the first 8 primes.
constexpr uint32_t kInitialState[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372,
                                       0xa54ff53a, 0x510e527f, 0x9b05688c,
                                       0x1f83d9ab, 0x5be0cd19};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
// Section 4.1.2.
inline uint32_t ch(uint32_t x, uint32_t y, uint32_t z) {
  return (x & y) ^ (~x & z);
}
inline uint32_t maj(uint32_t x, uint32_t y, uint32_t z) {
  return (x & y) ^ (x & z) ^ (y & z);
}
inline uint32_t bigSigma0(uint32_t x) {
  return rotr(x, 2) ^ rotr(x, 13) ^ rotr(x, 22);
}
inline uint32_t bigSigma1(uint32_t x) {
  return rotr(x, 6) ^ rotr(x, 11) ^ rotr(x, 25);
}
inline uint32_t smallSigma0(uint32_t x) {
  return rotr(x, 7) ^ rotr(x, 18) ^ (x >> 3);
}
inline uint32_t smallSigma1(uint32_t x) {
  return rotr(x, 17) ^ rotr(x, 19) ^ (x >> 10);
}

} // namespace

Sha256::Sha256() { reset(); }

void Sha256::reset() {
  std::memcpy(state_.data(), kInitialState, sizeof(kInitialState));
  buffered_ = 0;
  messageBytes_ = 0;
}

// Section 6.2.2: one block of the hash computation.
void Sha256::compressBlock(const uint8_t *block) {
  uint32_t schedule[64];
  for (int t = 0; t < 16; ++t)
    schedule[t] = uint32_t(block[4 * t]) << 24 |
                  uint32_t(block[4 * t + 1]) << 16 |
                  uint32_t(block[4 * t + 2]) << 8 | uint32_t(block[4 * t + 3]);
  for (int t = 16; t < 64; ++t)
    schedule[t] = smallSigma1(schedule[t - 2]) + schedule[t - 7] +
                  smallSigma0(schedule[t - 15]) + schedule[t - 16];

  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int t = 0; t < 64; ++t) {
    uint32_t t1 = h + bigSigma1(e) + ch(e, f, g) + kRoundConstants[t] +
                  schedule[t];
    uint32_t t2 = bigSigma0(a) + maj(a, b, c);
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

void Sha256::update(const void *data, size_t size) {
  const auto *bytes = static_cast<const uint8_t *>(data);
  messageBytes_ += size;
  if (buffered_ > 0) {
    size_t take = std::min(size, buffer_.size() - buffered_);
    std::memcpy(buffer_.data() + buffered_, bytes, take);
    buffered_ += take;
    bytes += take;
    size -= take;
    if (buffered_ < buffer_.size())
      return;
    compressBlock(buffer_.data());
    buffered_ = 0;
  }
  for (; size >= 64; bytes += 64, size -= 64)
    compressBlock(bytes);
  std::memcpy(buffer_.data(), bytes, size);
  buffered_ = size;
}

// Section 5.1.1: append a 1 bit, zeros up to 56 mod 64 bytes, then the
// message length in bits as a 64-bit big-endian integer.
Sha256::Digest Sha256::finish() {
  uint64_t messageBits = messageBytes_ * 8;
  uint8_t padding[72] = {0x80};
  size_t padBytes = (buffered_ < 56 ? 56 : 120) - buffered_;
  for (int i = 0; i < 8; ++i)
    padding[padBytes + i] = uint8_t(messageBits >> (56 - 8 * i));
  update(padding, padBytes + 8);
  assert(buffered_ == 0);

  Digest digest;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j)
      digest[4 * i + j] = uint8_t(state_[i] >> (24 - 8 * j));
  return digest;
}

Sha256::Digest Sha256::digest(std::string_view bytes) {
  Sha256 hasher;
  hasher.update(bytes);
  return hasher.finish();
}

std::string Sha256::hexDigest(std::string_view bytes) {
  return toHex(digest(bytes));
}

std::string toHex(const Sha256::Digest &digest) {
  return toHex(std::string_view(reinterpret_cast<const char *>(digest.data()),
                                digest.size()));
}

} // namespace dflex
