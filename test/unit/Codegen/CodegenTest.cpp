//===- CodegenTest.cpp - emitted functors vs the interpreter --------------===//
//
// The variant of every example attention spec, emitted as C++ and compiled
// by the host compiler into this test, must agree with the interpreter on
// random indices and captures: mask, score_mod, and score_mod_grad (also
// checked against finite differences), and so must random mask bodies
// (RandomMasks.h). Masks are evaluated through their row, column and pair
// parts, as the kernels evaluate them. The variants get their captures
// through packVariant, the byte layout kernels receive.
//
//===----------------------------------------------------------------------===//

#include "../Conversion/DFlexToProgram/TestUtil.h"
#include "dflex/Bundle/Specs.h"
#include "dflex/Codegen/Derivative.h"
#include "dflex/Codegen/KeyIntervals.h"
#include "dflex/Codegen/SplitCongruences.h"
#include "dflex/Codegen/Variant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <tuple>

struct GeneratedVariant {
  const char *file;
  const char *spec;
  size_t size;
  bool (*mask)(const void *, long long, long long, long long, long long);
  float (*scoreMod)(const void *, float, long long, long long, long long, long long);
  float (*scoreModGrad)(const void *, float, long long, long long, long long, long long);
  int (*classifyTile)(const void *, int, int, int, int, int, int, int, int);
  bool (*keyIntervals)(const void *, long long, long long, long long, long long); // null: none
};
struct GeneratedRandomMask {
  int seed;
  size_t size;
  bool (*mask)(const void *, long long, long long, long long, long long);
  bool (*keyIntervals)(const void *, long long, long long, long long, long long); // null: none
};
struct GeneratedRandomScoreMod {
  int seed;
  size_t size;
  float (*scoreMod)(const void *, float, long long, long long, long long, long long);
  float (*scoreModGrad)(const void *, float, long long, long long, long long, long long);
};
#include "GeneratedVariants.h"
#include "../RandomMasks.h"

using namespace dflex;
using expr::CaptureValue;
using expr::ScalarType;
using expr::Value;

