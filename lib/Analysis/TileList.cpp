//===- TileList.cpp - block-sparse tile lists of a mask -------------------===//

#include "dflex/Analysis/TileList.h"

#include <algorithm>
#include <limits>

namespace dflex::analysis {

const char *toString(TileClass tile) {
  switch (tile) {
  case TileClass::Empty: return "empty";
  case TileClass::Partial: return "partial";
  case TileClass::Full: return "full";
  }
  return "?";
}

namespace {

TileClass classOf(Truth truth) {
  return truth == Truth::True    ? TileClass::Full
         : truth == Truth::False ? TileClass::Empty
                                 : TileClass::Partial;
}

/// A run of column tiles [begin, end) of one class.
struct Run {
  int64_t begin, end;
  TileClass tile;
};

/// Scans the rows of one list: rows along one mask argument, columns along
/// the other.
class RowScanner {
public:
  RowScanner(IntervalEvaluator &mask, MaskArgument column, int64_t columnLength,
             int64_t columnTile)
      : mask(mask), column(column), columnLength(columnLength), columnTile(columnTile),
        columnTiles((columnLength + columnTile - 1) / columnTile) {}

  /// Forgets the rows scanned so far (the next row is not their neighbour).
  void restart() {
    last.clear();
    beforeLast.clear();
  }

  /// Classifies every column tile of one row (described by `box`, whose
  /// column range is ignored) into runs, starting from the runs the rows
  /// before predict.
  const std::vector<Run> &scan(const Box &box) {
    predictSeeds();
    std::swap(beforeLast, last);
    last.clear();
    out = &last;
    if (columnTiles == 0)
      return last;
    mask.fix(box, column);
    findCuts();
    if (seeds.empty())
      refineBetweenCuts(0, columnTiles);
    for (const Run &seed : seeds) {
      if (seed.tile != TileClass::Partial) {
        refineBetweenCuts(seed.begin, seed.end);
        continue;
      }
      // Tiles partial in the row before are most likely partial again:
      // classify them one by one straight away.
      for (int64_t tile = seed.begin; tile < seed.end; ++tile)
        emit(tile, tile + 1, classify(tile, tile + 1));
    }
    return last;
  }

  int64_t evaluations = 0;

private:
  /// The runs of the last row, each boundary moved as it moved from the
  /// row before (masks shift along diagonals), when both rows have the same
  /// sequence of classes and the moved boundaries stay in order.
  void predictSeeds() {
    seeds = last;
    if (last.empty() || beforeLast.size() != last.size())
      return;
    for (size_t k = 0; k < last.size(); ++k)
      if (beforeLast[k].tile != last[k].tile)
        return;
    for (size_t k = 1; k < last.size(); ++k) {
      int64_t moved = 2 * last[k].begin - beforeLast[k].begin;
      if (moved <= seeds[k - 1].begin || moved >= columnTiles)
        return void(seeds = last);
      seeds[k].begin = seeds[k - 1].end = moved;
    }
    if (seeds.back().begin >= seeds.back().end)
      seeds = last;
  }

  TileClass classifyElements(int64_t first, int64_t last) {
    ++evaluations;
    return classOf(mask.evaluateVarying(IntRange{first, last}));
  }

  TileClass classify(int64_t begin, int64_t end) {
    const int64_t first = begin * columnTile, last = std::min(end * columnTile, columnLength) - 1;
    TileClass whole = classifyElements(first, last);
    if (whole != TileClass::Partial || end - begin > 1)
      return whole;
    // One tile: if the mask's comparisons flip inside it, the pieces
    // between the flips may each be uniform (and all alike).
    auto inside = std::upper_bound(breakpoints->begin(), breakpoints->end(), first);
    if (inside == breakpoints->end() || *inside > last)
      return whole;
    TileClass pieces = TileClass::Partial;
    for (int64_t start = first; start <= last;) {
      int64_t stop = inside != breakpoints->end() && *inside <= last ? *inside - 1 : last;
      TileClass piece = classifyElements(start, stop);
      if (piece == TileClass::Partial || (start != first && piece != pieces))
        return TileClass::Partial;
      pieces = piece;
      start = stop + 1;
      if (inside != breakpoints->end())
        ++inside;
    }
    return pieces;
  }

