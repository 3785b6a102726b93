//===- ExamplesTest.cpp - interpreter vs hand-written predicates ----------===//
//
// Every shipped example's mask and score_mod, evaluated by the interpreter on
// random indices and random captures, against a C++ predicate written
// independently from the DSL text.
//
//===----------------------------------------------------------------------===//

#include "TestUtil.h"

#include <algorithm>
#include <cmath>
#include <random>

using namespace dflex;
using expr::CaptureValue;
using expr::ScalarType;
using expr::Value;

namespace {

constexpr int kSamples = 20000;

std::string examplePath(const char *name) {
  return std::string(DFLEX_EXAMPLES_DIR) + "/" + name;
}

CaptureValue indexScalar(int64_t v) { return CaptureValue::ofScalar(Value::ofInt(v)); }

struct Indices {
  int64_t b, h, q, kv;
};

/// Random indices, some past the capture sizes (b up to batch, q/kv past T).
struct IndexSampler {
  std::mt19937_64 rng;
  int64_t batch, heads, queries, keys;
  Indices next() {
    auto pick = [&](int64_t n) {
      return std::uniform_int_distribution<int64_t>(0, n - 1)(rng);
    };
    return {pick(batch + 1), pick(heads), pick(queries + 8), pick(keys + 8)};
  }
};

TEST(Examples, Causal) {
  auto loaded = test::LoadedModule::fromFile(examplePath("causal.mlir"));
  expr::Program program = loaded.program("causal");
  std::vector<Value> scratch;
  IndexSampler sampler{std::mt19937_64(1), 2, 4, 300, 300};
  for (int n = 0; n < kSamples; ++n) {
    Indices x = sampler.next();
    ASSERT_EQ(expr::evaluateMask(program, x.b, x.h, x.q, x.kv, {}, scratch), x.q >= x.kv);
  }
}

TEST(Examples, SlidingWindow) {
  auto loaded = test::LoadedModule::fromFile(examplePath("sliding_window.mlir"));
  expr::Program program = loaded.program("sliding_window");
  std::vector<Value> scratch;
  std::mt19937_64 rng(2);
  for (int64_t window : {0, 1, 7, 64, 1000}) {
    IndexSampler sampler{std::mt19937_64(window), 2, 4, 500, 500};
    for (int n = 0; n < kSamples / 5; ++n) {
      Indices x = sampler.next();
      bool expected = x.q >= x.kv && x.q - x.kv < window;
      ASSERT_EQ(expr::evaluateMask(program, x.b, x.h, x.q, x.kv, {indexScalar(window)}, scratch),
                expected)
          << "window " << window << " q " << x.q << " kv " << x.kv;
    }
  }
}

TEST(Examples, PrefixLM) {
  auto loaded = test::LoadedModule::fromFile(examplePath("prefix_lm.mlir"));
  expr::Program program = loaded.program("prefix_lm");
  std::mt19937_64 rng(3);
  const int64_t batch = 3, length = 200;
  std::vector<int32_t> prefix(batch);
  for (auto &p : prefix)
    p = std::uniform_int_distribution<int32_t>(0, length)(rng);
  std::vector<CaptureValue> captures{CaptureValue::ofTensor(prefix.data(), ScalarType::I32, {batch})};
  std::vector<Value> scratch;
  IndexSampler sampler{std::mt19937_64(4), batch, 2, length, length};
  for (int n = 0; n < kSamples; ++n) {
    Indices x = sampler.next();
    int64_t len = x.b < batch ? prefix[x.b] : 0; // out of range reads 0
    bool expected = x.kv < len || x.q >= x.kv;
    ASSERT_EQ(expr::evaluateMask(program, x.b, x.h, x.q, x.kv, captures, scratch), expected);
  }
}

TEST(Examples, DocumentMask) {
  auto loaded = test::LoadedModule::fromFile(examplePath("document_mask.mlir"));
  expr::Program program = loaded.program("document");
  std::mt19937_64 rng(5);
  const int64_t batch = 2, length = 257;
  std::vector<int32_t> ids(batch * length);
  for (int64_t b = 0; b < batch; ++b) {
    int32_t doc = 0;
    for (int64_t t = 0; t < length; ++t) {
      if (std::uniform_int_distribution<int>(0, 30)(rng) == 0)
        ++doc;
      ids[b * length + t] = doc;
    }
  }
  std::vector<CaptureValue> captures{
      CaptureValue::ofTensor(ids.data(), ScalarType::I32, {batch, length})};
  std::vector<Value> scratch;
  IndexSampler sampler{std::mt19937_64(6), batch, 2, length, length};
  for (int n = 0; n < kSamples; ++n) {
    Indices x = sampler.next();
    auto doc = [&](int64_t t, int64_t padding) {
      return x.b < batch && t < length ? ids[x.b * length + t] : padding;
    };
    bool expected = doc(x.q, -1) == doc(x.kv, -2) && x.q >= x.kv;
    ASSERT_EQ(expr::evaluateMask(program, x.b, x.h, x.q, x.kv, captures, scratch), expected);
  }
}

/// A packed DFlash row layout: sorted anchors among [1, ctx_len) with the
/// last `padded` blocks set to -1, and for each block the start of its
/// anchor's document (documents start at random context positions).
struct DFlashLayout {
  std::vector<int32_t> anchors, contextStart;
};

DFlashLayout randomDFlashLayout(std::mt19937_64 &rng, int64_t batch, int64_t blocks,
                                int64_t ctxLen, int64_t padded) {
  DFlashLayout layout;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int32_t> documentStarts = {0};
    for (int d = 0; d < 3; ++d)
      documentStarts.push_back(std::uniform_int_distribution<int32_t>(1, ctxLen - 1)(rng));
    std::sort(documentStarts.begin(), documentStarts.end());
    std::vector<int32_t> row(blocks);
    for (auto &a : row)
      a = std::uniform_int_distribution<int32_t>(1, ctxLen - 1)(rng);
    std::sort(row.begin(), row.end());
    for (int64_t i = 0; i < blocks; ++i) {
      int32_t start = *(std::upper_bound(documentStarts.begin(), documentStarts.end(), row[i]) - 1);
      layout.contextStart.push_back(start);
      layout.anchors.push_back(i >= blocks - padded ? -1 : row[i]);
    }
  }
  return layout;
}