namespace {

/// A score_mod with its derivative appended, evaluated as its derivative.
expr::Program derivativeOf(const expr::Program &scoreMod) {
  expr::Program derivative = scoreMod;
  derivative.result = scoreMod.scoreDerivative;
  return derivative;
}

/// Random capture values; the storage outlives the views.
struct RandomCaptures {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<codegen::BoundCapture> bound;
  std::vector<CaptureValue> ordered(const expr::Program &program) const {
    std::vector<CaptureValue> values;
    for (const expr::CaptureDecl &decl : program.captures)
      for (const codegen::BoundCapture &b : bound)
        if (b.name == decl.name)
          values.push_back(b.value);
    return values;
  }
};

RandomCaptures randomCaptures(const codegen::VariantLayout &layout, std::mt19937_64 &rng) {
  RandomCaptures captures;
  captures.storage.reserve(layout.captures.size());
  auto uniformInt = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto uniformFloat = [&](float lo, float hi) {
    return std::uniform_real_distribution<float>(lo, hi)(rng);
  };
  // Integer scalars are small, or one time in six at the edges of their
  // type and of the positions (negative, beyond 32 bits, the extremes).
  static const int64_t kEdges[] = {-1, -300, -(int64_t(1) << 33), INT64_MIN, INT64_MAX, int64_t(1) << 40,
                                   (int64_t(1) << 31) - 1, int64_t(1) << 31};
  auto integerScalar = [&] {
    return uniformInt(0, 5) == 0 ? kEdges[uniformInt(0, std::size(kEdges) - 1)] : uniformInt(0, 120);
  };
  for (const codegen::CaptureSlot &slot : layout.captures) {
    if (!slot.isTensor) {
      Value v = expr::isFloat(slot.elementType) ? Value::ofFloat(uniformFloat(-4, 4))
                : slot.elementType == ScalarType::I1 ? Value::ofInt(uniformInt(0, 1) ? -1 : 0)
                                                     : Value::ofInt(integerScalar());
      captures.bound.push_back({slot.name, CaptureValue::ofScalar(v)});
      continue;
    }
    std::vector<int64_t> sizes;
    int64_t count = 1;
    for (int d = 0; d < slot.rank; ++d) {
      sizes.push_back(uniformInt(1, 40));
      count *= sizes.back();
    }
    size_t elementBytes = slot.elementType == ScalarType::I64 ? 8
                          : slot.elementType == ScalarType::BF16 ? 2 : 4;
    std::vector<uint8_t> data(count * elementBytes);
    for (int64_t i = 0; i < count; ++i) {
      uint8_t *p = &data[i * elementBytes];
      if (slot.elementType == ScalarType::I32) {
        int32_t v = static_cast<int32_t>(uniformInt(-3, 300));
        std::memcpy(p, &v, 4);
      } else if (slot.elementType == ScalarType::I64) {
        int64_t v = uniformInt(-3, 300);
        std::memcpy(p, &v, 8);
      } else if (slot.elementType == ScalarType::F32) {
        float v = uniformFloat(-3, 3);
        std::memcpy(p, &v, 4);
      } else {
        uint16_t v = static_cast<uint16_t>(sem::floatBits(sem::roundBF16(uniformFloat(-3, 3))) >> 16);
        std::memcpy(p, &v, 2);
      }
    }
    captures.storage.push_back(std::move(data));
    captures.bound.push_back(
        {slot.name, CaptureValue::ofTensor(captures.storage.back().data(), slot.elementType, sizes)});
  }
  return captures;
}

/// packVariant's bytes of `captures` in storage aligned like a generated
/// struct of at least `size` bytes (zero past them); none, with the packing
/// error reported, where packing fails.
std::optional<std::vector<uint64_t>> packedVariant(const codegen::VariantLayout &layout,
                                                   const RandomCaptures &captures, const expr::Program &mask,
                                                   const expr::Program *scoreMod, size_t size) {
  auto bytes = codegen::packVariant(layout, captures.bound, mask, scoreMod);
  if (!bytes.ok()) {
    ADD_FAILURE() << bytes.error();
    return std::nullopt;
  }
  std::vector<uint64_t> variant((std::max(size, bytes.value().size()) + 7) / 8, 0);
  std::memcpy(variant.data(), bytes.value().data(), bytes.value().size());
  return variant;
}

bool sameFloat(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }

/// An index below `small`, or, one time in four, one of the largest the
/// kernels pass (up to `largest`), where values the code generator holds in
/// 32 bits are at their limits.
int64_t randomIndex(std::mt19937_64 &rng, int64_t small, int64_t largest) {
  return rng() % 4 == 0 ? largest - static_cast<int64_t>(rng() % 300) : static_cast<int64_t>(rng() % small);
}
// b and h up to the op's limit; q_idx and kv_idx up to a tile past the
// longest sequence (integerRanges' bound).
constexpr int64_t kLargestHead = bundle::kMaxAttentionBatchOrHeads;
constexpr int64_t kLargestPosition = bundle::kMaxAttentionLength + (1 << 16) - 1;

TEST(Codegen, EmittedVariantsMatchTheInterpreter) {
  ASSERT_GT(std::size(kGeneratedVariants), 10u); // every example attention spec and the test specs
  std::mt19937_64 rng(42);
  for (const GeneratedVariant &generated : kGeneratedVariants) {
    SCOPED_TRACE(std::string(generated.file) + " @" + generated.spec);
    auto loaded = test::LoadedModule::fromFile(generated.file);
    ASSERT_TRUE(loaded.module);
    auto spec = mlir::SymbolTable::lookupNearestSymbolFrom<mlir::dflex::AttentionOp>(
        *loaded.module, mlir::StringAttr::get(loaded.context.get(), generated.spec));
    ASSERT_TRUE(spec);
    expr::Program mask = loaded.program(spec.getMask());
    std::optional<expr::Program> scoreMod;
    if (spec.getScoreModAttr()) {
      scoreMod = loaded.program(spec.getScoreModAttr().getValue());
      ASSERT_TRUE(codegen::appendScoreDerivative(*scoreMod).ok());
    }
    auto layout = codegen::layoutVariant(mask, scoreMod ? &*scoreMod : nullptr);
    ASSERT_TRUE(layout.ok()) << layout.error();
    ASSERT_EQ(static_cast<size_t>(layout.value().sizeBytes), generated.size);

    for (int round = 0; round < 4; ++round) {
      RandomCaptures captures = randomCaptures(layout.value(), rng);
      const auto variant =
          packedVariant(layout.value(), captures, mask, scoreMod ? &*scoreMod : nullptr, generated.size);
      ASSERT_TRUE(variant);

      std::vector<CaptureValue> maskCaptures = captures.ordered(mask);
      std::vector<Value> scratch;
      for (int n = 0; n < 3000; ++n) {
        int64_t b = randomIndex(rng, 4, kLargestHead), h = randomIndex(rng, spec.getNumQHeads(), kLargestHead),
                q = randomIndex(rng, 700, kLargestPosition), kv = randomIndex(rng, 900, kLargestPosition);
        const bool visible = expr::evaluateMask(mask, b, h, q, kv, maskCaptures, scratch);
        ASSERT_EQ(generated.mask(variant->data(), b, h, q, kv), visible)
            << "b " << b << " h " << h << " q " << q << " kv " << kv;
        if (generated.keyIntervals)
          ASSERT_EQ(generated.keyIntervals(variant->data(), b, h, q, kv), visible)
              << "key intervals: b " << b << " h " << h << " q " << q << " kv " << kv;
        if (!scoreMod)
          continue;
        std::vector<CaptureValue> modCaptures = captures.ordered(*scoreMod);
        float s = std::uniform_real_distribution<float>(-80, 80)(rng);
        float expected = expr::evaluateScoreMod(*scoreMod, s, b, h, q, kv, modCaptures, scratch);
        ASSERT_TRUE(sameFloat(generated.scoreMod(variant->data(), s, b, h, q, kv), expected));
        const expr::Program derivative = derivativeOf(*scoreMod);
        float grad = generated.scoreModGrad(variant->data(), s, b, h, q, kv);
        ASSERT_TRUE(sameFloat(grad, expr::evaluateScoreMod(derivative, s, b, h, q, kv,
                                                           modCaptures, scratch)));
        // Finite differences in double around s, where the logit is of the
        // score's size (a bias of a position near 2^31 dwarfs a step of 1e-2).
        if (q >= 700 || kv >= 900)
          continue;
        const float step = 1e-2f;
        float above = expr::evaluateScoreMod(*scoreMod, s + step, b, h, q, kv, modCaptures, scratch);
        float below = expr::evaluateScoreMod(*scoreMod, s - step, b, h, q, kv, modCaptures, scratch);
        double numeric = (double(above) - double(below)) / (2.0 * step);
        ASSERT_NEAR(grad, numeric, 2e-2 * std::max(1.0, std::fabs(numeric))) << "score " << s;
      }
    }
  }
}

TEST(Codegen, RandomMasksMatchTheInterpreterPartByPart) {
  // mask_row sees no kv_idx and mask_column no q_idx (their signatures), so
  // agreeing with the interpreter on every pair shows each value went to a
  // part that has what it depends on.
  ASSERT_EQ(std::size(kRandomVariants), size_t(test::kRandomMasks));
  ASSERT_EQ(std::size(kRandomIntervalVariants), size_t(test::kRandomIntervalMasks));
  std::mt19937_64 rng(7);
  int splitRows = 0, splitColumns = 0, congruences = 0, withIntervals = 0, readTerms = 0;
  std::vector<std::pair<const GeneratedRandomMask *, expr::Program>> masks;
  for (const GeneratedRandomMask &generated : kRandomVariants)
    masks.push_back({&generated, test::randomMask(generated.seed)});
  for (const GeneratedRandomMask &generated : kRandomIntervalVariants)
    masks.push_back({&generated, test::randomIntervalMask(generated.seed)});
  for (const auto &[generatedMask, mask] : masks) {
    const GeneratedRandomMask &generated = *generatedMask;
    SCOPED_TRACE(mask.name);
    auto layout = codegen::layoutVariant(mask, nullptr);
    ASSERT_TRUE(layout.ok()) << layout.error();
    ASSERT_EQ(static_cast<size_t>(layout.value().sizeBytes), generated.size);
    const std::string source = codegen::emitVariant("Variant", layout.value(), mask, nullptr);
    splitRows += source.find("struct MaskRow { };") == std::string::npos;
    splitColumns += source.find("struct MaskColumn { };") == std::string::npos;
    readTerms += source.find("_at0 = row.") != std::string::npos || source.find("_at0 = column.") != std::string::npos ||
                 source.find("_at1 = row.") != std::string::npos || source.find("_at1 = column.") != std::string::npos;
    congruences += codegen::splitCongruences(mask).rewritten > 0;
    withIntervals += generated.keyIntervals != nullptr;
    for (int round = 0; round < 4; ++round) {
      RandomCaptures captures = randomCaptures(layout.value(), rng);
      const auto variant = packedVariant(layout.value(), captures, mask, nullptr, generated.size);
      ASSERT_TRUE(variant);
      const std::vector<CaptureValue> values = captures.ordered(mask);
      std::vector<Value> scratch;
      for (int n = 0; n < 2000; ++n) {
        const int64_t b = randomIndex(rng, 4, kLargestHead), h = randomIndex(rng, 8, kLargestHead),
                      q = randomIndex(rng, 700, kLargestPosition), kv = randomIndex(rng, 900, kLargestPosition);
        const bool expected = expr::evaluateMask(mask, b, h, q, kv, values, scratch);
        ASSERT_EQ(generated.mask(variant->data(), b, h, q, kv), expected)
            << "b " << b << " h " << h << " q " << q << " kv " << kv << "\n" << source;
        if (generated.keyIntervals)
          ASSERT_EQ(generated.keyIntervals(variant->data(), b, h, q, kv), expected)
              << "key intervals: b " << b << " h " << h << " q " << q << " kv " << kv << "\n" << source;
      }
    }
  }
  // The bodies exercise the split: most hand values to both parts.
  EXPECT_GT(splitRows, test::kRandomMasks / 2);
  EXPECT_GT(splitColumns, test::kRandomMasks / 2);
  EXPECT_GE(congruences, 4);                               // split congruences (SplitCongruences.h)
  EXPECT_GE(readTerms, 1);                                 // a per-pair read of u with a row's or column's index
  EXPECT_GE(withIntervals, test::kRandomIntervalMasks / 3); // key intervals (KeyIntervals.h)
}

TEST(Codegen, RandomScoreModsMatchTheInterpreterThroughTheirParts) {
  // score_head sees neither the score nor q_idx nor kv_idx, score_row no
  // kv_idx, score_column no q_idx, score_distance only q_idx - kv_idx
  // (their signatures), so agreeing with the
  // interpreter, score and derivative, on every pair shows each value went
  // to a part that has what it depends on.
  ASSERT_EQ(std::size(kRandomScoreModVariants), size_t(test::kRandomScoreMods));
  std::mt19937_64 rng(13);
  int withHead = 0, withReadTerms = 0, withRow = 0, withColumn = 0, withDistance = 0;
  for (const GeneratedRandomScoreMod &generated : kRandomScoreModVariants) {
    expr::Program scoreMod = test::randomScoreMod(generated.seed);
    SCOPED_TRACE(scoreMod.name);
    ASSERT_TRUE(codegen::appendScoreDerivative(scoreMod).ok());
    const expr::Program derivative = derivativeOf(scoreMod);
    const expr::Program causal = test::causalMask();
    auto layout = codegen::layoutVariant(causal, &scoreMod);
    ASSERT_TRUE(layout.ok()) << layout.error();
    ASSERT_EQ(static_cast<size_t>(layout.value().sizeBytes), generated.size);
    const std::string source = codegen::emitVariant("Variant", layout.value(), causal, &scoreMod);
    withHead += source.find("kReadsMemory = true; };\n  DFLEX_FUNCTOR ScoreHead") != std::string::npos;
    withReadTerms += source.find("_at0 = head.") != std::string::npos; // u[head value, pair value]
    withRow += source.find("struct ScoreRow { };") == std::string::npos;
    withColumn += source.find("struct ScoreColumn { };") == std::string::npos;
    withDistance += source.find("struct ScoreDistance { };") == std::string::npos;
    for (int round = 0; round < 4; ++round) {
      RandomCaptures captures = randomCaptures(layout.value(), rng);
      const auto variant = packedVariant(layout.value(), captures, causal, &scoreMod, generated.size);
      ASSERT_TRUE(variant);
      const std::vector<CaptureValue> values = captures.ordered(scoreMod);
      std::vector<Value> scratch;
      for (int n = 0; n < 2000; ++n) {
        const int64_t b = randomIndex(rng, 4, kLargestHead), h = randomIndex(rng, 8, kLargestHead),
                      q = randomIndex(rng, 700, kLargestPosition), kv = randomIndex(rng, 900, kLargestPosition);
        const float s = std::uniform_real_distribution<float>(-80, 80)(rng);
        ASSERT_TRUE(sameFloat(generated.scoreMod(variant->data(), s, b, h, q, kv),
                              expr::evaluateScoreMod(scoreMod, s, b, h, q, kv, values, scratch)))
            << "b " << b << " h " << h << " q " << q << " kv " << kv << " score " << s << "\n" << source;
        ASSERT_TRUE(sameFloat(generated.scoreModGrad(variant->data(), s, b, h, q, kv),
                              expr::evaluateScoreMod(derivative, s, b, h, q, kv, values, scratch)))
            << "derivative: b " << b << " h " << h << " q " << q << " kv " << kv << " score " << s << "\n"
            << source;
      }
    }
  }
  // Most bodies read `t` at a value of b and h alone: their head part reads
  // memory; some read u per pair at a head's index, whose term the head
  // part works out.
  EXPECT_GT(withHead, test::kRandomScoreMods / 3);
  EXPECT_GE(withReadTerms, 5) << withReadTerms;
  // And many hand values of a row or a column alone to the pair.
  EXPECT_GE(withRow, 15) << withRow;
  EXPECT_GE(withColumn, 15) << withColumn;
  EXPECT_GE(withDistance, 10) << withDistance;
}

TEST(Codegen, KeyIntervalsKeepTheMask) {
  // The rewritten program (its result the interval test) against the mask,
  // with the interpreter, on the examples and the random interval masks;
  // every interval's first key within 31 bits.
  std::vector<expr::Program> masks;
  for (const GeneratedVariant &generated : kGeneratedVariants) {
    auto loaded = test::LoadedModule::fromFile(generated.file);
    ASSERT_TRUE(loaded.module);
    auto spec = mlir::SymbolTable::lookupNearestSymbolFrom<mlir::dflex::AttentionOp>(
        *loaded.module, mlir::StringAttr::get(loaded.context.get(), generated.spec));
    ASSERT_TRUE(spec);
    masks.push_back(loaded.program(spec.getMask()));
  }
  for (int seed = 0; seed < test::kRandomIntervalMasks; ++seed)
    masks.push_back(test::randomIntervalMask(seed));
  std::mt19937_64 rng(11);
  int rewritten = 0;
  for (const expr::Program &mask : masks) {
    SCOPED_TRACE(mask.name);
    const codegen::KeyIntervalForm form = codegen::keyIntervals(codegen::splitCongruences(mask).program);
    ASSERT_EQ(form.first.size(), form.count.size());
    ASSERT_LE(form.first.size(), size_t(codegen::kMaxKeyIntervals));
    if (form.first.empty())
      continue;
    ++rewritten;
    auto layout = codegen::layoutVariant(mask, nullptr);
    ASSERT_TRUE(layout.ok()) << layout.error();
    for (int round = 0; round < 8; ++round) {
      RandomCaptures captures = randomCaptures(layout.value(), rng);
      const std::vector<CaptureValue> values = captures.ordered(mask);
      std::vector<Value> scratch, intervalScratch;
      for (int n = 0; n < 1000; ++n) {
        const int64_t b = randomIndex(rng, 4, kLargestHead), h = randomIndex(rng, 8, kLargestHead),
                      q = randomIndex(rng, 700, kLargestPosition), kv = randomIndex(rng, 900, kLargestPosition);
        const Value leading[] = {Value::ofInt(b), Value::ofInt(h), Value::ofInt(q), Value::ofInt(kv)};
        const bool shown = expr::evaluate(form.program, leading, values, intervalScratch).i != 0;
        ASSERT_EQ(shown, expr::evaluateMask(mask, b, h, q, kv, values, scratch))
            << "b " << b << " h " << h << " q " << q << " kv " << kv;
        for (int32_t first : form.first)
          ASSERT_GE(intervalScratch[first].i, 0);
      }
    }
  }
  EXPECT_GE(rewritten, 3 + test::kRandomIntervalMasks / 3); // the DFlash masks, the sliding window
}

TEST(Codegen, SplitCongruencesKeepTheMaskForEveryDivisor) {
  // (a - b) % n == 0 against a % n == b % n, through the interpreter, for
  // divisors of every kind the semantics single out (zero, -1, the minimum
  // value, beyond 32 bits) at both widths, on positions near 0 and near the
  // kernels' largest.
  using expr::Opcode;
  struct Case {
    Opcode remainder;
    bool guarded; // q >= kv is a conjunct of the mask
    int width;
    int expectRewritten;
  };
  const Case cases[] = {{Opcode::RemUI, true, 64, 1},  {Opcode::RemUI, true, 32, 1},
                        {Opcode::RemSI, false, 64, 1}, {Opcode::RemSI, false, 32, 1},
                        {Opcode::RemUI, false, 64, 0}, {Opcode::RemUI, false, 32, 0}};
  for (const Case &c : cases) {
    SCOPED_TRACE(std::string(expr::toString(c.remainder)) + (c.guarded ? " guarded" : "") + " i" +
                 std::to_string(c.width));
    const expr::ScalarType type = test::intType(c.width);
    test::ProgramBuilder builder;
    builder.program.captures = {{"n", false, type, 0}};
    const int32_t q = builder.argument(2, c.width), kv = builder.argument(3, c.width);
    // a = q + 3 at 64 bits; at 32 bits q itself (q + 3 may wrap there, and
    // then nothing is split).
    const int32_t three = builder.add(Opcode::Constant, type, {}, 3);
    const int32_t shifted = c.width == 64 ? builder.add(Opcode::AddI, type, {q, three}) : q;
    const int32_t n = builder.add(Opcode::Capture, type, {}, 0);
    const int32_t difference = builder.add(Opcode::SubI, type, {shifted, kv});
    const int32_t remainder = builder.add(c.remainder, type, {difference, n});
    const int32_t zero = builder.add(Opcode::Constant, type, {}, 0);
    int32_t result = builder.add(Opcode::CmpI, expr::ScalarType::I1, {remainder, zero}, sem::EQ, c.width);
    if (c.guarded) {
      const int32_t order = builder.add(Opcode::CmpI, expr::ScalarType::I1, {shifted, kv}, sem::UGE, c.width);
      result = builder.add(Opcode::AndI, expr::ScalarType::I1, {order, result});
    }
    const expr::Program &mask = builder.program;
    const codegen::CongruenceSplit split = codegen::splitCongruences(mask);
    ASSERT_EQ(split.rewritten, c.expectRewritten);
    ASSERT_EQ(split.origin.size(), split.program.instructions.size());

    const int64_t minimum = c.width == 32 ? INT32_MIN : INT64_MIN;
    const int64_t divisors[] = {0, 1, 2, 3, 7, 64, -1, -3, minimum, (int64_t(1) << 32) + 1, int64_t(1) << 40};
    const int64_t largest = kLargestPosition;
    std::vector<int64_t> positions;
    for (int64_t p = 0; p < 24; ++p) {
      positions.push_back(p);
      positions.push_back(largest - p);
    }
    std::vector<Value> scratch;
    int differing = 0;
    for (int64_t divisor : divisors) {
      const std::vector<CaptureValue> captures = {CaptureValue::ofScalar(Value::ofInt(
          c.width == 32 ? int64_t(int32_t(uint32_t(uint64_t(divisor)))) : divisor))};
      for (int64_t qi : positions)
        for (int64_t ki : positions) {
          const bool original = expr::evaluateMask(mask, 0, 0, qi, ki, captures, scratch);
          const bool rewritten = expr::evaluateMask(split.program, 0, 0, qi, ki, captures, scratch);
          ASSERT_EQ(original, rewritten) << "n " << divisor << " q " << qi << " kv " << ki;
          // What the guard is for: an unsigned difference that wraps.
          const int64_t a = c.width == 64 ? qi + 3 : qi;
          const bool wraps = c.remainder == Opcode::RemUI && divisor == 3 && a < ki;
          differing += wraps && original != (a % 3 == ki % 3);
        }
    }
    if (c.remainder == Opcode::RemUI && !c.guarded)
      EXPECT_GT(differing, 0); // so the unsigned, unguarded comparison must stay as written
  }
}

TEST(Codegen, TileClassificationMatchesBruteForce) {
  std::mt19937_64 rng(7);
  for (const GeneratedVariant &generated : kGeneratedVariants) {
    SCOPED_TRACE(std::string(generated.file) + " @" + generated.spec);
    auto loaded = test::LoadedModule::fromFile(generated.file);
    auto spec = mlir::SymbolTable::lookupNearestSymbolFrom<mlir::dflex::AttentionOp>(
        *loaded.module, mlir::StringAttr::get(loaded.context.get(), generated.spec));
    expr::Program mask = loaded.program(spec.getMask());
    // The mask's captures come first in the variant: a mask-only layout is a
    // prefix of the full one, and score_mod captures may stay zero here.
    auto layout = codegen::layoutVariant(mask, nullptr);
    RandomCaptures captures = randomCaptures(layout.value(), rng);
    const auto variant = packedVariant(layout.value(), captures, mask, nullptr, generated.size);
    ASSERT_TRUE(variant);
    std::vector<CaptureValue> maskCaptures = captures.ordered(mask);
    std::vector<Value> scratch;
    int classes[3] = {0, 0, 0};
    for (int n = 0; n < 300; ++n) {
      int tileM = 16 << (rng() % 3), tileN = 16 << (rng() % 3);
      int qLen = 1 + rng() % 300, kvLen = 1 + rng() % 300;
      int qTile = rng() % ((qLen + tileM - 1) / tileM), kvTile = rng() % ((kvLen + tileN - 1) / tileN);
      int b = rng() % 3, h = rng() % spec.getNumQHeads();
      int64_t visible = 0, pairs = 0;
      for (int64_t q = int64_t(qTile) * tileM; q < std::min<int64_t>(qLen, int64_t(qTile + 1) * tileM); ++q)
        for (int64_t kv = int64_t(kvTile) * tileN; kv < std::min<int64_t>(kvLen, int64_t(kvTile + 1) * tileN); ++kv) {
          visible += expr::evaluateMask(mask, b, h, q, kv, maskCaptures, scratch);
          ++pairs;
        }
      int expected = visible == 0 ? 0 : visible == pairs ? 2 : 1;
      ASSERT_EQ(generated.classifyTile(variant->data(), b, h, qTile, kvTile, qLen, kvLen, tileM, tileN),
                expected);
      ++classes[expected];
    }
    EXPECT_GT(classes[0] + classes[1] + classes[2], 0);
  }
}

TEST(Codegen, DerivativeRules) {
  auto loaded = test::LoadedModule::fromString(R"(
    dflex.score_mod @f(%s: f32, %b: index, %h: index, %q: index, %kv: index) {
      %c2 = arith.constant 2.0 : f32
      %sq = arith.mulf %s, %s : f32
      %e = math.exp %sq : f32
      %l = math.log1p %sq : f32
      %d = arith.divf %e, %c2 : f32
      %m = arith.maximumf %d, %l : f32
      %t = math.tanh %s : f32
      %p = math.powf %sq, %c2 : f32
      %r0 = arith.addf %m, %t : f32
      %r1 = arith.subf %r0, %p : f32
      %sqrt = math.sqrt %e : f32
      %r2 = arith.addf %r1, %sqrt : f32
      %erf = math.erf %s : f32
      %r3 = arith.addf %r2, %erf : f32
      dflex.yield %r3 : f32
    })");
  expr::Program program = loaded.program("f");
  ASSERT_TRUE(codegen::appendScoreDerivative(program).ok());
  const expr::Program derivative = derivativeOf(program);
  std::vector<Value> scratch;
  for (float s : {-1.3f, -0.4f, 0.2f, 0.9f, 1.1f}) {
    double h = 1e-3;
    double numeric = (double(expr::evaluateScoreMod(program, s + h, 0, 0, 0, 0, {}, scratch)) -
                      double(expr::evaluateScoreMod(program, s - h, 0, 0, 0, 0, {}, scratch))) /
                     (2 * h);
    float symbolic = expr::evaluateScoreMod(derivative, s, 0, 0, 0, 0, {}, scratch);
    EXPECT_NEAR(symbolic, numeric, 2e-2 * std::max(1.0, std::fabs(numeric))) << "s = " << s;
  }
}

TEST(Codegen, DerivativesTakeNoProductWithOne) {
  // d(exp(s * t))/ds = exp(s * t) * (t * 1): the rules' factor 1 (the
  // score's own derivative) drops out, leaving one product, not two; so a
  // score scaled by a row's factor has that factor itself as its derivative.
  auto loaded = test::LoadedModule::fromString(R"(
    dflex.score_mod @f(%s: f32, %b: index, %h: index, %q: index, %kv: index) {
      %t = arith.constant 0.75 : f32
      %r = arith.mulf %s, %t : f32
      %e = math.exp %r : f32
      dflex.yield %e : f32
    })");
  expr::Program program = loaded.program("f");
  ASSERT_TRUE(codegen::appendScoreDerivative(program).ok());
  const auto products = std::count_if(program.instructions.begin(), program.instructions.end(),
                                      [](const expr::Instruction &inst) { return inst.op == expr::Opcode::MulF; });
  EXPECT_EQ(products, 2) << "s * t, and exp(s * t) * t";
  const expr::Program derivative = derivativeOf(program);
  std::vector<Value> scratch;
  for (float s : {-2.0f, 0.3f, 1.7f})
    EXPECT_FLOAT_EQ(expr::evaluateScoreMod(derivative, s, 0, 0, 0, 0, {}, scratch), std::exp(s * 0.75f) * 0.75f)
        << "s = " << s;
}

TEST(Codegen, NonDifferentiableOpsAreRejectedWithTheirLocation) {
  auto loaded = test::LoadedModule::fromString(R"(
    dflex.score_mod @f(%s: f32, %b: index, %h: index, %q: index, %kv: index) {
      %r = math.floor %s : f32
      dflex.yield %r : f32
    })");
  expr::Program program = loaded.program("f");
  Status status = codegen::appendScoreDerivative(program);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find(":3:12: error: 'math.floor' is not differentiable"),
            std::string::npos)
      << status.message();
}

