//===- TileListCacheTest.cpp - keys and reuse of kept tile lists ----------===//

#include "dflex/Analysis/TileListCache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

using namespace dflex;
using analysis::AttentionShape;
using analysis::TileList;
using analysis::TileListCache;
using analysis::TileListKey;
using analysis::TileListKind;
using expr::CaptureValue;
using expr::ScalarType;

namespace {

AttentionShape shape(int64_t queryLength, int64_t keyLength) {
  AttentionShape s;
  s.batches = 2;
  s.heads = 4;
  s.queryLength = queryLength;
  s.keyLength = keyLength;
  return s;
}

TileListKey keyOf(const std::vector<CaptureValue> &captures, const AttentionShape &s = shape(300, 500),
                  TileListKind kind = TileListKind::Forward, int64_t queryTile = 128, int64_t keyTile = 64) {
  std::optional<TileListKey> key = TileListKey::of(captures, s, kind, queryTile, keyTile);
  EXPECT_TRUE(key.has_value());
  return key ? *key : TileListKey{};
}

/// A list told apart from others by its row offsets.
std::shared_ptr<const TileList> listNumbered(int32_t n) {
  auto list = std::make_shared<TileList>();
  list->rowOffsets = {0, n};
  return list;
}

} // namespace

TEST(TileListKeys, EqualValuesMakeEqualKeysWhateverTheStorage) {
  // ids[2][3] row-major, and the same values read through a transposed view
  // of another buffer (strides 1, 2).
  std::vector<int32_t> rowMajor{1, 2, 3, 4, 5, 6};
  std::vector<int32_t> columnMajor{1, 4, 2, 5, 3, 6};
  CaptureValue strided = CaptureValue::ofTensor(columnMajor.data(), ScalarType::I32, {2, 3});
  strided.strides = {1, 2};
  const CaptureValue window = CaptureValue::ofScalar(expr::Value::ofInt(40));
  EXPECT_EQ(keyOf({CaptureValue::ofTensor(rowMajor.data(), ScalarType::I32, {2, 3}), window}),
            keyOf({strided, window}));
  std::vector<int32_t> copy = rowMajor;
  EXPECT_EQ(keyOf({CaptureValue::ofTensor(rowMajor.data(), ScalarType::I32, {2, 3})}),
            keyOf({CaptureValue::ofTensor(copy.data(), ScalarType::I32, {2, 3})}));
}

TEST(TileListKeys, AnyDifferenceMakesAnotherKey) {
  std::vector<int32_t> ids{1, 2, 3, 4, 5, 6};
  auto idsOf = [](std::vector<int32_t> &data, std::vector<int64_t> sizes) {
    return CaptureValue::ofTensor(data.data(), ScalarType::I32, std::move(sizes));
  };
  const TileListKey base = keyOf({idsOf(ids, {2, 3})});
  std::vector<int32_t> changed = ids;
  changed[4] = 7;
  EXPECT_FALSE(base == keyOf({idsOf(changed, {2, 3})})) << "one element";
  EXPECT_FALSE(base == keyOf({idsOf(ids, {3, 2})})) << "the same bytes in another shape";
  std::vector<int32_t> asI64Bytes = ids;
  EXPECT_FALSE(base == keyOf({CaptureValue::ofTensor(asI64Bytes.data(), ScalarType::I64, {3})}))
      << "the same bytes as another element type";
  EXPECT_FALSE(base == keyOf({idsOf(ids, {2, 3})}, shape(301, 500))) << "query length";
  EXPECT_FALSE(base == keyOf({idsOf(ids, {2, 3})}, shape(300, 501))) << "key length";
  AttentionShape moreHeads = shape(300, 500);
  moreHeads.heads = 8;
  EXPECT_FALSE(base == keyOf({idsOf(ids, {2, 3})}, moreHeads)) << "heads";
  EXPECT_FALSE(base == keyOf({idsOf(ids, {2, 3})}, shape(300, 500), TileListKind::Backward)) << "pass";
  EXPECT_FALSE(base == keyOf({idsOf(ids, {2, 3})}, shape(300, 500), TileListKind::Forward, 64, 64))
      << "tiles";
  // Scalars by their bits: 0.0 and -0.0, an int and the float of the same value.
  auto scalar = [](expr::Value v) { return keyOf({CaptureValue::ofScalar(v)}); };
  EXPECT_FALSE(scalar(expr::Value::ofFloat(0.0f)) == scalar(expr::Value::ofFloat(-0.0f)));
  EXPECT_FALSE(scalar(expr::Value::ofInt(3)) == scalar(expr::Value::ofInt(4)));
  EXPECT_TRUE(scalar(expr::Value::ofInt(3)) == scalar(expr::Value::ofInt(3)));
}

TEST(TileListKeys, CapturesBeyondTheLimitAreNotKept) {
  const int64_t elements = static_cast<int64_t>(TileListKey::kMaxCaptureBytes / 4) + 1;
  std::vector<int32_t> large(static_cast<size_t>(elements), 1);
  EXPECT_FALSE(TileListKey::of({CaptureValue::ofTensor(large.data(), ScalarType::I32, {elements})},
                               shape(300, 500), TileListKind::Forward, 128, 64)
                   .has_value());
  EXPECT_TRUE(TileListKey::of({CaptureValue::ofTensor(large.data(), ScalarType::I32, {elements - 1})},
                              shape(300, 500), TileListKind::Forward, 128, 64)
                  .has_value());
}

TEST(TileListCache, KeepsTheMostRecentlyUsedLists) {
  TileListCache cache(2);
  auto keyNumbered = [](int64_t n) { return keyOf({CaptureValue::ofScalar(expr::Value::ofInt(n))}); };
  EXPECT_EQ(cache.find(keyNumbered(1)), nullptr);
  cache.insert(keyNumbered(1), listNumbered(1));
  cache.insert(keyNumbered(2), listNumbered(2));
  ASSERT_NE(cache.find(keyNumbered(1)), nullptr); // 1 is now the most recent
  EXPECT_EQ(cache.find(keyNumbered(1))->rowOffsets[1], 1);
  cache.insert(keyNumbered(3), listNumbered(3)); // drops 2
  EXPECT_EQ(cache.find(keyNumbered(2)), nullptr);
  ASSERT_NE(cache.find(keyNumbered(3)), nullptr);
  EXPECT_EQ(cache.find(keyNumbered(3))->rowOffsets[1], 3);
  EXPECT_EQ(cache.find(keyNumbered(1))->rowOffsets[1], 1);
  EXPECT_EQ(cache.hits(), 5);
  // A second insert of a kept key keeps the first list.
  cache.insert(keyNumbered(3), listNumbered(30));
  EXPECT_EQ(cache.find(keyNumbered(3))->rowOffsets[1], 3);
}
