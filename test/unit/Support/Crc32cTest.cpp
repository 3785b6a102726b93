#include "dflex/Support/Crc32c.h"

#include <gtest/gtest.h>

#include <string>

using namespace dflex;

namespace {

// Bit at a time, straight from the definition: reflected polynomial
// 0x82F63B78, initial value and final xor 0xFFFFFFFF.
uint32_t referenceCrc32c(const unsigned char *bytes, size_t size,
                         uint32_t crc = 0) {
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) {
    crc ^= bytes[i];
    for (int bit = 0; bit < 8; ++bit)
      crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

std::string patternBytes(size_t size) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i)
    bytes[i] = char((i * 7 + 3) % 251);
  return bytes;
}

const unsigned char *bytesOf(const std::string &text) {
  return reinterpret_cast<const unsigned char *>(text.data());
}

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  // RFC 3720 (iSCSI), appendix B.4.
  unsigned char zeros[32] = {}, ones[32], increasing[32], decreasing[32];
  for (int i = 0; i < 32; ++i) {
    ones[i] = 0xff;
    increasing[i] = static_cast<unsigned char>(i);
    decreasing[i] = static_cast<unsigned char>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros, 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones, 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(increasing, 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(decreasing, 32), 0x113FDB5Cu);
}

TEST(Crc32c, ChainingEqualsOneShot) {
  const std::string message = patternBytes(1000);
  const uint32_t whole = crc32c(message.data(), message.size());
  for (size_t split = 0; split <= message.size(); ++split) {
    uint32_t first = crc32c(message.data(), split);
    EXPECT_EQ(crc32c(message.data() + split, message.size() - split, first),
              whole)
        << split;
  }
  // Nothing more leaves a CRC as it is.
  EXPECT_EQ(crc32c(message.data(), 0, whole), whole);
  EXPECT_EQ(crc32c("56789", 5, crc32c("1234", 4)), 0xE3069283u);
}

// The library switches between code paths by length and alignment; every
// one must agree with the definition.
TEST(Crc32c, MatchesDefinitionAtAllLengthsAndAlignments) {
  const std::string buffer = patternBytes(4096 + 64);
  for (size_t offset = 0; offset < 16; ++offset)
    for (size_t size = 0; size <= 1100; size += (size < 300 ? 1 : 37))
      ASSERT_EQ(crc32c(buffer.data() + offset, size, 0x12345678u),
                referenceCrc32c(bytesOf(buffer) + offset, size, 0x12345678u))
          << offset << "+" << size;
  const std::string large = patternBytes(3 << 20);
  EXPECT_EQ(crc32c(large.data(), large.size()),
            referenceCrc32c(bytesOf(large), large.size()));
}

} // namespace