TEST(Codegen, PackVariantChecksCaptures) {
  auto loaded = test::LoadedModule::fromFile(std::string(DFLEX_EXAMPLES_DIR) + "/dflash.mlir");
  expr::Program mask = loaded.program("dflash");
  auto layout = codegen::layoutVariant(mask, nullptr);
  ASSERT_TRUE(layout.ok());
  std::vector<int32_t> anchors(6), starts(6);
  CaptureValue tensor = CaptureValue::ofTensor(anchors.data(), ScalarType::I32, {2, 3});
  CaptureValue startTensor = CaptureValue::ofTensor(starts.data(), ScalarType::I32, {2, 3});
  CaptureValue scalar = CaptureValue::ofScalar(Value::ofInt(100));
  std::vector<codegen::BoundCapture> all = {
      {"anchors", tensor}, {"context_start", startTensor}, {"ctx_len", scalar}};
  EXPECT_TRUE(codegen::packVariant(layout.value(), all, mask, nullptr).ok());
  auto missing = codegen::packVariant(layout.value(), {all[0], all[1]}, mask, nullptr);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error(), "capture 'ctx_len' is missing");
  auto unknown = codegen::packVariant(layout.value(), {all[0], all[1], all[2], {"window", scalar}}, mask, nullptr);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error(), "no capture named 'window'");
  CaptureValue wrongType = CaptureValue::ofTensor(anchors.data(), ScalarType::I64, {2, 3});
  auto mistyped = codegen::packVariant(layout.value(), {{"anchors", wrongType}, all[1], all[2]}, mask, nullptr);
  ASSERT_FALSE(mistyped.ok());
  EXPECT_EQ(mistyped.error(), "capture 'anchors' must hold i32, got i64");
  // The bytes: pointer, sizes, strides of each tensor, then the scalar.
  auto bytes = codegen::packVariant(layout.value(), all, mask, nullptr);
  int64_t words[11];
  ASSERT_EQ(bytes.value().size(), sizeof words);
  std::memcpy(words, bytes.value().data(), sizeof words);
  EXPECT_EQ(words[0], static_cast<int64_t>(reinterpret_cast<uintptr_t>(anchors.data())));
  EXPECT_EQ(words[1], 2);
  EXPECT_EQ(words[2], 3);
  EXPECT_EQ(words[3], 3);
  EXPECT_EQ(words[4], 1);
  EXPECT_EQ(words[5], static_cast<int64_t>(reinterpret_cast<uintptr_t>(starts.data())));
  EXPECT_EQ(words[10], 100);
}

} // namespace

