//===- TileListBench.cpp - time to build the tile lists of a DFlash step --===//
//
// One DFlash training step: 512 anchors (blocks of 16 queries, so 8192
// queries), 8192 context keys + 8192 block keys, batch 1. Builds the
// forward (128 x 64 tiles) and backward (64 x 64) lists from scratch,
// evaluator creation included, as the runtime does every step.
//
//===----------------------------------------------------------------------===//

#include "../interpreter/TestUtil.h"
#include "dflex/Analysis/TileList.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

using namespace dflex;

int main(int argc, char **argv) {
  const int64_t blocks = 512, blockSize = 16, ctxLen = 8192;
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 200;
  auto loaded = test::LoadedModule::fromFile(std::string(DFLEX_EXAMPLES_DIR) + "/dflash.mlir");
  expr::Program program = loaded.program("dflash");
  if (program.instructions.empty())
    return 1;

  std::mt19937_64 rng(1);
  std::vector<int32_t> anchors(blocks);
  for (auto &a : anchors)
    a = std::uniform_int_distribution<int32_t>(1, ctxLen - 1)(rng);
  std::sort(anchors.begin(), anchors.end());
  std::vector<int32_t> contextStart(blocks, 0); // one document per row
  std::vector<expr::CaptureValue> captures{
      expr::CaptureValue::ofTensor(anchors.data(), expr::ScalarType::I32, {1, blocks}),
      expr::CaptureValue::ofTensor(contextStart.data(), expr::ScalarType::I32, {1, blocks}),
      expr::CaptureValue::ofScalar(expr::Value::ofInt(ctxLen))};
  analysis::AttentionShape shape;
  shape.batches = 1;
  shape.heads = 32;
  shape.queryLength = blocks * blockSize;
  shape.keyLength = ctxLen + blocks * blockSize;

  // Per run: evaluator creation, then both lists (the forward one derived
  // from the backward one, whose tiles divide it).
  std::vector<double> create, build, total;
  analysis::AttentionTileLists lists;
  using Clock = std::chrono::steady_clock;
  auto micros = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  for (int r = 0; r < repeats; ++r) {
    auto t0 = Clock::now();
    auto created = analysis::IntervalEvaluator::create(program, captures);
    if (!created.ok()) {
      std::fprintf(stderr, "%s\n", created.error.c_str());
      return 1;
    }
    auto t1 = Clock::now();
    lists = analysis::buildAttentionTileLists(*created.evaluator, shape, 128, 64, 64, 64);
    auto t2 = Clock::now();
    if (!lists.ok()) {
      std::fprintf(stderr, "%s\n", lists.error.c_str());
      return 1;
    }
    create.push_back(micros(t0, t1));
    build.push_back(micros(t1, t2));
    total.push_back(micros(t0, t2));
  }
  // Tightness: how many tiles called partial are really full or empty
  // (only partial tiles need the exact interpreter, pair by pair).
  std::vector<expr::Value> scratch;
  auto describe = [&](const char *name, const analysis::TileList &list, bool forward,
                      int64_t rowTile, int64_t columnTile) {
    int64_t partial = 0, loose = 0;
    for (int32_t row = 0; row < list.rowTiles; ++row)
      for (int32_t n = list.rowOffsets[row]; n < list.rowOffsets[row + 1]; ++n) {
        if (!(list.entries[n] & 1))
          continue;
        ++partial;
        int64_t column = list.entries[n] >> 1, visible = 0, pairs = 0;
        int64_t rowLength = forward ? shape.queryLength : shape.keyLength;
        int64_t columnLength = forward ? shape.keyLength : shape.queryLength;
        for (int64_t r = row * rowTile; r < std::min((row + 1) * rowTile, rowLength); ++r)
          for (int64_t c = column * columnTile;
               c < std::min((column + 1) * columnTile, columnLength); ++c) {
            visible += expr::evaluateMask(program, 0, 0, forward ? r : c, forward ? c : r,
                                          captures, scratch);
            ++pairs;
          }
        loose += visible == 0 || visible == pairs;
      }
    std::printf("%s: %d x %d tiles, %zu listed, %lld partial (%lld really full or empty), "
                "%lld evaluations\n",
                name, list.rowTiles, list.columnTiles, list.entries.size(),
                static_cast<long long>(partial), static_cast<long long>(loose),
                static_cast<long long>(list.evaluations));
  };
  describe("forward  128x64 (derived from the backward list)", lists.forward, true, 128, 64);
  describe("backward  64x64", lists.backward, false, 64, 64);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("median over %d runs: evaluator %.1f us, both lists %.1f us, total %.1f us\n",
              repeats, median(create), median(build), median(total));
  return 0;
}