  /// Tile boundaries at the mask's breakpoints: a breakpoint inside a tile
  /// cuts on both sides of it, so that ranges never straddle one.
  void findCuts() {
    breakpoints = &mask.breakpoints();
    cuts.clear();
    for (int64_t point : *breakpoints) {
      if (point <= 0 || point >= columnLength)
        continue;
      int64_t tile = point / columnTile;
      cuts.push_back(tile);
      if (point % columnTile != 0)
        cuts.push_back(tile + 1);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  }

  void refineBetweenCuts(int64_t begin, int64_t end) {
    auto cut = std::upper_bound(cuts.begin(), cuts.end(), begin);
    for (; cut != cuts.end() && *cut < end; ++cut) {
      refine(begin, *cut);
      begin = *cut;
    }
    refine(begin, end);
  }

  void emit(int64_t begin, int64_t end, TileClass tile) {
    if (!out->empty() && out->back().tile == tile && out->back().end == begin)
      out->back().end = end;
    else
      out->push_back({begin, end, tile});
  }

  /// Classifies [begin, end): whole if uniform, else run by run, finding the
  /// end of each run by galloping then bisection.
  void refine(int64_t begin, int64_t end) {
    while (begin < end) {
      TileClass whole = classify(begin, end);
      if (whole != TileClass::Partial || end - begin == 1) {
        emit(begin, end, whole);
        return;
      }
      TileClass first = classify(begin, begin + 1);
      if (first == TileClass::Partial) {
        emit(begin, begin + 1, first);
        ++begin;
        continue;
      }
      // [begin, begin + good) is `first`; [begin, begin + bad) is not.
      int64_t good = 1, bad = end - begin;
      while (good * 2 < bad) {
        if (classify(begin, begin + good * 2) != first) {
          bad = good * 2;
          break;
        }
        good *= 2;
      }
      while (bad - good > 1) {
        int64_t middle = good + (bad - good) / 2;
        if (classify(begin, begin + middle) == first)
          good = middle;
        else
          bad = middle;
      }
      emit(begin, begin + good, first);
      begin += good;
    }
  }

  IntervalEvaluator &mask;
  MaskArgument column;
  int64_t columnLength, columnTile, columnTiles;
  std::vector<Run> last, beforeLast, seeds; // rows r - 1 and r - 2, seeds of row r
  std::vector<Run> *out = nullptr;
  const std::vector<int64_t> *breakpoints = nullptr;
  std::vector<int64_t> cuts; // sorted tile indices
};

std::string checkShape(const AttentionShape &shape, int64_t queryTile, int64_t keyTile) {
  if (queryTile <= 0 || keyTile <= 0)
    return "tile sizes must be positive, got " + std::to_string(queryTile) + " x " +
           std::to_string(keyTile);
  if (shape.batches <= 0 || shape.heads <= 0)
    return "batches and heads must be positive, got " + std::to_string(shape.batches) +
           " and " + std::to_string(shape.heads);
  if (shape.queryLength < 0 || shape.keyLength < 0)
    return "lengths must not be negative, got " + std::to_string(shape.queryLength) +
           " queries and " + std::to_string(shape.keyLength) + " keys";
  return "";
}

} // namespace

TileClass classifyTile(IntervalEvaluator &mask, int64_t b, int64_t h, IntRange q,
                       IntRange kv) {
  return classOf(mask.evaluateMask(Box{IntRange::point(b), IntRange::point(h), q, kv}));
}

TileListResult buildTileList(IntervalEvaluator &mask, TileListKind kind,
                             const AttentionShape &shape, int64_t queryTile,
                             int64_t keyTile) {
  TileListResult result;
  if (std::string problem = checkShape(shape, queryTile, keyTile); !problem.empty()) {
    result.error = problem;
    return result;
  }
  const bool forward = kind == TileListKind::Forward;
  const int64_t rowLength = forward ? shape.queryLength : shape.keyLength;
  const int64_t rowTile = forward ? queryTile : keyTile;
  const int64_t columnLength = forward ? shape.keyLength : shape.queryLength;
  const int64_t columnTile = forward ? keyTile : queryTile;
  const int64_t rowTiles = (rowLength + rowTile - 1) / rowTile;
  const int64_t columnTiles = (columnLength + columnTile - 1) / columnTile;
  const int64_t batches = mask.dependsOn(MaskArgument::Batch) ? shape.batches : 1;
  const int64_t heads = mask.dependsOn(MaskArgument::Head) ? shape.heads : 1;
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  if (columnTiles > kMaxInt / 2 || batches * heads > kMaxInt ||
      rowTiles > kMaxInt / (batches * heads)) {
    result.error = "tile list of " + std::to_string(batches * heads) + " x " +
                   std::to_string(rowTiles) + " rows and " + std::to_string(columnTiles) +
                   " columns does not fit 32-bit entries";
    return result;
  }

  TileList &list = result.list;
  list.batches = static_cast<int32_t>(batches);
  list.heads = static_cast<int32_t>(heads);
  list.rowTiles = static_cast<int32_t>(rowTiles);
  list.columnTiles = static_cast<int32_t>(columnTiles);
  list.kind = kind;
  list.queryTile = queryTile;
  list.keyTile = keyTile;
  list.queryLength = shape.queryLength;
  list.keyLength = shape.keyLength;
  list.rowOffsets.reserve(static_cast<size_t>(batches * heads * rowTiles + 1));
  list.rowOffsets.push_back(0);

  const MaskArgument columnArgument = forward ? MaskArgument::Key : MaskArgument::Query;
  RowScanner scanner(mask, columnArgument, columnLength, columnTile);

  for (int64_t b = 0; b < batches; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      scanner.restart();
      for (int64_t row = 0; row < rowTiles; ++row) {
        IntRange rows{row * rowTile, std::min((row + 1) * rowTile, rowLength) - 1};
        Box box{IntRange::point(b), IntRange::point(h), rows, rows};
        const std::vector<Run> &runs = scanner.scan(box);
        for (const Run &run : runs) {
          if (run.tile == TileClass::Empty)
            continue;
          const int32_t partial = run.tile == TileClass::Partial ? 1 : 0;
          size_t at = list.entries.size();
          list.entries.resize(at + static_cast<size_t>(run.end - run.begin));
          int32_t *entry = list.entries.data() + at;
          for (int64_t tile = run.begin; tile < run.end; ++tile)
            *entry++ = static_cast<int32_t>(tile << 1) | partial;
        }
        if (static_cast<int64_t>(list.entries.size()) > kMaxInt) {
          result.error = "tile list has more than 2^31 - 1 entries";
          return result;
        }
        list.rowOffsets.push_back(static_cast<int32_t>(list.entries.size()));
      }
    }
  }
  list.evaluations = scanner.evaluations;
  return result;
}

TileListResult transposeTileList(const TileList &source, int64_t queryTile, int64_t keyTile) {
  TileListResult result;
  AttentionShape shape{source.batches, source.heads, source.queryLength, source.keyLength};
  if (std::string problem = checkShape(shape, queryTile, keyTile); !problem.empty()) {
    result.error = problem;
    return result;
  }
  if (source.queryTile <= 0 || source.keyTile <= 0 || queryTile % source.queryTile != 0 ||
      keyTile % source.keyTile != 0) {
    result.error = "tiles of " + std::to_string(queryTile) + " x " + std::to_string(keyTile) +
                   " are not unions of tiles of " + std::to_string(source.queryTile) + " x " +
                   std::to_string(source.keyTile);
    return result;
  }
  // Source rows run along axis X, columns along Y; the target's rows run
  // along Y (each `perRow` source columns) and its columns along X (each
  // `perColumn` source rows).
  const bool fromForward = source.kind == TileListKind::Forward;
  const int64_t lengthX = fromForward ? source.queryLength : source.keyLength;
  const int64_t lengthY = fromForward ? source.keyLength : source.queryLength;
  const int64_t sourceTileX = fromForward ? source.queryTile : source.keyTile;
  const int64_t sourceTileY = fromForward ? source.keyTile : source.queryTile;
  const int64_t targetTileX = fromForward ? queryTile : keyTile;
  const int64_t targetTileY = fromForward ? keyTile : queryTile;
  const int64_t sourceRows = (lengthX + sourceTileX - 1) / sourceTileX;
  const int64_t sourceColumns = (lengthY + sourceTileY - 1) / sourceTileY;
  const int64_t perRow = targetTileY / sourceTileY, perColumn = targetTileX / sourceTileX;
  const int64_t targetRows = (lengthY + targetTileY - 1) / targetTileY;
  const int64_t targetColumns = (lengthX + targetTileX - 1) / targetTileX;
  const int64_t groups = int64_t{source.batches} * source.heads;
  const auto &offsets = source.rowOffsets;
  bool consistent = source.rowTiles == sourceRows && source.columnTiles == sourceColumns &&
                    static_cast<int64_t>(offsets.size()) == groups * sourceRows + 1 &&
                    offsets.front() == 0 &&
                    offsets.back() == static_cast<int64_t>(source.entries.size());
  for (size_t row = 1; consistent && row < offsets.size(); ++row)
    consistent = offsets[row - 1] <= offsets[row];
  const std::string inconsistent =
      "the source tile list is inconsistent (offsets, or entries out of range or out of order)";
  if (!consistent) {
    result.error = inconsistent;
    return result;
  }

  TileList &list = result.list;
  list.batches = source.batches;
  list.heads = source.heads;
  list.rowTiles = static_cast<int32_t>(targetRows);
  list.columnTiles = static_cast<int32_t>(targetColumns);
  list.kind = fromForward ? TileListKind::Backward : TileListKind::Forward;
  list.queryTile = queryTile;
  list.keyTile = keyTile;
  list.queryLength = source.queryLength;
  list.keyLength = source.keyLength;
  list.rowOffsets.assign(static_cast<size_t>(groups * targetRows + 1), 0);
  // Target entries in column order, with their rows; sorted by row below
  // (stably: each row keeps column order). Each takes at least one source
  // entry, so the source's count bounds theirs.
  std::vector<int32_t> rowOf(source.entries.size()), entryOf(source.entries.size());
  size_t count = 0;
  auto emit = [&](int64_t group, int64_t target, int64_t column, bool isFull) {
    rowOf[count] = static_cast<int32_t>(group * targetRows + target);
    entryOf[count++] = static_cast<int32_t>(column << 1) | (isFull ? 0 : 1);
    ++list.rowOffsets[group * targetRows + target + 1];
  };
  auto partsOf = [&](int64_t target) { // source columns in a target row
    return std::min<int64_t>(perRow, sourceColumns - target * perRow);
  };
  std::vector<int32_t> present(static_cast<size_t>(targetRows), 0), full(present);
  std::vector<int32_t> touched(static_cast<size_t>(targetRows));
  size_t touchedCount = 0;
  const bool shiftRows = (perRow & (perRow - 1)) == 0;
  const int rowShift = __builtin_ctzll(static_cast<uint64_t>(perRow));
  for (int64_t group = 0; group < groups; ++group) {
    for (int64_t column = 0; column < targetColumns; ++column) {
      const int64_t firstRow = column * perColumn;
      const int64_t lastRow = std::min(firstRow + perColumn, sourceRows);
      for (int64_t row = firstRow; row < lastRow; ++row) {
        const int64_t index = group * sourceRows + row;
        const int32_t *entry = source.entries.data() + source.rowOffsets[index];
        const int32_t *end = source.entries.data() + source.rowOffsets[index + 1];
        // Entries of a row ascend: count each target row's in registers.
        int64_t previous = -1;
        while (entry != end) {
          const int64_t sourceColumn = *entry >> 1;
          if (sourceColumn <= previous || sourceColumn >= sourceColumns) {
            result.error = inconsistent;
            return result;
          }
          const int32_t target = static_cast<int32_t>(
              shiftRows ? sourceColumn >> rowShift : sourceColumn / perRow);
          const int64_t groupEnd = std::min((target + 1) * perRow, sourceColumns);
          const int32_t *stop = std::min(end, entry + (groupEnd - sourceColumn));
          int32_t parts = 0, fullParts = 0;
          for (; entry != stop && (*entry >> 1) < groupEnd; ++entry) {
            if ((*entry >> 1) <= previous) {
              result.error = inconsistent;
              return result;
            }
            previous = *entry >> 1;
            ++parts;
            fullParts += (*entry & 1) == 0;
          }
          if (perColumn == 1) { // nothing to gather from other source rows
            emit(group, target, column, fullParts == partsOf(target));
            continue;
          }
          if (present[target] == 0)
            touched[touchedCount++] = target;
          present[target] += parts;
          full[target] += fullParts;
        }
      }
      const int64_t rowsHere = lastRow - firstRow;
      for (size_t t = 0; t < touchedCount; ++t) {
        const int32_t target = touched[t];
        emit(group, target, column, full[target] == rowsHere * partsOf(target));
        present[target] = full[target] = 0;
      }
      touchedCount = 0;
    }
  }
  for (size_t row = 1; row < list.rowOffsets.size(); ++row)
    list.rowOffsets[row] += list.rowOffsets[row - 1];
  list.entries.resize(count);
  std::vector<int32_t> next(list.rowOffsets.begin(), list.rowOffsets.end() - 1);
  for (size_t n = 0; n < count; ++n)
    list.entries[next[rowOf[n]]++] = entryOf[n];
  return result;
}

AttentionTileLists buildAttentionTileLists(IntervalEvaluator &mask,
                                           const AttentionShape &shape,
                                           int64_t forwardQueryTile,
                                           int64_t forwardKeyTile,
                                           int64_t backwardQueryTile,
                                           int64_t backwardKeyTile) {
  AttentionTileLists lists;
  auto divides = [](int64_t part, int64_t whole) { return part > 0 && whole % part == 0; };
  TileListResult forward, backward;
  // When one pass's tiles are unions of the other's, scan the finer list
  // and derive the coarser one (as tight, and cheaper than a second scan).
  if (divides(backwardQueryTile, forwardQueryTile) && divides(backwardKeyTile, forwardKeyTile)) {
    backward = buildTileList(mask, TileListKind::Backward, shape, backwardQueryTile, backwardKeyTile);
    if (backward.ok())
      forward = transposeTileList(backward.list, forwardQueryTile, forwardKeyTile);
  } else if (divides(forwardQueryTile, backwardQueryTile) &&
             divides(forwardKeyTile, backwardKeyTile)) {
    forward = buildTileList(mask, TileListKind::Forward, shape, forwardQueryTile, forwardKeyTile);
    if (forward.ok())
      backward = transposeTileList(forward.list, backwardQueryTile, backwardKeyTile);
  } else {
    forward = buildTileList(mask, TileListKind::Forward, shape, forwardQueryTile, forwardKeyTile);
    if (forward.ok())
      backward =
          buildTileList(mask, TileListKind::Backward, shape, backwardQueryTile, backwardKeyTile);
  }
  if (!forward.ok()) {
    lists.error = "forward tile list: " + forward.error;
    return lists;
  }
  if (!backward.ok()) {
    lists.error = "backward tile list: " + backward.error;
    return lists;
  }
  lists.forward = std::move(forward.list);
  lists.backward = std::move(backward.list);
  return lists;
}

} // namespace dflex::analysis