TEST(Codegen, LaunchInvariantDivisorsDivideExactlyByMultiplication) {
  // Divisors around the 32-bit edge and random ones, numerators at their
  // edges and random, at index and i32 widths: the magic quotient,
  // remainder and ceiling equal divui, remui and ceildivui.
  std::mt19937_64 rng(5);
  std::vector<uint64_t> divisors = {0, 1, 2, 3, 5, 7, 10, 16, 100, 641, 65535, 65536, 65537,
                                    (1ull << 31) - 1, 1ull << 31, (1ull << 31) + 1, (1ull << 32) - 1,
                                    1ull << 32, (1ull << 32) + 1, 1ull << 40};
  for (int i = 0; i < 2000; ++i)
    divisors.push_back(rng() >> (rng() % 64));
  int64_t checked = 0;
  for (uint64_t d : divisors)
    for (int w : {64, 32}) {
      const int64_t b = sem::wrap(d, w);
      const sem::UDivisor divisor = sem::makeUDivisor(b, w);
      std::vector<uint64_t> numerators = {0, 1, d - 1, d, d + 1, 2 * d, (1ull << 31) - 1,
                                          1ull << 31, (1ull << 32) - 1};
      for (int k = 0; k < 64; ++k)
        numerators.push_back(rng() >> 32);
      for (uint64_t n : numerators) {
        const int64_t a = sem::wrap(n & 0xffffffffull, w);
        ASSERT_EQ(sem::divuiBy(a, divisor, w), sem::divui(a, b, w)) << n << " / " << d << " w" << w;
        ASSERT_EQ(sem::remuiBy(a, divisor, w), sem::remui(a, b, w)) << n << " % " << d << " w" << w;
        ASSERT_EQ(sem::ceildivuiBy(a, divisor, w), sem::ceildivui(a, b, w)) << n << " ceil/ " << d;
        ++checked;
      }
    }
  EXPECT_GT(checked, 200000);

  // Signed: non-negative numerators, divisors of either sign (-1 and the
  // minimum values included): divsi, remsi, floordivsi and ceildivsi.
  std::vector<int64_t> signedDivisors = {0, 1, -1, 2, -2, 3, -3, 7, -7, 64, -64, INT32_MIN, INT32_MAX,
                                         INT64_MIN, INT64_MAX, int64_t(1) << 32, -(int64_t(1) << 32)};
  for (int i = 0; i < 2000; ++i)
    signedDivisors.push_back(int64_t(rng()) >> (rng() % 64));
  checked = 0;
  for (int64_t d : signedDivisors)
    for (int w : {64, 32}) {
      const int64_t b = sem::wrap(uint64_t(d), w);
      const sem::UDivisor divisor = sem::makeSDivisor(b, w);
      const int64_t top = w == 64 ? (int64_t(1) << 32) - 1 : INT32_MAX;
      std::vector<int64_t> numerators = {0, 1, top, top - 1, INT32_MAX};
      const int64_t magnitude = b < 0 ? -(b + 1) : b; // avoids overflowing at the minimum
      if (magnitude <= top)
        for (int64_t delta = -1; delta <= 2; ++delta)
          if (magnitude + delta >= 0 && magnitude + delta <= top)
            numerators.push_back(magnitude + delta);
      for (int k = 0; k < 64; ++k)
        numerators.push_back(int64_t(rng() % uint64_t(top + 1)));
      for (int64_t a : numerators) {
        ASSERT_EQ(sem::divsiBy(a, divisor, w), sem::divsi(a, b, w)) << a << " / " << b << " w" << w;
        ASSERT_EQ(sem::remsiBy(a, divisor, w), sem::remsi(a, b, w)) << a << " % " << b << " w" << w;
        ASSERT_EQ(sem::floordivsiBy(a, divisor, w), sem::floordivsi(a, b, w)) << a << " floor/ " << b;
        ASSERT_EQ(sem::ceildivsiBy(a, divisor, w), sem::ceildivsi(a, b, w)) << a << " ceil/ " << b;
        ++checked;
      }
    }
  EXPECT_GT(checked, 200000);
}

