//===- TileList.h - block-sparse tile lists of a mask -----------*- C++ -*-===//
//
// Classifies the (query tile, key tile) pairs of an attention call as empty,
// partial or full from the interval evaluation of its mask, and writes the
// CSR tile lists the attention kernels consume (kernels/attention/
// tile_list.cuh): a FULL tile is visible at every pair inside the lengths,
// an EMPTY tile (left out of the list) at none; anything the analysis cannot
// prove is PARTIAL, which is always correct.
//
// A row of tiles is scanned by classifying whole ranges of column tiles at
// once and splitting only ranges that come out mixed; each row starts from
// the runs of the row before (neighbouring rows of a mask look alike). The
// values that do not depend on the column argument are evaluated once per
// row.
// A tile is split where one of the mask's comparisons flips (a breakpoint)
// and its pieces classified apart, in the columns as in the rows: `kv < n`
// and `kv - n` over a range across n are otherwise judged independently.
//
//===----------------------------------------------------------------------===//

#ifndef DFLEX_ANALYSIS_TILELIST_H
#define DFLEX_ANALYSIS_TILELIST_H

#include "dflex/Analysis/IntervalEvaluator.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dflex::analysis {

enum class TileClass : uint8_t { Empty, Partial, Full };
const char *toString(TileClass tile);

/// The class of the tile of queries `q` and keys `kv` (both non-empty
/// ranges) for batch `b` and query head `h`.
TileClass classifyTile(IntervalEvaluator &mask, int64_t b, int64_t h, IntRange q,
                       IntRange kv);

/// The shape of one attention call.
struct AttentionShape {
  int64_t batches = 1;
  int64_t heads = 1; // query heads
  int64_t queryLength = 0;
  int64_t keyLength = 0;
};

/// Forward lists have a row per query tile (columns: key tiles); backward
/// lists a row per key tile (columns: query tiles).
enum class TileListKind { Forward, Backward };

/// The host form of kernels/attention/tile_list.cuh's TileList, with what
/// it was built for.
struct TileList {
  std::vector<int32_t> rowOffsets; // [rows + 1]
  std::vector<int32_t> entries;    // (column tile << 1) | partial, ascending per row
  int32_t batches = 1;             // 1 when the mask does not read b
  int32_t heads = 1;               // 1 when the mask does not read h
  int32_t rowTiles = 0;
  int32_t columnTiles = 0;
  TileListKind kind = TileListKind::Forward;
  int64_t queryTile = 0, keyTile = 0;     // tile sizes
  int64_t queryLength = 0, keyLength = 0; // the lengths it covers
  int64_t evaluations = 0;                // interval evaluations it took
};

struct TileListResult {
  TileList list;
  std::string error; // empty on success
  bool ok() const { return error.empty(); }
};

/// The tile list of one pass with tiles of `queryTile` queries by `keyTile`
/// keys. Fails, with a message, on non-positive tiles or batch/head counts,
/// negative lengths, or a list too large for 32-bit offsets.
TileListResult buildTileList(IntervalEvaluator &mask, TileListKind kind,
                             const AttentionShape &shape, int64_t queryTile,
                             int64_t keyTile);

/// Both lists of one attention call, as the runtime holds them; each pass's
/// list is built by its own buildTileList, with the pass's tiles.
struct AttentionTileLists {
  TileList forward, backward;
  std::string error; // empty on success
  bool ok() const { return error.empty(); }
};

} // namespace dflex::analysis

#endif // DFLEX_ANALYSIS_TILELIST_H
