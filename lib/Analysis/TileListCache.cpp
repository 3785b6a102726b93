//===- TileListCache.cpp - tile lists kept for repeated mask inputs -------===//

#include "dflex/Analysis/TileListCache.h"

#include <cstring>

namespace dflex::analysis {

namespace {

size_t elementBytes(expr::ScalarType type) {
  switch (type) {
  case expr::ScalarType::I64:
  case expr::ScalarType::Index:
    return 8;
  case expr::ScalarType::I32:
  case expr::ScalarType::F32:
    return 4;
  case expr::ScalarType::I16:
  case expr::ScalarType::F16:
  case expr::ScalarType::BF16:
    return 2;
  default:
    return 1;
  }
}

template <class T> void append(std::vector<uint8_t> &bytes, const T &value) {
  const size_t at = bytes.size();
  bytes.resize(at + sizeof(T));
  std::memcpy(bytes.data() + at, &value, sizeof(T));
}

/// The tensor's elements in logical row-major order.
void appendContents(std::vector<uint8_t> &bytes, const expr::CaptureValue &tensor, int64_t count) {
  const size_t width = elementBytes(tensor.elementType);
  const char *base = static_cast<const char *>(tensor.data);
  const size_t at = bytes.size();
  bytes.resize(at + static_cast<size_t>(count) * width);
  uint8_t *out = bytes.data() + at;
  if (tensor.isRowMajor()) {
    std::memcpy(out, base, static_cast<size_t>(count) * width);
    return;
  }
  tensor.forEachOffset([&](int64_t offset) {
    std::memcpy(out, base + offset * static_cast<int64_t>(width), width);
    out += width;
  });
}

} // namespace

std::optional<TileListKey> TileListKey::of(const std::vector<expr::CaptureValue> &captures,
                                           const AttentionShape &shape, TileListKind kind,
                                           int64_t queryTile, int64_t keyTile) {
  size_t contents = 0;
  std::vector<int64_t> counts(captures.size(), 0);
  for (size_t i = 0; i < captures.size(); ++i) {
    if (!captures[i].data)
      continue;
    int64_t count = 1;
    for (int64_t size : captures[i].sizes)
      count *= size;
    counts[i] = count;
    contents += static_cast<size_t>(count) * elementBytes(captures[i].elementType);
  }
  if (contents > kMaxCaptureBytes)
    return std::nullopt;
  TileListKey key;
  key.captures.reserve(contents + 32 * captures.size());
  for (size_t i = 0; i < captures.size(); ++i) {
    const expr::CaptureValue &capture = captures[i];
    if (!capture.data) {
      append(key.captures, uint8_t{0});
      append(key.captures, capture.scalar.i);
      append(key.captures, capture.scalar.f); // bits: -0.0 and NaNs stay apart
      continue;
    }
    append(key.captures, uint8_t{1});
    append(key.captures, static_cast<uint8_t>(capture.elementType));
    append(key.captures, static_cast<uint64_t>(capture.sizes.size()));
    for (int64_t size : capture.sizes)
      append(key.captures, size);
    appendContents(key.captures, capture, counts[i]);
  }
  key.shape = shape;
  key.kind = kind;
  key.queryTile = queryTile;
  key.keyTile = keyTile;
  return key;
}

bool TileListKey::operator==(const TileListKey &other) const {
  return kind == other.kind && queryTile == other.queryTile && keyTile == other.keyTile &&
         shape.batches == other.shape.batches && shape.heads == other.shape.heads &&
         shape.queryLength == other.shape.queryLength && shape.keyLength == other.shape.keyLength &&
         captures == other.captures;
}

TileListCache::TileListCache(size_t capacity) : capacity_(capacity) {}

std::shared_ptr<const TileList> TileListCache::find(const TileListKey &key) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto entry = entries_.begin(); entry != entries_.end(); ++entry)
    if (entry->key == key) {
      entries_.splice(entries_.begin(), entries_, entry);
      ++hits_;
      return entries_.front().list;
    }
  return nullptr;
}

void TileListCache::insert(TileListKey key, std::shared_ptr<const TileList> list) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto entry = entries_.begin(); entry != entries_.end(); ++entry)
    if (entry->key == key) { // another thread built the same list meanwhile
      entries_.splice(entries_.begin(), entries_, entry);
      return;
    }
  entries_.push_front(Entry{std::move(key), std::move(list)});
  while (entries_.size() > capacity_)
    entries_.pop_back();
}

int64_t TileListCache::hits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return hits_;
}

} // namespace dflex::analysis