TEST(Codegen, DivisionsByLaunchInvariantsGetADivisorSlot) {
  // chunked_causal divides both indices by its captured chunk size: one
  // divisor member, packed from the capture, and no division left in the
  // functor.
  auto loaded = test::LoadedModule::fromFile(std::string(DFLEX_EXAMPLES_DIR) + "/chunked_causal.mlir");
  expr::Program mask = loaded.program("chunked_causal");
  auto layout = codegen::layoutVariant(mask, nullptr);
  ASSERT_TRUE(layout.ok());
  ASSERT_EQ(layout.value().divisors.size(), 1u);
  EXPECT_EQ(layout.value().divisors[0].width, 64);
  EXPECT_EQ(layout.value().divisors[0].offsetBytes, 8);
  EXPECT_FALSE(layout.value().divisors[0].wide) << "both indices are below 2^32";
  EXPECT_EQ(layout.value().sizeBytes, 8 + layout.value().divisors[0].sizeBytes());
  const std::string source = codegen::emitVariant("Chunked", layout.value(), mask, nullptr);
  EXPECT_NE(source.find("divuiBy("), std::string::npos) << source;
  EXPECT_EQ(source.find("divui("), std::string::npos) << source;
  auto bytes = codegen::packVariant(layout.value(), {{"chunk", CaptureValue::ofScalar(Value::ofInt(48))}},
                                    mask, nullptr);
  ASSERT_TRUE(bytes.ok()) << bytes.error();
  sem::UDivisor packed;
  std::memcpy(&packed, bytes.value().data() + 8, sizeof packed);
  EXPECT_EQ(packed.divisor, 48u);
  EXPECT_EQ(sem::divuiBy(1000, packed, 64), 1000 / 48);

  // Signed divisions of non-negative numerators by an invariant get a
  // signed divisor; a numerator read from a tensor has no proven range, and
  // a constant divisor is NVRTC's to reduce: both stay divisions.
  auto floors = test::LoadedModule::fromString(R"(
    dflex.mask @m(%b: index, %h: index, %q_idx: index, %kv_idx: index) captures(%n: index) {
      %a = arith.floordivsi %q_idx, %n : index
      %lag = arith.subi %n, %h : index
      %r = arith.remsi %kv_idx, %lag : index
      %v = arith.cmpi slt, %a, %r : index
      dflex.yield %v : i1
    })");
  ASSERT_TRUE(floors.module);
  expr::Program floorMask = floors.program("m");
  auto floorLayout = codegen::layoutVariant(floorMask, nullptr);
  ASSERT_TRUE(floorLayout.ok());
  ASSERT_EQ(floorLayout.value().divisors.size(), 1u) << "n - h depends on h: no divisor for it";
  EXPECT_TRUE(floorLayout.value().divisors[0].isSigned);
  const std::string floorSource = codegen::emitVariant("Floors", floorLayout.value(), floorMask, nullptr);
  EXPECT_NE(floorSource.find("floordivsiBy("), std::string::npos) << floorSource;
  EXPECT_NE(floorSource.find("remsi("), std::string::npos) << floorSource;
  for (int64_t n : {int64_t(-7), int64_t(-1), int64_t(0), int64_t(1), int64_t(5), int64_t(1) << 33}) {
    auto packed = codegen::packVariant(floorLayout.value(), {{"n", CaptureValue::ofScalar(Value::ofInt(n))}},
                                       floorMask, nullptr);
    ASSERT_TRUE(packed.ok());
    sem::UDivisor divisor;
    std::memcpy(&divisor, packed.value().data() + 8, sizeof divisor);
    for (int64_t q : {int64_t(0), int64_t(1), int64_t(6), int64_t(7), int64_t(8), int64_t(1000)})
      EXPECT_EQ(sem::floordivsiBy(q, divisor, 64), sem::floordivsi(q, n, 64)) << q << " // " << n;
  }

  auto other = test::LoadedModule::fromString(R"(
    dflex.mask @m(%b: index, %h: index, %q_idx: index, %kv_idx: index)
        captures(%t: tensor<?xi64>, %n: index) {
      %x = dflex.read %t[%q_idx] : tensor<?xi64>
      %xi = arith.index_cast %x : i64 to index
      %a = arith.divui %xi, %n : index
      %c = arith.constant 7 : index
      %k = arith.remui %kv_idx, %c : index
      %s = arith.addi %a, %k : index
      %v = arith.cmpi ult, %s, %kv_idx : index
      dflex.yield %v : i1
    })");
  ASSERT_TRUE(other.module);
  expr::Program plain = other.program("m");
  auto plainLayout = codegen::layoutVariant(plain, nullptr);
  ASSERT_TRUE(plainLayout.ok());
  ASSERT_EQ(plainLayout.value().divisors.size(), 1u) << "the constant divisor is NVRTC's";
  const codegen::DivisorSlot &wide = plainLayout.value().divisors[0];
  EXPECT_TRUE(wide.wide) << "a numerator read from a tensor may be any 64-bit value";
  EXPECT_EQ(plainLayout.value().sizeBytes, 8 + 24 + wide.sizeBytes());
  const std::string plainSource = codegen::emitVariant("Plain", plainLayout.value(), plain, nullptr);
  EXPECT_NE(plainSource.find("divuiWideBy("), std::string::npos) << plainSource;
  EXPECT_NE(plainSource.find("remui("), std::string::npos) << plainSource;
  auto plainBytes = codegen::packVariant(plainLayout.value(),
                                     {{"t", CaptureValue::ofTensor(nullptr, ScalarType::I64, {3})},
                                      {"n", CaptureValue::ofScalar(Value::ofInt(-3))}},
                                     plain, nullptr);
  ASSERT_TRUE(plainBytes.ok()) << plainBytes.error();
  sem::WideUDivisor divisor;
  std::memcpy(&divisor, plainBytes.value().data() + wide.offsetBytes, sizeof divisor);
  EXPECT_EQ(divisor.divisor, uint64_t(-3));
  for (int64_t a : {int64_t(-1), int64_t(-3), int64_t(-4), INT64_MIN, int64_t(5)})
    EXPECT_EQ(sem::divuiWideBy(a, divisor, 64), sem::divui(a, -3, 64)) << a;
}

