//===- TileListBench.cpp - time to build the tile lists of one step -------===//
//
// One DFlash training step: 512 anchors (blocks of 16 queries, so 8192
// queries), 8192 context keys + 8192 block keys, batch 1, 32 heads; and one
// call of the document mask at 8192 tokens (documents of 40 to 799 tokens,
// as bench/attention_bench.py --masks draws them). Times
// what the runtime does every call, per kernel family: evaluator creation
// (and, timed apart, rebinding a kept evaluator to the step's captures, which
// is what the runtime does after its first step), the forward list (needed
// before the forward launch), then the backward list (built while the
// forward kernel runs), each by its own scan.
// --cold evicts the CPU caches before every run (a 256 MiB sweep), as the
// rest of a training step does between two steps' lists.
//
//===----------------------------------------------------------------------===//

#include "../Conversion/DFlexToProgram/TestUtil.h"
#include "dflex/Analysis/TileList.h"
#include "dflex/Analysis/TileListCache.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>

using namespace dflex;

namespace {

struct Family {
  const char *name;
  int64_t forwardQueryTile, forwardKeyTile, backwardQueryTile, backwardKeyTile;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// A 256 MiB sweep that evicts the CPU caches (--cold), else nothing.
struct CacheSweep {
  std::vector<char> bytes;
  bool cold() const { return !bytes.empty(); }
  void operator()() {
    for (size_t i = 0; i < bytes.size(); i += 64)
      bytes[i] = static_cast<char>(bytes[i] + 1);
  }
};

// Times the lists of one call of `program` on `captures`; false (after
// printing why) where a list cannot be built.
bool timeLists(const char *what, const expr::Program &program, const std::vector<expr::CaptureValue> &captures,
               const analysis::AttentionShape &shape, int repeats, CacheSweep &evictCaches) {
  if (program.instructions.empty())
    return false;
  using Clock = std::chrono::steady_clock;
  auto micros = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  std::printf("%s, %lld queries x %lld keys; median of %d runs%s:\n", what,
              static_cast<long long>(shape.queryLength), static_cast<long long>(shape.keyLength),
              repeats, evictCaches.cold() ? ", caches evicted before each" : "");
  for (const Family &family : {Family{"portable", 128, 64, 64, 64},
                               Family{"hopper", 128, 128, 64, 128}}) {
    std::vector<double> create, rebind, forward, backward, total, repeated;
    int64_t forwardEntries = 0, backwardEntries = 0;
    analysis::TileListCache cache;
    // The runtime keeps evaluators between steps and rebinds them to each
    // step's captures (the first step creates one).
    auto kept = analysis::IntervalEvaluator::create(program, captures);
    if (!kept.ok()) {
      std::fprintf(stderr, "%s\n", kept.error.c_str());
      return false;
    }
    for (int r = 0; r < repeats; ++r) {
      evictCaches();
      auto r0 = Clock::now();
      if (std::string problem = kept.evaluator->rebind(captures); !problem.empty()) {
        std::fprintf(stderr, "%s\n", problem.c_str());
        return false;
      }
      rebind.push_back(micros(r0, Clock::now()));
      evictCaches();
      auto t0 = Clock::now();
      auto created = analysis::IntervalEvaluator::create(program, captures);
      if (!created.ok()) {
        std::fprintf(stderr, "%s\n", created.error.c_str());
        return false;
      }
      auto t1 = Clock::now();
      analysis::TileListResult forwardList =
          analysis::buildTileList(*created.evaluator, analysis::TileListKind::Forward, shape,
                                  family.forwardQueryTile, family.forwardKeyTile);
      auto t2 = Clock::now();
      analysis::TileListResult backwardList =
          analysis::buildTileList(*created.evaluator, analysis::TileListKind::Backward, shape,
                                  family.backwardQueryTile, family.backwardKeyTile);
      auto t3 = Clock::now();
      for (const auto *list : {&forwardList, &backwardList})
        if (!list->ok()) {
          std::fprintf(stderr, "%s: %s\n", family.name, list->error.c_str());
          return false;
        }
      create.push_back(micros(t0, t1));
      forward.push_back(micros(t1, t2));
      backward.push_back(micros(t2, t3));
      total.push_back(micros(t0, t3));
      // A later layer of the same step: both lists answered by the cache
      // (the key's copy of the captures, the lookup, the list's copy).
      if (r == 0)
        for (const auto *list : {&forwardList, &backwardList})
          cache.insert(*analysis::TileListKey::of(captures, shape, list->list.kind, list->list.queryTile,
                                                  list->list.keyTile),
                       std::make_shared<const analysis::TileList>(list->list));
      evictCaches();
      auto c0 = Clock::now();
      size_t answered = 0;
      for (const auto *list : {&forwardList, &backwardList}) {
        std::optional<analysis::TileListKey> key = analysis::TileListKey::of(
            captures, shape, list->list.kind, list->list.queryTile, list->list.keyTile);
        if (std::shared_ptr<const analysis::TileList> kept = key ? cache.find(*key) : nullptr) {
          const analysis::TileList copy = *kept;
          answered += copy.entries.size() == list->list.entries.size();
        }
      }
      repeated.push_back(micros(c0, Clock::now()));
      if (answered != 2) {
        std::fprintf(stderr, "%s: the cache did not answer a repeated call\n", family.name);
        return false;
      }
      forwardEntries = static_cast<int64_t>(forwardList.list.entries.size());
      backwardEntries = static_cast<int64_t>(backwardList.list.entries.size());
    }
    std::printf("%-8s forward %lldx%lld (%lld tiles listed), backward %lldx%lld (%lld): "
                "evaluator %.1f (rebinding a kept one: %.1f) + forward %.1f + backward %.1f us, "
                "total %.1f us; a repeated call's two lists from the cache %.1f us\n",
                family.name, static_cast<long long>(family.forwardQueryTile),
                static_cast<long long>(family.forwardKeyTile),
                static_cast<long long>(forwardEntries),
                static_cast<long long>(family.backwardQueryTile),
                static_cast<long long>(family.backwardKeyTile),
                static_cast<long long>(backwardEntries), median(create), median(rebind), median(forward),
                median(backward), median(total), median(repeated));
  }
  return true;
}

} // namespace

int main(int argc, char **argv) {
  const int64_t blocks = 512, blockSize = 16, ctxLen = 8192;
  int repeats = 200;
  bool cold = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--cold")
      cold = true;
    else
      repeats = std::atoi(argv[i]);
  }
  if (repeats <= 0) {
    std::fprintf(stderr, "usage: %s [--cold] [repeats > 0]\n", argv[0]);
    return 1;
  }
  CacheSweep evictCaches{std::vector<char>(cold ? size_t(256) << 20 : 0)};
  auto loaded = test::LoadedModule::fromFile(std::string(DFLEX_EXAMPLES_DIR) + "/dflash.mlir");
  std::mt19937_64 rng(1);
  std::vector<int32_t> anchors(blocks);
  for (auto &a : anchors)
    a = std::uniform_int_distribution<int32_t>(1, ctxLen - 1)(rng);
  std::sort(anchors.begin(), anchors.end());
  std::vector<int32_t> contextStart(blocks, 0); // one document per row
  analysis::AttentionShape dflashShape;
  dflashShape.batches = 1;
  dflashShape.heads = 32;
  dflashShape.queryLength = blocks * blockSize;
  dflashShape.keyLength = ctxLen + blocks * blockSize;
  if (!timeLists("DFlash step", loaded.program("dflash"),
                 {expr::CaptureValue::ofTensor(anchors.data(), expr::ScalarType::I32, {1, blocks}),
                  expr::CaptureValue::ofTensor(contextStart.data(), expr::ScalarType::I32, {1, blocks}),
                  expr::CaptureValue::ofScalar(expr::Value::ofInt(ctxLen))},
                 dflashShape, repeats, evictCaches))
    return 1;

  auto documents = test::LoadedModule::fromFile(std::string(DFLEX_EXAMPLES_DIR) + "/document_mask.mlir");
  const int64_t tokens = 8192;
  std::vector<int32_t> documentIds;
  for (int32_t id = 0; static_cast<int64_t>(documentIds.size()) < tokens; ++id)
    documentIds.insert(documentIds.end(), std::uniform_int_distribution<int>(40, 799)(rng), id);
  documentIds.resize(tokens);
  analysis::AttentionShape documentShape;
  documentShape.batches = 1;
  documentShape.heads = 32;
  documentShape.queryLength = tokens;
  documentShape.keyLength = tokens;
  if (!timeLists("document mask", documents.program("document"),
                 {expr::CaptureValue::ofTensor(documentIds.data(), expr::ScalarType::I32, {1, tokens})},
                 documentShape, repeats, evictCaches))
    return 1;
  return 0;
}
