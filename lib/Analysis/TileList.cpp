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

/// Combines the classes of one tile's pieces: uniform only if every piece is
/// uniform alike.
TileClass combine(TileClass a, TileClass b) { return a == b ? a : TileClass::Partial; }

/// Whether a breakpoint cuts `range` (sorted breakpoints).
bool flipsInside(IntRange range, const std::vector<int64_t> &breakpoints) {
  auto flip = std::upper_bound(breakpoints.begin(), breakpoints.end(), range.lo);
  return flip != breakpoints.end() && *flip <= range.hi;
}

/// `range` cut before each breakpoint inside it (a breakpoint p flips a
/// comparison between p - 1 and p).
std::vector<IntRange> piecesBetweenFlips(IntRange range, const std::vector<int64_t> &breakpoints) {
  std::vector<IntRange> pieces;
  int64_t start = range.lo;
  for (auto flip = std::upper_bound(breakpoints.begin(), breakpoints.end(), range.lo);
       flip != breakpoints.end() && *flip <= range.hi; ++flip) {
    pieces.push_back({start, *flip - 1});
    start = *flip;
  }
  pieces.push_back({start, range.hi});
  return pieces;
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
    if (!flipsInside({first, last}, *breakpoints))
      return whole;
    const std::vector<IntRange> pieces = piecesBetweenFlips({first, last}, *breakpoints);
    TileClass combined = classifyElements(pieces[0].lo, pieces[0].hi);
    for (size_t k = 1; k < pieces.size() && combined != TileClass::Partial; ++k)
      combined = combine(combined, classifyElements(pieces[k].lo, pieces[k].hi));
    return combined;
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

/// The points of the row argument where a comparison of the mask flips, over
/// every column of batch b, head h (a row tile across one is classified
/// piece by piece: `kv < n` and `kv - n` are judged apart otherwise).
std::vector<int64_t> rowBreakpoints(IntervalEvaluator &mask, MaskArgument row, int64_t b,
                                    int64_t h, const AttentionShape &shape) {
  if (shape.queryLength == 0 || shape.keyLength == 0)
    return {};
  mask.fix(Box{IntRange::point(b), IntRange::point(h), IntRange{0, shape.queryLength - 1},
               IntRange{0, shape.keyLength - 1}},
           row);
  return mask.breakpoints();
}

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
  const MaskArgument rowArgument = forward ? MaskArgument::Query : MaskArgument::Key;
  RowScanner scanner(mask, columnArgument, columnLength, columnTile);
  RowScanner pieceScanner(mask, columnArgument, columnLength, columnTile);
  std::vector<TileClass> pieceClasses;
  std::vector<Run> pieceRuns;

  for (int64_t b = 0; b < batches; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const std::vector<int64_t> breaks = rowBreakpoints(mask, rowArgument, b, h, shape);
      scanner.restart();
      for (int64_t row = 0; row < rowTiles; ++row) {
        IntRange rows{row * rowTile, std::min((row + 1) * rowTile, rowLength) - 1};
        Box box{IntRange::point(b), IntRange::point(h), rows, rows};
        const std::vector<Run> *scanned = &pieceRuns;
        if (!flipsInside(rows, breaks)) {
          scanned = &scanner.scan(box);
        } else {
          // Each piece between the flips scanned alone, tile by tile combined.
          const std::vector<IntRange> rowPieces = piecesBetweenFlips(rows, breaks);
          pieceClasses.assign(static_cast<size_t>(list.columnTiles), TileClass::Empty);
          for (size_t k = 0; k < rowPieces.size(); ++k) {
            pieceScanner.restart();
            for (const Run &run : pieceScanner.scan(Box{box.b, box.h, rowPieces[k], rowPieces[k]}))
              for (int64_t tile = run.begin; tile < run.end; ++tile)
                pieceClasses[tile] = k == 0 ? run.tile : combine(pieceClasses[tile], run.tile);
          }
          pieceRuns.clear();
          for (int64_t tile = 0; tile < list.columnTiles; ++tile) {
            if (!pieceRuns.empty() && pieceRuns.back().tile == pieceClasses[tile])
              pieceRuns.back().end = tile + 1;
            else
              pieceRuns.push_back({tile, tile + 1, pieceClasses[tile]});
          }
        }
        for (const Run &run : *scanned) {
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
  list.evaluations = scanner.evaluations + pieceScanner.evaluations;
  return result;
}

} // namespace dflex::analysis