TEST(Codegen, LaunchInvariantValuesAreComputedOnTheHost) {
  // The window (a product of captures) and the scale (a log of a size over a
  // captured float) become members the host fills; the score_mod's
  // derivative is the scale itself (d(score)/d(score) = 1 drops out of the
  // product). The kernels keep no multiplication of the captures and no log.
  // The emitted variant against the interpreter:
  // EmittedVariantsMatchTheInterpreter.
  auto loaded = test::LoadedModule::fromFile(std::string(DFLEX_CODEGEN_TEST_DIR) + "/launch_invariants.mlir");
  ASSERT_TRUE(loaded.module);
  expr::Program mask = loaded.program("scaled_window");
  expr::Program scoreMod = loaded.program("log_scaled");
  ASSERT_TRUE(codegen::appendScoreDerivative(scoreMod).ok());
  auto layout = codegen::layoutVariant(mask, &scoreMod);
  ASSERT_TRUE(layout.ok()) << layout.error();
  const codegen::VariantLayout &slots = layout.value();
  ASSERT_EQ(slots.invariants.size(), 2u);
  const codegen::InvariantSlot &window = slots.invariants[0], &scale = slots.invariants[1];
  EXPECT_FALSE(window.inScoreMod);
  EXPECT_FALSE(window.isFloat);
  EXPECT_TRUE(scale.inScoreMod && scale.isFloat);
  EXPECT_EQ(scale.instruction, scoreMod.scoreDerivative);
  ASSERT_EQ(slots.divisors.size(), 2u) << "the bias row and column are remainders by sizes";
  // Mask slots first: its captures, then its invariant; the score_mod's after.
  EXPECT_EQ(window.offsetBytes, 16);
  EXPECT_LT(window.offsetBytes, slots.find("temperature")->offsetBytes);
  EXPECT_EQ(scale.offsetBytes + codegen::InvariantSlot::kSizeBytes, slots.sizeBytes);

  const std::string source = codegen::emitVariant("Invariants", slots, mask, &scoreMod);
  EXPECT_EQ(source.find("logf_("), std::string::npos) << source;
  EXPECT_EQ(source.find("muli("), std::string::npos) << source;
  EXPECT_NE(source.find("slotFloat(" + scale.field + ")"), std::string::npos) << source;
  EXPECT_NE(source.find("return v" + std::to_string(scale.instruction) + ";"), std::string::npos) << source;

  for (const auto &[span, stride, temperature] :
       {std::tuple{int64_t(48), int64_t(3), 0.5f}, std::tuple{int64_t(-5), INT64_MAX, -2.0f}}) {
    std::vector<float> table(6 * 7, 0.0f);
    auto bytes = codegen::packVariant(slots,
                                      {{"span", CaptureValue::ofScalar(Value::ofInt(span))},
                                       {"stride", CaptureValue::ofScalar(Value::ofInt(stride))},
                                       {"temperature", CaptureValue::ofScalar(Value::ofFloat(temperature))},
                                       {"table", CaptureValue::ofTensor(table.data(), ScalarType::F32, {6, 7})}},
                                      mask, &scoreMod);
    ASSERT_TRUE(bytes.ok()) << bytes.error();
    int64_t packedWindow;
    uint32_t packedScale;
    std::memcpy(&packedWindow, bytes.value().data() + window.offsetBytes, 8);
    std::memcpy(&packedScale, bytes.value().data() + scale.offsetBytes, 4);
    EXPECT_EQ(packedWindow, sem::muli(span, stride, 64)) << "the product wraps as on the GPU";
    EXPECT_EQ(packedScale, sem::floatBits(sem::divf(sem::logf_(42.0f, 0), temperature, 0)));
  }
}

