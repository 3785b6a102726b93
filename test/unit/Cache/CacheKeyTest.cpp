#include "dflex/Cache/CacheKey.h"

#include <gtest/gtest.h>

using namespace dflex::cache;

namespace {

TEST(CacheKey, IsDeterministicHex) {
  std::string key = KeyBuilder("test/1").add("source", "x").key();
  EXPECT_TRUE(isValidKey(key)) << key;
  EXPECT_EQ(key, KeyBuilder("test/1").add("source", "x").key());
}

TEST(CacheKey, EveryInputChangesTheKey) {
  std::string base = KeyBuilder("p").add("a", "1").add("b", "2").key();
  EXPECT_NE(base, KeyBuilder("q").add("a", "1").add("b", "2").key());
  EXPECT_NE(base, KeyBuilder("p").add("a", "1").add("b", "3").key());
  EXPECT_NE(base, KeyBuilder("p").add("a", "1").add("c", "2").key());
  EXPECT_NE(base, KeyBuilder("p").add("b", "2").add("a", "1").key());
  EXPECT_NE(base, KeyBuilder("p").add("a", "1").key());
}

// Length prefixes keep field boundaries: moving bytes across a boundary, or
// between a name and its value, changes the key.
TEST(CacheKey, BoundariesAreUnambiguous) {
  EXPECT_NE(KeyBuilder("p").add("f", "ab").add("g", "c").key(),
            KeyBuilder("p").add("f", "a").add("g", "bc").key());
  EXPECT_NE(KeyBuilder("p").add("fa", "b").key(),
            KeyBuilder("p").add("f", "ab").key());
  EXPECT_NE(KeyBuilder("p").add("f", "").add("", "").key(),
            KeyBuilder("p").add("f", "").key());
  EXPECT_NE(KeyBuilder("p").add("opt", "a b").key(),
            KeyBuilder("p").add("opt", "a").add("opt", "b").key());
}

TEST(CacheKey, IntegersHashAsDecimal) {
  EXPECT_EQ(KeyBuilder("p").add("n", int64_t(-42)).key(),
            KeyBuilder("p").add("n", "-42").key());
}

TEST(CacheKey, KeyCanBeTakenMidway) {
  KeyBuilder builder("p");
  builder.add("a", "1");
  std::string first = builder.key();
  EXPECT_EQ(first, builder.key());
  builder.add("b", "2");
  EXPECT_EQ(builder.key(), KeyBuilder("p").add("a", "1").add("b", "2").key());
}

TEST(CacheKey, Validation) {
  EXPECT_TRUE(isValidKey(std::string(64, 'a')));
  EXPECT_FALSE(isValidKey(std::string(63, 'a')));
  EXPECT_FALSE(isValidKey(std::string(64, 'A')));
  EXPECT_FALSE(isValidKey("../" + std::string(61, 'a')));
}

} // namespace
