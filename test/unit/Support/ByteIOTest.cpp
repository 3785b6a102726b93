#include "dflex/Support/ByteIO.h"

#include <gtest/gtest.h>

using namespace dflex;

namespace {

TEST(ByteIO, RoundTripIsLittleEndianAndLengthPrefixed) {
  ByteWriter writer;
  writer.u32(0x01020304);
  writer.u64(0x0a0b0c0d0e0f1011);
  writer.string("hi");
  writer.raw("XY");
  const std::string &bytes = writer.bytes();
  ASSERT_EQ(bytes.size(), 4u + 8u + 8u + 2u + 2u);
  EXPECT_EQ(bytes.substr(0, 4), std::string("\x04\x03\x02\x01", 4));
  EXPECT_EQ(bytes.substr(12, 8), std::string("\x02\0\0\0\0\0\0\0", 8));

  ByteReader reader(bytes);
  uint32_t small;
  uint64_t large;
  std::string text;
  std::string_view tail;
  ASSERT_TRUE(reader.u32(small, "small"));
  ASSERT_TRUE(reader.u64(large, "large"));
  ASSERT_TRUE(reader.string(text, "text"));
  ASSERT_TRUE(reader.raw(2, tail, "tail"));
  EXPECT_EQ(small, 0x01020304u);
  EXPECT_EQ(large, 0x0a0b0c0d0e0f1011u);
  EXPECT_EQ(text, "hi");
  EXPECT_EQ(tail, "XY");
  EXPECT_EQ(reader.remaining(), 0u);
}

TEST(ByteIO, TruncationIsReportedAndSticky) {
  ByteWriter writer;
  writer.string("abcdef");
  std::string bytes = writer.take().substr(0, 10);
  ByteReader reader(bytes);
  std::string text;
  EXPECT_FALSE(reader.string(text, "name"));
  EXPECT_EQ(reader.error(), "truncated data: name needs 6 bytes at offset 8 "
                            "but only 2 remain");
  uint32_t value;
  EXPECT_FALSE(reader.u32(value, "next"));
  EXPECT_TRUE(reader.failed());
}

// A length prefix larger than the data must fail, not allocate or overrun.
TEST(ByteIO, HugeLengthPrefixFails) {
  ByteWriter writer;
  writer.u64(~uint64_t(0));
  ByteReader reader(writer.bytes());
  std::string text;
  EXPECT_FALSE(reader.string(text, "blob"));
}

} // namespace
