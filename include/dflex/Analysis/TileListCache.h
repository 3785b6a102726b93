//===- TileListCache.h - tile lists kept for repeated mask inputs -*- C++ -*-===//
//
// A call's tile list depends only on the mask, its captures' values, the
// problem's shape, the pass and the tile sizes. Every attention layer of a
// model step calls the same mask on the same captures (document ids, DFlash
// anchors, a window), so the runtime keeps the last few lists per mask and
// answers a repeated call from them instead of rebinding an evaluator and
// scanning the tiles again. The key holds a copy of the captures' contents
// (in logical row-major order, whatever the strides), compared byte for byte:
// a capture changed in place, or equal values in another tensor, are told
// apart exactly, never by a hash.
//
//===----------------------------------------------------------------------===//

#ifndef DFLEX_ANALYSIS_TILELISTCACHE_H
#define DFLEX_ANALYSIS_TILELISTCACHE_H

#include "dflex/Analysis/TileList.h"

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace dflex::analysis {

/// What a tile list depends on besides its mask.
struct TileListKey {
  std::vector<uint8_t> captures; // kinds, sizes and contents, in order
  AttentionShape shape;
  TileListKind kind = TileListKind::Forward;
  int64_t queryTile = 0, keyTile = 0;

  /// The key of one pass of a call, or nothing where the captures hold more
  /// than kMaxCaptureBytes (copying and comparing them would cost more than
  /// the list is worth).
  static std::optional<TileListKey> of(const std::vector<expr::CaptureValue> &captures,
                                       const AttentionShape &shape, TileListKind kind,
                                       int64_t queryTile, int64_t keyTile);
  static constexpr size_t kMaxCaptureBytes = size_t{4} << 20;

  bool operator==(const TileListKey &other) const;
};

/// The most recently used lists of one mask, at most `capacity`; safe to
/// share between threads.
class TileListCache {
public:
  explicit TileListCache(size_t capacity = 8);

  /// The list kept for `key`, or null.
  std::shared_ptr<const TileList> find(const TileListKey &key);
  /// Keeps `list` for `key`, dropping the least recently used beyond capacity.
  void insert(TileListKey key, std::shared_ptr<const TileList> list);
  /// Calls answered by find() so far.
  int64_t hits() const;

private:
  struct Entry {
    TileListKey key;
    std::shared_ptr<const TileList> list;
  };
  const size_t capacity_;
  mutable std::mutex mutex_;
  std::list<Entry> entries_; // most recently used first
  int64_t hits_ = 0;
};

} // namespace dflex::analysis

#endif // DFLEX_ANALYSIS_TILELISTCACHE_H
