//===- TileListTest.cpp - tile lists of hand-built masks ------------------===//
//
// No MLIR: masks are built instruction by instruction. Covers what the
// examples do not: masks that read h, empty lengths and errors.
//
//===----------------------------------------------------------------------===//

#include "../ProgramBuilder.h"
#include "MakeEvaluator.h"
#include "dflex/Analysis/TileList.h"
#include "dflex/Expr/Semantics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

using namespace dflex;
using analysis::AttentionShape;
using analysis::IntervalEvaluator;
using analysis::TileClass;
using analysis::TileList;
using analysis::TileListKind;
using expr::Opcode;
using expr::ScalarType;

namespace {

/// kv <= q + shift(h): causal, shifted right by 7 keys per head.
expr::Program shiftedCausal() {
  test::ProgramBuilder p;
  p.program.name = "shifted_causal";
  int32_t h = p.add(Opcode::Argument, ScalarType::Index, {}, 1);
  int32_t q = p.add(Opcode::Argument, ScalarType::Index, {}, 2);
  int32_t kv = p.add(Opcode::Argument, ScalarType::Index, {}, 3);
  int32_t seven = p.add(Opcode::Constant, ScalarType::Index, {}, 7);
  int32_t shift = p.add(Opcode::MulI, ScalarType::Index, {h, seven});
  int32_t limit = p.add(Opcode::AddI, ScalarType::Index, {q, shift});
  p.add(Opcode::CmpI, ScalarType::I1, {kv, limit}, sem::SLE, 64);
  return p.program;
}

/// A DFlash-like split at n = 40 keys: the context keys (kv < 40) are seen
/// by queries below 8, the block keys only where kv - 40 >= q + 64, so no
/// query from 32 up sees keys 32..63 (the analysis judges `kv < 40` and
/// `kv - 40` apart over a range across 40).
expr::Program contextThenBlocks() {
  test::ProgramBuilder p;
  p.program.name = "context_then_blocks";
  int32_t q = p.add(Opcode::Argument, ScalarType::Index, {}, 2);
  int32_t kv = p.add(Opcode::Argument, ScalarType::Index, {}, 3);
  int32_t n = p.add(Opcode::Constant, ScalarType::Index, {}, 40);
  int32_t eight = p.add(Opcode::Constant, ScalarType::Index, {}, 8);
  int32_t sixtyFour = p.add(Opcode::Constant, ScalarType::Index, {}, 64);
  int32_t isContext = p.add(Opcode::CmpI, ScalarType::I1, {kv, n}, sem::ULT, 64);
  int32_t early = p.add(Opcode::CmpI, ScalarType::I1, {q, eight}, sem::ULT, 64);
  int32_t seesContext = p.add(Opcode::AndI, ScalarType::I1, {isContext, early});
  int32_t isBlock = p.add(Opcode::CmpI, ScalarType::I1, {kv, n}, sem::UGE, 64);
  int32_t position = p.add(Opcode::SubI, ScalarType::Index, {kv, n});
  int32_t bound = p.add(Opcode::AddI, ScalarType::Index, {q, sixtyFour});
  int32_t far = p.add(Opcode::CmpI, ScalarType::I1, {position, bound}, sem::UGE, 64);
  int32_t seesBlock = p.add(Opcode::AndI, ScalarType::I1, {isBlock, far});
  p.add(Opcode::OrI, ScalarType::I1, {seesContext, seesBlock});
  return p.program;
}

std::unique_ptr<IntervalEvaluator> make(const expr::Program &program) {
  return test::makeEvaluator(program);
}

/// The class of each tile of `list` for head `h` (batch 0), by row.
std::vector<std::vector<TileClass>> classes(const TileList &list, int64_t h) {
  std::vector<std::vector<TileClass>> out(list.rowTiles,
                                          std::vector<TileClass>(list.columnTiles, TileClass::Empty));
  for (int32_t row = 0; row < list.rowTiles; ++row) {
    int64_t index = (list.heads == 1 ? 0 : h) * list.rowTiles + row;
    for (int32_t n = list.rowOffsets[index]; n < list.rowOffsets[index + 1]; ++n)
      out[row][list.entries[n] >> 1] =
          (list.entries[n] & 1) ? TileClass::Partial : TileClass::Full;
  }
  return out;
}

TEST(TileLists, PerHeadListsWhenTheMaskReadsTheHead) {
  expr::Program program = shiftedCausal();
  auto evaluator = make(program);
  const int64_t queries = 300, keys = 257;
  AttentionShape shape{3, 4, queries, keys};
  std::vector<expr::Value> scratch;
  // Odd tiles, then the portable kernels' (forward 128 x 64, backward
  // 64 x 64) and the Hopper kernels' (forward 128 x 128, backward 64 x 128).
  for (auto [queryTile, keyTile] : {std::pair<int64_t, int64_t>{16, 32}, {48, 96}, {128, 64},
                                    {64, 64}, {128, 128}, {64, 128}})
    for (TileListKind kind : {TileListKind::Forward, TileListKind::Backward}) {
      SCOPED_TRACE(std::string(kind == TileListKind::Forward ? "forward " : "backward ") +
                   std::to_string(queryTile) + " x " + std::to_string(keyTile));
      auto built = analysis::buildTileList(*evaluator, kind, shape, queryTile, keyTile);
      ASSERT_TRUE(built.ok()) << built.error;
      EXPECT_EQ(built.list.batches, 1); // b is not read
      EXPECT_EQ(built.list.heads, 4);
      const bool forward = kind == TileListKind::Forward;
      const int64_t queryTiles = (queries + queryTile - 1) / queryTile;
      const int64_t keyTiles = (keys + keyTile - 1) / keyTile;
      ASSERT_EQ(built.list.rowTiles, forward ? queryTiles : keyTiles);
      ASSERT_EQ(built.list.columnTiles, forward ? keyTiles : queryTiles);
      for (int64_t h = 0; h < 4; ++h) {
        auto got = classes(built.list, h);
        for (int64_t qt = 0; qt < queryTiles; ++qt)
          for (int64_t kt = 0; kt < keyTiles; ++kt) {
            int64_t visible = 0, pairs = 0;
            for (int64_t q = qt * queryTile; q < std::min((qt + 1) * queryTile, queries); ++q)
              for (int64_t kv = kt * keyTile; kv < std::min((kt + 1) * keyTile, keys); ++kv) {
                visible += expr::evaluateMask(program, 0, h, q, kv, {}, scratch);
                ++pairs;
              }
            TileClass exact = visible == 0       ? TileClass::Empty
                              : visible == pairs ? TileClass::Full
                                                 : TileClass::Partial;
            // This mask is simple enough for the analysis to be exact.
            ASSERT_EQ(forward ? got[qt][kt] : got[kt][qt], exact)
                << "h " << h << " query tile " << qt << ", key tile " << kt;
          }
      }
    }
}

TEST(TileLists, EmptyLengths) {
  auto evaluator = make(shiftedCausal());
  auto noQueries = analysis::buildTileList(*evaluator, TileListKind::Forward,
                                           AttentionShape{1, 1, 0, 50}, 64, 64);
  ASSERT_TRUE(noQueries.ok());
  EXPECT_EQ(noQueries.list.rowTiles, 0);
  EXPECT_EQ(noQueries.list.rowOffsets, std::vector<int32_t>{0});
  auto noKeys = analysis::buildTileList(*evaluator, TileListKind::Forward,
                                        AttentionShape{1, 1, 70, 0}, 64, 64);
  ASSERT_TRUE(noKeys.ok());
  EXPECT_EQ(noKeys.list.rowTiles, 2);
  EXPECT_EQ(noKeys.list.columnTiles, 0);
  EXPECT_TRUE(noKeys.list.entries.empty());
  EXPECT_EQ(noKeys.list.rowOffsets, (std::vector<int32_t>{0, 0, 0}));
}

TEST(TileLists, BadShapesAreErrors) {
  auto evaluator = make(shiftedCausal());
  auto zeroTile = analysis::buildTileList(*evaluator, TileListKind::Forward,
                                          AttentionShape{1, 1, 10, 10}, 0, 64);
  EXPECT_NE(zeroTile.error.find("tile sizes must be positive"), std::string::npos)
      << zeroTile.error;
  auto negative = analysis::buildTileList(*evaluator, TileListKind::Backward,
                                          AttentionShape{1, 1, -1, 10}, 64, 64);
  EXPECT_NE(negative.error.find("lengths must not be negative"), std::string::npos)
      << negative.error;
  auto noHeads = analysis::buildTileList(*evaluator, TileListKind::Forward,
                                         AttentionShape{1, 0, 10, 10}, 64, 64);
  EXPECT_NE(noHeads.error.find("batches and heads must be positive"), std::string::npos);
}

TEST(TileLists, ClassifyTile) {
  auto evaluator = make(shiftedCausal());
  EXPECT_EQ(analysis::classifyTile(*evaluator, 0, 0, {64, 127}, {0, 63}), TileClass::Full);
  EXPECT_EQ(analysis::classifyTile(*evaluator, 0, 0, {0, 63}, {64, 127}), TileClass::Empty);
  EXPECT_EQ(analysis::classifyTile(*evaluator, 0, 1, {0, 63}, {64, 127}), TileClass::Partial);
  EXPECT_EQ(analysis::classifyTile(*evaluator, 0, 0, {0, 63}, {0, 63}), TileClass::Partial);
}

TEST(TileLists, RowTilesAcrossAComparisonAreClassifiedPieceByPiece) {
  // Key tile [32, 63] crosses kv = 40, query tile [32, 63] sees none of it:
  // the backward list (rows of key tiles) must leave it out as the forward
  // list (the crossing in its columns) does.
  auto evaluator = make(contextThenBlocks());
  const AttentionShape shape{1, 1, 64, 64};
  for (TileListKind kind : {TileListKind::Forward, TileListKind::Backward}) {
    auto built = analysis::buildTileList(*evaluator, kind, shape, 32, 32);
    ASSERT_TRUE(built.ok()) << built.error;
    const auto tiles = classes(built.list, 0);
    EXPECT_EQ(tiles[1][1], TileClass::Empty) << (kind == TileListKind::Forward ? "forward" : "backward");
    // Query tile [0, 31] sees keys 32..39: partial either way.
    EXPECT_EQ(kind == TileListKind::Forward ? tiles[0][1] : tiles[1][0], TileClass::Partial);
  }
}

} // namespace