TEST(Examples, DFlash) {
  auto loaded = test::LoadedModule::fromFile(examplePath("dflash.mlir"));
  expr::Program program = loaded.program("dflash");
  std::mt19937_64 rng(7);
  const int64_t batch = 2, blocks = 9, ctxLen = 300, blockSize = 16;
  DFlashLayout layout = randomDFlashLayout(rng, batch, blocks, ctxLen, 2);
  std::vector<CaptureValue> captures{
      CaptureValue::ofTensor(layout.anchors.data(), ScalarType::I32, {batch, blocks}),
      CaptureValue::ofTensor(layout.contextStart.data(), ScalarType::I32, {batch, blocks}),
      indexScalar(ctxLen)};
  std::vector<Value> scratch;
  IndexSampler sampler{std::mt19937_64(8), batch, 4, blocks * blockSize,
                       ctxLen + blocks * blockSize};
  int visible = 0;
  for (int n = 0; n < kSamples; ++n) {
    Indices x = sampler.next();
    int64_t block = x.q / blockSize;
    bool inRange = x.b < batch && block < blocks;
    int64_t anchor = inRange ? layout.anchors[x.b * blocks + block] : -1;
    int64_t start = inRange ? layout.contextStart[x.b * blocks + block] : 0;
    bool expected;
    if (anchor < 0)
      expected = false;
    else if (x.kv < ctxLen)
      expected = start <= x.kv && x.kv < anchor;
    else
      expected = (x.kv - ctxLen) / blockSize == block;
    visible += expected;
    ASSERT_EQ(expr::evaluateMask(program, x.b, x.h, x.q, x.kv, captures, scratch), expected)
        << "b " << x.b << " q " << x.q << " kv " << x.kv << " anchor " << anchor;
  }
  EXPECT_GT(visible, kSamples / 20); // the sample exercises both outcomes
}

