#include "dflex/Support/Hex.h"
#include "dflex/Support/Sha256.h"

#include <gtest/gtest.h>

using namespace dflex;

namespace {

// Deterministic bytes for messages of any length.
std::string patternBytes(size_t size) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i)
    bytes[i] = char((i * 7 + 3) % 256);
  return bytes;
}

// The examples of the NIST "Secure Hashing" example documents for FIPS 180.
TEST(Sha256, SpecificationVectors) {
  EXPECT_EQ(Sha256::hexDigest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256::hexDigest(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256::hexDigest(
                "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256::hexDigest("abcdefghbcdefghicdefghijdefghijkefghijklfghijklm"
                              "ghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
                              "mnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(Sha256::hexDigest(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Lengths around the padding boundaries: 55 bytes still fit the length in the
// last block, 56 need an extra block. Expected values from an independent
// implementation.
TEST(Sha256, PaddingBoundaries) {
  const std::pair<size_t, const char *> cases[] = {
      {55, "e7313d333c272e639f790978283f9eb392e843d0f29b7016828bb1daa4aac70b"},
      {56, "4324d65f3c103567f5589c710bc08f8523f929a9272e3af36fc968e52abc6c27"},
      {63, "81c80242132f230c3bd41b3e63bbcff16107339549214a99614ff26664625055"},
      {64, "39e3d7b6b5d075d37d053ad89b24b41bef4f3c29760c84447cab3f3be1882241"},
      {65, "aacca6ff74fdbb296d165a45cecfa04e5127bc008770fbbdd48006f2d2fae95e"},
      {119, "9ce7368e4daf32341631b492e80359dc9f594b48453cd0dd5bf0b19279cc177e"},
      {120, "7836b787757e95e58b3ca5aec90b1b004e8deba1e50e9675af9cabf1a13a04b5"},
  };
  for (const auto &[size, expected] : cases)
    EXPECT_EQ(Sha256::hexDigest(patternBytes(size)), expected) << size;
}

TEST(Sha256, IncrementalEqualsOneShot) {
  std::string message = patternBytes(300);
  std::string expected = Sha256::hexDigest(message);
  for (size_t split1 : {0, 1, 63, 64, 65, 130})
    for (size_t split2 : {split1, split1 + 1, split1 + 64, size_t(300)}) {
      if (split2 > message.size())
        continue;
      Sha256 hasher;
      hasher.update(message.substr(0, split1));
      hasher.update(message.substr(split1, split2 - split1));
      hasher.update(message.substr(split2));
      EXPECT_EQ(toHex(hasher.finish()), expected) << split1 << "," << split2;
    }
}

TEST(Sha256, ResetStartsOver) {
  Sha256 hasher;
  hasher.update("garbage");
  hasher.reset();
  hasher.update("abc");
  EXPECT_EQ(toHex(hasher.finish()), Sha256::hexDigest("abc"));
}

// Cache keys finish a copy and keep adding to the original.
TEST(Sha256, CopiesAreIndependent) {
  Sha256 hasher;
  hasher.update("ab");
  Sha256 copy = hasher;
  hasher.update("c");
  EXPECT_EQ(toHex(copy.finish()), Sha256::hexDigest("ab"));
  Sha256 assigned;
  assigned.update("unrelated");
  assigned = hasher;
  hasher.update("d");
  EXPECT_EQ(toHex(assigned.finish()), Sha256::hexDigest("abc"));
  EXPECT_EQ(toHex(hasher.finish()), Sha256::hexDigest("abcd"));
}

TEST(Hex, RoundTripAndErrors) {
  std::string bytes("\x00\x01\x7f\x80\xff", 5);
  EXPECT_EQ(toHex(bytes), "00017f80ff");
  Result<std::string> decoded = fromHex("00017F80ff");
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded.value(), bytes);

  Result<std::string> odd = fromHex("abc");
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.error(), "hex string has odd length 3");
  Result<std::string> bad = fromHex("00zz");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error(), "invalid hex digit 'z' at offset 2");

  EXPECT_TRUE(isLowerHex("09af", 4));
  EXPECT_FALSE(isLowerHex("09AF", 4));
  EXPECT_FALSE(isLowerHex("09a", 4));
}

} // namespace
