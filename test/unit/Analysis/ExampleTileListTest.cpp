//===- ExampleTileListTest.cpp - tile lists of the examples vs brute force -===//
//
// For every mask in examples/, random lengths (not tile multiples), random
// captures, and every tile size pair in {16, 32, 64, 128}^2 (the kernels'
// tiles among them), forward and backward lists: every tile a list calls
// full must be visible everywhere (by the interpreter, pair by pair), every
// tile it leaves out must be visible nowhere. Prints, per example, how many
// tiles the lists call partial although brute force finds them full or
// empty (looseness costs speed, never correctness).
//
//===----------------------------------------------------------------------===//

#include "../Conversion/DFlexToProgram/TestUtil.h"
#include "dflex/Analysis/TileList.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>

using namespace dflex;
using analysis::AttentionShape;
using analysis::TileList;
using analysis::TileListKind;
using expr::CaptureValue;
using expr::ScalarType;

namespace {

std::string examplePath(const std::string &name) {
  return std::string(DFLEX_EXAMPLES_DIR) + "/" + name;
}

int64_t uniform(std::mt19937_64 &rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

CaptureValue indexScalar(int64_t v) { return CaptureValue::ofScalar(expr::Value::ofInt(v)); }

/// Captures of one trial and the memory behind them.
struct Trial {
  AttentionShape shape;
  std::vector<std::vector<int32_t>> storage;
  std::vector<CaptureValue> captures;

  CaptureValue &tensor(std::vector<int32_t> data, std::vector<int64_t> sizes) {
    storage.push_back(std::move(data));
    if (storage.back().empty())
      storage.back().push_back(0); // a tensor needs data, even with no element
    captures.push_back(CaptureValue::ofTensor(storage.back().data(), ScalarType::I32,
                                              std::move(sizes)));
    return captures.back();
  }
};

using CaptureMaker = std::function<void(std::mt19937_64 &, Trial &)>;

/// Sorted anchors in [1, ctxLen) (some duplicates), the last blocks padded
/// with -1; sometimes shuffled.
std::vector<int32_t> anchors(std::mt19937_64 &rng, int64_t batches, int64_t blocks,
                             int64_t ctxLen) {
  std::vector<int32_t> all;
  for (int64_t b = 0; b < batches; ++b) {
    std::vector<int32_t> row(blocks);
    for (auto &a : row)
      a = static_cast<int32_t>(uniform(rng, 1, std::max<int64_t>(1, ctxLen - 1)));
    std::sort(row.begin(), row.end());
    int64_t padded = uniform(rng, 0, blocks / 3);
    for (int64_t i = blocks - padded; i < blocks; ++i)
      row[i] = -1;
    if (uniform(rng, 0, 5) == 0)
      std::shuffle(row.begin(), row.end(), rng);
    all.insert(all.end(), row.begin(), row.end());
  }
  return all;
}

/// DFlash layout: queries are blocks of 16, keys are the context then the
/// blocks.
void dflashCaptures(std::mt19937_64 &rng, Trial &trial, bool window) {
  int64_t blocks = uniform(rng, 1, 18);
  int64_t ctxLen = uniform(rng, 0, 200);
  // Lengths around the natural ones (a few queries/keys more or less).
  trial.shape.queryLength = std::max<int64_t>(1, blocks * 16 + uniform(rng, -20, 10));
  trial.shape.keyLength = std::max<int64_t>(1, ctxLen + blocks * 16 + uniform(rng, -20, 10));
  int64_t tensorBlocks = std::max<int64_t>(1, blocks + uniform(rng, -2, 0));
  std::vector<int32_t> blockAnchors = anchors(rng, trial.shape.batches, tensorBlocks, ctxLen);
  // Each block's document starts at or before its anchor (often at 0).
  std::vector<int32_t> contextStart(blockAnchors.size(), 0);
  for (size_t i = 0; i < blockAnchors.size(); ++i)
    if (uniform(rng, 0, 2) == 0)
      contextStart[i] = static_cast<int32_t>(uniform(rng, 0, std::max<int64_t>(0, blockAnchors[i])));
  trial.tensor(blockAnchors, {trial.shape.batches, tensorBlocks});
  trial.tensor(contextStart, {trial.shape.batches, tensorBlocks});
  trial.captures.push_back(indexScalar(ctxLen));
  if (window)
    trial.captures.push_back(indexScalar(uniform(rng, 0, 100)));
}

struct Example {
  const char *file;
  const char *mask;
  CaptureMaker makeCaptures;
};

const Example kExamples[] = {
    {"causal.mlir", "causal", nullptr},
    {"alibi.mlir", "causal", nullptr},
    {"softcap.mlir", "causal", nullptr},
    {"relative_bias.mlir", "causal", nullptr},
    {"position_scale.mlir", "causal", nullptr},
    {"sliding_window.mlir", "sliding_window",
     [](std::mt19937_64 &rng, Trial &trial) {
       const int64_t special[] = {0, 1, 2, int64_t{1} << 40};
       int64_t pick = uniform(rng, 0, 5);
       trial.captures.push_back(indexScalar(pick < 4 ? special[pick] : uniform(rng, 3, 300)));
     }},
    {"chunked_causal.mlir", "chunked_causal",
     [](std::mt19937_64 &rng, Trial &trial) {
       // 0 (x / 0 == 0: one chunk), 1 (each query alone), a tile-aligned
       // size, one beyond every length, and sizes that cut tiles.
       const int64_t special[] = {0, 1, 64, int64_t{1} << 40};
       int64_t pick = uniform(rng, 0, 5);
       trial.captures.push_back(indexScalar(pick < 4 ? special[pick] : uniform(rng, 2, 200)));
     }},
    {"dilated_sliding_window.mlir", "dilated_sliding_window",
     [](std::mt19937_64 &rng, Trial &trial) {
       trial.captures.push_back(indexScalar(uniform(rng, 0, 40)));
       trial.captures.push_back(indexScalar(uniform(rng, 0, 12)));
     }},
    {"prefix_lm.mlir", "prefix_lm",
     [](std::mt19937_64 &rng, Trial &trial) {
       int64_t size = std::max<int64_t>(0, trial.shape.batches - uniform(rng, 0, 1));
       std::vector<int32_t> prefix(size);
       for (auto &p : prefix)
         p = static_cast<int32_t>(uniform(rng, -3, trial.shape.keyLength + 3));
       trial.tensor(prefix, {size});
     }},
    {"document_mask.mlir", "document",
     [](std::mt19937_64 &rng, Trial &trial) {
       // Sometimes shorter than the sequences (padding), sometimes unsorted.
       int64_t length = std::max(trial.shape.queryLength, trial.shape.keyLength) -
                        uniform(rng, 0, 1) * uniform(rng, 0, 40);
       length = std::max<int64_t>(length, 0);
       bool sorted = uniform(rng, 0, 4) != 0;
       int64_t meanDocument = uniform(rng, 1, 120);
       std::vector<int32_t> ids(trial.shape.batches * length);
       for (int64_t b = 0; b < trial.shape.batches; ++b) {
         int32_t doc = 0;
         for (int64_t t = 0; t < length; ++t) {
           if (sorted)
             doc += uniform(rng, 0, meanDocument) == 0;
           else
             doc = static_cast<int32_t>(uniform(rng, 0, 3));
           ids[b * length + t] = doc;
         }
       }
       trial.tensor(ids, {trial.shape.batches, length});
     }},
    {"dflash.mlir", "dflash",
     [](std::mt19937_64 &rng, Trial &trial) { dflashCaptures(rng, trial, false); }},
    {"dflash_sliding_window.mlir", "dflash_sliding_window",
     [](std::mt19937_64 &rng, Trial &trial) { dflashCaptures(rng, trial, true); }},
};

/// Visible pairs of one (b, h), with 2-D prefix sums for tile counts.
struct Visibility {
  int64_t queries = 0, keys = 0;
  std::vector<int64_t> prefix; // (queries + 1) x (keys + 1)

  int64_t count(int64_t q0, int64_t q1, int64_t k0, int64_t k1) const { // half-open
    auto at = [&](int64_t q, int64_t k) { return prefix[q * (keys + 1) + k]; };
    return at(q1, k1) - at(q0, k1) - at(q1, k0) + at(q0, k0);
  }
};

Visibility bruteForce(const expr::Program &program, const Trial &trial, int64_t b, int64_t h) {
  Visibility v;
  v.queries = trial.shape.queryLength;
  v.keys = trial.shape.keyLength;
  v.prefix.assign((v.queries + 1) * (v.keys + 1), 0);
  std::vector<expr::Value> scratch;
  for (int64_t q = 0; q < v.queries; ++q)
    for (int64_t kv = 0; kv < v.keys; ++kv) {
      bool visible = expr::evaluateMask(program, b, h, q, kv, trial.captures, scratch);
      v.prefix[(q + 1) * (v.keys + 1) + kv + 1] = visible + v.prefix[q * (v.keys + 1) + kv + 1] +
                                                  v.prefix[(q + 1) * (v.keys + 1) + kv] -
                                                  v.prefix[q * (v.keys + 1) + kv];
    }
  return v;
}

struct Tally {
  int64_t full = 0, partial = 0, empty = 0;
  int64_t partialButFull = 0, partialButEmpty = 0;
};

/// Checks one list against brute force and counts its classes.
void checkList(const TileList &list, TileListKind kind, const Trial &trial,
               const std::vector<Visibility> &visibility, bool dependsOnBatch,
               bool dependsOnHead, int64_t queryTile, int64_t keyTile, Tally &tally) {
  const AttentionShape &shape = trial.shape;
  const bool forward = kind == TileListKind::Forward;
  const int64_t rowTile = forward ? queryTile : keyTile, columnTile = forward ? keyTile : queryTile;
  const int64_t rowLength = forward ? shape.queryLength : shape.keyLength;
  const int64_t columnLength = forward ? shape.keyLength : shape.queryLength;
  const int64_t rowTiles = (rowLength + rowTile - 1) / rowTile;
  const int64_t columnTiles = (columnLength + columnTile - 1) / columnTile;
  ASSERT_EQ(list.batches, dependsOnBatch ? shape.batches : 1);
  ASSERT_EQ(list.heads, dependsOnHead ? shape.heads : 1);
  ASSERT_EQ(list.rowTiles, rowTiles);
  ASSERT_EQ(list.columnTiles, columnTiles);
  ASSERT_EQ(static_cast<int64_t>(list.rowOffsets.size()),
            list.batches * list.heads * rowTiles + 1);
  ASSERT_EQ(list.rowOffsets.front(), 0);
  ASSERT_EQ(list.rowOffsets.back(), static_cast<int32_t>(list.entries.size()));
  std::vector<int> classes(columnTiles);
  for (int64_t b = 0; b < shape.batches; ++b)
    for (int64_t h = 0; h < shape.heads; ++h) {
      const Visibility &v = visibility[b * shape.heads + h];
      for (int64_t row = 0; row < rowTiles; ++row) {
        int64_t index = ((list.batches == 1 ? 0 : b) * list.heads + (list.heads == 1 ? 0 : h)) *
                            rowTiles + row;
        std::fill(classes.begin(), classes.end(), 0); // 0 absent, 1 full, 2 partial
        for (int32_t n = list.rowOffsets[index]; n < list.rowOffsets[index + 1]; ++n) {
          int32_t entry = list.entries[n];
          int64_t column = entry >> 1;
          ASSERT_TRUE(column >= 0 && column < columnTiles) << "entry " << entry;
          ASSERT_EQ(classes[column], 0) << "tile listed twice";
          classes[column] = (entry & 1) ? 2 : 1;
        }
        for (int64_t column = 0; column < columnTiles; ++column) {
          int64_t r0 = row * rowTile, r1 = std::min(r0 + rowTile, rowLength);
          int64_t c0 = column * columnTile, c1 = std::min(c0 + columnTile, columnLength);
          int64_t visible = forward ? v.count(r0, r1, c0, c1) : v.count(c0, c1, r0, r1);
          int64_t pairs = (r1 - r0) * (c1 - c0);
          ASSERT_TRUE(classes[column] != 0 || visible == 0)
              << (forward ? "forward" : "backward") << " b " << b << " h " << h << " row tile "
              << row << " column tile " << column << ": left out but " << visible
              << " pairs are visible";
          ASSERT_TRUE(classes[column] != 1 || visible == pairs)
              << (forward ? "forward" : "backward") << " b " << b << " h " << h << " row tile "
              << row << " column tile " << column << ": called full but only " << visible
              << " of " << pairs << " pairs are visible";
          if (classes[column] == 0)
            ++tally.empty;
          else if (classes[column] == 1)
            ++tally.full;
          else {
            ++tally.partial;
            tally.partialButFull += visible == pairs;
            tally.partialButEmpty += visible == 0;
          }
        }
      }
    }
}

void PrintTo(const Example &example, std::ostream *os) {
  *os << example.file << " @" << example.mask;
}

class ExampleTileLists : public ::testing::TestWithParam<Example> {};

TEST_P(ExampleTileLists, MatchBruteForce) {
  const Example &example = GetParam();
  auto loaded = test::LoadedModule::fromFile(examplePath(example.file));
  expr::Program program = loaded.program(example.mask);
  ASSERT_FALSE(program.instructions.empty());
  std::mt19937_64 rng(std::hash<std::string>()(std::string(example.file) + example.mask));
  const int64_t tiles[] = {16, 32, 64, 128};
  Tally tally;
  int64_t evaluations = 0;
  // One evaluator for every trial, rebound to each trial's captures (as the
  // runtime reuses them); its lists must equal a fresh evaluator's.
  std::unique_ptr<analysis::IntervalEvaluator> reused;
  for (int trialIndex = 0; trialIndex < 20; ++trialIndex) {
    Trial trial;
    trial.shape.batches = uniform(rng, 1, 2);
    trial.shape.heads = uniform(rng, 1, 2);
    trial.shape.queryLength = uniform(rng, 1, 300);
    trial.shape.keyLength = uniform(rng, 1, 300);
    if (example.makeCaptures)
      example.makeCaptures(rng, trial);
    auto created = analysis::IntervalEvaluator::create(program, trial.captures);
    ASSERT_TRUE(created.ok()) << created.error;
    if (!reused) {
      reused = std::move(created.evaluator);
      created = analysis::IntervalEvaluator::create(program, trial.captures);
      ASSERT_TRUE(created.ok()) << created.error;
    } else {
      const std::string problem = reused->rebind(trial.captures);
      ASSERT_EQ(problem, "");
    }
    analysis::IntervalEvaluator &fresh = *created.evaluator;
    analysis::IntervalEvaluator &evaluator = *reused;
    std::vector<Visibility> visibility;
    for (int64_t b = 0; b < trial.shape.batches; ++b)
      for (int64_t h = 0; h < trial.shape.heads; ++h)
        visibility.push_back(bruteForce(program, trial, b, h));
    bool byBatch = evaluator.dependsOn(analysis::MaskArgument::Batch);
    bool byHead = evaluator.dependsOn(analysis::MaskArgument::Head);
    for (int64_t queryTile : tiles)
      for (int64_t keyTile : tiles) {
        for (TileListKind kind : {TileListKind::Forward, TileListKind::Backward}) {
          analysis::TileListResult built =
              analysis::buildTileList(evaluator, kind, trial.shape, queryTile, keyTile);
          ASSERT_TRUE(built.ok()) << built.error;
          analysis::TileListResult reference =
              analysis::buildTileList(fresh, kind, trial.shape, queryTile, keyTile);
          ASSERT_TRUE(reference.ok()) << reference.error;
          ASSERT_EQ(built.list.rowOffsets, reference.list.rowOffsets) << "rebound evaluator, trial " << trialIndex;
          ASSERT_EQ(built.list.entries, reference.list.entries) << "rebound evaluator, trial " << trialIndex;
          evaluations += built.list.evaluations;
          checkList(built.list, kind, trial, visibility, byBatch, byHead, queryTile, keyTile,
                    tally);
          if (HasFatalFailure()) {
            ADD_FAILURE() << example.file << " trial " << trialIndex << ": "
                          << trial.shape.queryLength << " queries, " << trial.shape.keyLength
                          << " keys, tiles " << queryTile << " x " << keyTile;
            return;
          }
        }
      }
  }
  int64_t tilesSeen = tally.full + tally.partial + tally.empty;
  int64_t loose = tally.partialButFull + tally.partialButEmpty;
  std::printf("[ tiles    ] %-28s %-22s tiles %7lld: full %5.1f%% partial %5.1f%% empty %5.1f%%; "
              "loose partial %6lld (%.1f%% of partial: %lld full, %lld empty); %.2f evaluations "
              "per tile\n",
              example.file, example.mask, static_cast<long long>(tilesSeen),
              100.0 * tally.full / tilesSeen, 100.0 * tally.partial / tilesSeen,
              100.0 * tally.empty / tilesSeen, static_cast<long long>(loose),
              tally.partial ? 100.0 * loose / tally.partial : 0.0,
              static_cast<long long>(tally.partialButFull),
              static_cast<long long>(tally.partialButEmpty),
              static_cast<double>(evaluations) / tilesSeen);
}

std::string exampleName(const ::testing::TestParamInfo<Example> &info) {
  std::string name = std::string(info.param.file).substr(0, std::string(info.param.file).find('.'));
  return name + "_" + info.param.mask;
}

INSTANTIATE_TEST_SUITE_P(Examples, ExampleTileLists, ::testing::ValuesIn(kExamples), exampleName);

TEST(ExampleDependencies, SharedListsWhereTheMaskAllows) {
  struct Expected {
    const char *file, *mask;
    bool batch, head;
  };
  for (Expected e : {Expected{"causal.mlir", "causal", false, false},
                     Expected{"prefix_lm.mlir", "prefix_lm", true, false},
                     Expected{"document_mask.mlir", "document", true, false},
                     Expected{"dflash.mlir", "dflash", true, false}}) {
    auto loaded = test::LoadedModule::fromFile(examplePath(e.file));
    analysis::Dependencies deps = analysis::computeDependencies(loaded.program(e.mask));
    EXPECT_EQ(deps.leading, (std::vector<bool>{e.batch, e.head, true, true})) << e.file;
    EXPECT_FALSE(deps.floatArithmetic) << e.file;
  }
}

} // namespace