TEST(Examples, DFlashSlidingWindow) {
  auto loaded = test::LoadedModule::fromFile(examplePath("dflash_sliding_window.mlir"));
  expr::Program program = loaded.program("dflash_sliding_window");
  std::mt19937_64 rng(9);
  const int64_t batch = 2, blocks = 7, ctxLen = 400, blockSize = 16;
  DFlashLayout layout = randomDFlashLayout(rng, batch, blocks, ctxLen, 1);
  std::vector<Value> scratch;
  for (int64_t window : {5, 64}) {
    std::vector<CaptureValue> captures{
        CaptureValue::ofTensor(layout.anchors.data(), ScalarType::I32, {batch, blocks}),
        CaptureValue::ofTensor(layout.contextStart.data(), ScalarType::I32, {batch, blocks}),
        indexScalar(ctxLen), indexScalar(window)};
    IndexSampler sampler{std::mt19937_64(10 + window), batch, 4, blocks * blockSize,
                         ctxLen + blocks * blockSize};
    for (int n = 0; n < kSamples; ++n) {
      Indices x = sampler.next();
      int64_t block = x.q / blockSize, offset = x.q % blockSize;
      bool inRange = x.b < batch && block < blocks;
      int64_t anchor = inRange ? layout.anchors[x.b * blocks + block] : -1;
      int64_t start = inRange ? layout.contextStart[x.b * blocks + block] : 0;
      int64_t position = anchor + offset; // the query's position at inference
      bool expected;
      if (anchor < 0) {
        expected = false;
      } else if (x.kv < ctxLen) {
        expected = start <= x.kv && x.kv < anchor && position - x.kv < window;
      } else {
        int64_t keyBlock = (x.kv - ctxLen) / blockSize, keyOffset = (x.kv - ctxLen) % blockSize;
        expected = keyBlock == block && keyOffset <= offset && offset - keyOffset < window;
      }
      ASSERT_EQ(expr::evaluateMask(program, x.b, x.h, x.q, x.kv, captures, scratch), expected)
          << "window " << window << " b " << x.b << " q " << x.q << " kv " << x.kv
          << " anchor " << anchor;
    }
  }
}

TEST(Examples, DilatedSlidingWindow) {
  auto loaded = test::LoadedModule::fromFile(examplePath("dilated_sliding_window.mlir"));
  expr::Program program = loaded.program("dilated_sliding_window");
  std::vector<Value> scratch;
  for (auto [window, dilation] : {std::pair<int64_t, int64_t>{4, 3}, {16, 1}, {3, 0}, {100, 7}}) {
    IndexSampler sampler{std::mt19937_64(11 + window), 1, 2, 400, 400};
    for (int n = 0; n < kSamples / 4; ++n) {
      Indices x = sampler.next();
      int64_t distance = x.q - x.kv;
      bool expected = x.q >= x.kv && distance < window * dilation &&
                      (dilation == 0 || distance % dilation == 0);
      ASSERT_EQ(expr::evaluateMask(program, x.b, x.h, x.q, x.kv,
                                   {indexScalar(window), indexScalar(dilation)}, scratch),
                expected)
          << "window " << window << " dilation " << dilation << " q " << x.q << " kv " << x.kv;
    }
  }
}

float randomScore(std::mt19937_64 &rng) {
  return std::uniform_real_distribution<float>(-200.0f, 200.0f)(rng);
}

