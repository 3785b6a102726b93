//===- TileListTest.cpp - tile lists of hand-built masks ------------------===//
//
// No MLIR: masks are built instruction by instruction. Covers what the
// examples do not: masks that read h, empty lengths, errors, and the
// derivation of one list from another.
//
//===----------------------------------------------------------------------===//

#include "ProgramBuilder.h"
#include "dflex/Analysis/TileList.h"
#include "dflex/Expr/Semantics.h"

#include <gtest/gtest.h>

#include <random>

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
  AttentionShape shape{3, 4, 100, 130};
  auto built = analysis::buildTileList(*evaluator, TileListKind::Forward, shape, 16, 32);
  ASSERT_TRUE(built.ok()) << built.error;
  EXPECT_EQ(built.list.batches, 1); // b is not read
  EXPECT_EQ(built.list.heads, 4);
  std::vector<expr::Value> scratch;
  for (int64_t h = 0; h < 4; ++h) {
    auto got = classes(built.list, h);
    for (int64_t qt = 0; qt < built.list.rowTiles; ++qt)
      for (int64_t kt = 0; kt < built.list.columnTiles; ++kt) {
        int64_t visible = 0, pairs = 0;
        for (int64_t q = qt * 16; q < std::min<int64_t>(qt * 16 + 16, 100); ++q)
          for (int64_t kv = kt * 32; kv < std::min<int64_t>(kt * 32 + 32, 130); ++kv) {
            visible += expr::evaluateMask(program, 0, h, q, kv, {}, scratch);
            ++pairs;
          }
        TileClass exact = visible == 0       ? TileClass::Empty
                          : visible == pairs ? TileClass::Full
                                             : TileClass::Partial;
        // This mask is simple enough for the analysis to be exact.
        ASSERT_EQ(got[qt][kt], exact) << "h " << h << " tile " << qt << ", " << kt;
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
  auto both = analysis::buildAttentionTileLists(*evaluator, AttentionShape{1, 1, 10, 10}, 64,
                                                64, -64, 64);
  EXPECT_NE(both.error.find("backward tile list: tile sizes must be positive"),
            std::string::npos)
      << both.error;
}

TEST(TileLists, DerivedListsMatchDirectOnes) {
  // For this mask the analysis is exact, so a derived list must equal the
  // list scanned directly with its own tiles.
  auto evaluator = make(shiftedCausal());
  AttentionShape shape{1, 3, 300, 257};
  auto fine = analysis::buildTileList(*evaluator, TileListKind::Backward, shape, 16, 32);
  ASSERT_TRUE(fine.ok());
  for (auto [queryTile, keyTile] : {std::pair<int64_t, int64_t>{16, 32}, {64, 32}, {128, 64},
                                    {48, 96}}) {
    auto derived = analysis::transposeTileList(fine.list, queryTile, keyTile);
    ASSERT_TRUE(derived.ok()) << derived.error;
    auto direct =
        analysis::buildTileList(*evaluator, TileListKind::Forward, shape, queryTile, keyTile);
    ASSERT_TRUE(direct.ok());
    EXPECT_EQ(derived.list.rowOffsets, direct.list.rowOffsets) << queryTile << " x " << keyTile;
    EXPECT_EQ(derived.list.entries, direct.list.entries) << queryTile << " x " << keyTile;
    EXPECT_EQ(derived.list.heads, 3);
  }
  auto notUnion = analysis::transposeTileList(fine.list, 24, 32);
  EXPECT_NE(notUnion.error.find("not unions"), std::string::npos) << notUnion.error;
  TileList damaged = fine.list;
  std::swap(damaged.entries[0], damaged.entries[1]); // out of order within the first row
  ASSERT_GE(damaged.rowOffsets[1], 2);
  auto unordered = analysis::transposeTileList(damaged, 32, 32);
  EXPECT_NE(unordered.error.find("inconsistent"), std::string::npos) << unordered.error;
  damaged = fine.list;
  damaged.queryLength = 400; // more query tiles than the list has columns
  auto longer = analysis::transposeTileList(damaged, 32, 32);
  EXPECT_NE(longer.error.find("inconsistent"), std::string::npos) << longer.error;
}

TEST(TileLists, ClassifyTile) {
  auto evaluator = make(shiftedCausal());
  EXPECT_EQ(analysis::classifyTile(*evaluator, 0, 0, {64, 127}, {0, 63}), TileClass::Full);
  EXPECT_EQ(analysis::classifyTile(*evaluator, 0, 0, {0, 63}, {64, 127}), TileClass::Empty);
  EXPECT_EQ(analysis::classifyTile(*evaluator, 0, 1, {0, 63}, {64, 127}), TileClass::Partial);
  EXPECT_EQ(analysis::classifyTile(*evaluator, 0, 0, {0, 63}, {0, 63}), TileClass::Partial);
}

} // namespace