TEST(Codegen, WideDivisorsDivideEveryNumeratorExactly) {
  // Unsigned numerators anywhere in 64 bits (a difference that wrapped, a
  // value read from a tensor), divisors at the edges and random, at 64, 32
  // and 8 bits: divuiWideBy, remuiWideBy and ceildivuiWideBy equal divui,
  // remui and ceildivui, the divide-by-zero value included.
  std::mt19937_64 rng(11);
  std::vector<uint64_t> divisors = {0, 1, 2, 3, 5, 7, 10, 255, 256, 641, (1ull << 32) - 1, 1ull << 32,
                                    (1ull << 32) + 1, (1ull << 63) - 1, 1ull << 63, (1ull << 63) + 1,
                                    ~0ull - 1, ~0ull};
  for (int i = 0; i < 2000; ++i)
    divisors.push_back(rng() >> (rng() % 64));
  int64_t checked = 0;
  for (uint64_t d : divisors)
    for (int w : {64, 32, 8}) {
      const int64_t b = sem::wrap(d, w);
      const sem::WideUDivisor divisor = sem::makeWideUDivisor(b, w);
      std::vector<uint64_t> numerators = {0, 1, d - 1, d, d + 1, 2 * d, ~0ull, ~0ull - 1, 1ull << 63,
                                          (1ull << 63) - 1, (1ull << 32) - 1, 1ull << 32};
      for (int k = 0; k < 48; ++k)
        numerators.push_back(rng() >> (rng() % 64));
      for (uint64_t n : numerators) {
        const int64_t a = sem::wrap(n, w);
        ASSERT_EQ(sem::divuiWideBy(a, divisor, w), sem::divui(a, b, w)) << n << " / " << d << " w" << w;
        ASSERT_EQ(sem::remuiWideBy(a, divisor, w), sem::remui(a, b, w)) << n << " % " << d << " w" << w;
        ASSERT_EQ(sem::ceildivuiWideBy(a, divisor, w), sem::ceildivui(a, b, w)) << n << " ceil/ " << d;
        ++checked;
      }
    }
  EXPECT_GT(checked, 300000);
}