TEST(Examples, ALiBi) {
  auto loaded = test::LoadedModule::fromFile(examplePath("alibi.mlir"));
  expr::Program mask = loaded.program("causal");
  expr::Program mod = loaded.program("alibi");
  std::mt19937_64 rng(12);
  const int64_t heads = 16;
  std::vector<float> slopes(heads);
  for (int64_t h = 0; h < heads; ++h)
    slopes[h] = std::exp2(-8.0f * (h + 1) / heads);
  std::vector<CaptureValue> captures{CaptureValue::ofTensor(slopes.data(), ScalarType::F32, {heads})};
  std::vector<Value> scratch;
  IndexSampler sampler{std::mt19937_64(13), 1, heads, 1000, 1000};
  for (int n = 0; n < kSamples; ++n) {
    Indices x = sampler.next();
    float s = randomScore(rng);
    float expected = s - slopes[x.h] * static_cast<float>(x.q - x.kv);
    ASSERT_EQ(expr::evaluateScoreMod(mod, s, x.b, x.h, x.q, x.kv, captures, scratch), expected);
    ASSERT_EQ(expr::evaluateMask(mask, x.b, x.h, x.q, x.kv, {}, scratch), x.q >= x.kv);
  }
}

TEST(Examples, Softcap) {
  auto loaded = test::LoadedModule::fromFile(examplePath("softcap.mlir"));
  expr::Program mod = loaded.program("softcap");
  std::mt19937_64 rng(14);
  std::vector<Value> scratch;
  for (int n = 0; n < kSamples; ++n) {
    float s = randomScore(rng) * 10.0f;
    float expected = 50.0f * std::tanh(s / 50.0f);
    float got = expr::evaluateScoreMod(mod, s, 0, 0, 0, 0, {}, scratch);
    ASSERT_FLOAT_EQ(got, expected) << "score " << s;
    ASSERT_LE(std::fabs(got), 50.0f);
  }
}

TEST(Examples, RelativeBias) {
  auto loaded = test::LoadedModule::fromFile(examplePath("relative_bias.mlir"));
  expr::Program mod = loaded.program("relative_bias");
  std::mt19937_64 rng(15);
  const int64_t heads = 16, maxDistance = 20, buckets = 2 * maxDistance + 1;
  std::vector<float> table(heads * buckets);
  for (auto &t : table)
    t = std::uniform_real_distribution<float>(-3.0f, 3.0f)(rng);
  std::vector<CaptureValue> captures{
      CaptureValue::ofTensor(table.data(), ScalarType::F32, {heads, buckets})};
  std::vector<Value> scratch;
  IndexSampler sampler{std::mt19937_64(16), 1, heads, 100, 100};
  for (int n = 0; n < kSamples; ++n) {
    Indices x = sampler.next();
    float s = randomScore(rng);
    int64_t bucket = std::clamp<int64_t>(x.q - x.kv + maxDistance, 0, buckets - 1);
    float expected = s + table[x.h * buckets + bucket];
    ASSERT_EQ(expr::evaluateScoreMod(mod, s, x.b, x.h, x.q, x.kv, captures, scratch), expected)
        << "q " << x.q << " kv " << x.kv;
  }
}

TEST(Examples, SpecsParse) {
  for (const char *name : {"causal.mlir", "dflash.mlir", "qwen35_gdn.mlir", "softcap.mlir"}) {
    auto loaded = test::LoadedModule::fromFile(examplePath(name));
    ASSERT_TRUE(loaded.module) << name;
  }
  auto loaded = test::LoadedModule::fromFile(examplePath("dflash.mlir"));
  auto spec = mlir::SymbolTable::lookupNearestSymbolFrom<mlir::dflex::AttentionOp>(
      *loaded.module, mlir::StringAttr::get(loaded.context.get(), "drafter_attention"));
  ASSERT_TRUE(spec);
  EXPECT_EQ(spec.getNumQHeads(), 32u);
  EXPECT_EQ(spec.getNumKvHeads(), 8u);
  EXPECT_EQ(spec.getQkHeadDim(), 128u);
  EXPECT_FLOAT_EQ(spec.getSoftmaxScale(), 1.0f / std::sqrt(128.0f));
}

} // namespace
