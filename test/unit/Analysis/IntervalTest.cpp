//===- IntervalTest.cpp - soundness of the interval rules -----------------===//
//
// Each integer rule is checked against the interpreter: for random operand
// ranges (many at the edges of the type: zero, -1, the minimum and maximum),
// every concrete choice of operands in the ranges must give a result inside
// the abstract result, and single points must give the exact result. Named
// tests pin the tricky cases.
//
//===----------------------------------------------------------------------===//

#include "../RandomMasks.h"
#include "../ProgramBuilder.h"
#include "MakeEvaluator.h"
#include "dflex/Expr/Semantics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

using namespace dflex;
using analysis::AbstractValue;
using analysis::Box;
using analysis::IntervalEvaluator;
using analysis::IntRange;
using analysis::Truth;
using expr::CaptureValue;
using expr::Instruction;
using expr::Opcode;
using expr::ScalarType;

namespace {

using Builder = test::ProgramBuilder;
using test::intType;

std::unique_ptr<IntervalEvaluator> make(const expr::Program &program,
                                        const std::vector<CaptureValue> &captures = {}) {
  return test::makeEvaluator(program, captures);
}

AbstractValue range(int64_t lo, int64_t hi) { return AbstractValue::ofRange(lo, hi); }

/// The abstract result of `program` with q and kv in the given ranges.
AbstractValue abstractResult(IntervalEvaluator &evaluator, AbstractValue q, AbstractValue kv) {
  AbstractValue leading[4] = {range(0, 0), range(0, 0), q, kv};
  return evaluator.evaluate(leading);
}

int64_t concreteResult(const expr::Program &program, int64_t q, int64_t kv,
                       const std::vector<CaptureValue> &captures = {}) {
  std::vector<expr::Value> scratch;
  expr::Value leading[4] = {expr::Value::ofInt(0), expr::Value::ofInt(0),
                            expr::Value::ofInt(q), expr::Value::ofInt(kv)};
  return expr::evaluate(program, leading, captures, scratch).i;
}

/// The values of a (small) range, without overflowing at its end.
std::vector<int64_t> values(const AbstractValue &v) {
  std::vector<int64_t> out;
  for (int64_t k = 0; k <= v.hi - v.lo; ++k)
    out.push_back(v.lo + k);
  return out;
}

int64_t minOf(int w) { return sem::minSigned(w); }
int64_t maxOf(int w) { return w == 64 ? INT64_MAX : (int64_t{1} << (w - 1)) - 1; }

/// A random range of at most `span` + 1 values of width w, often at an edge.
AbstractValue randomRange(std::mt19937_64 &rng, int w, int64_t span) {
  const int64_t edges[] = {0, -1, 1, 2, -2, minOf(w), maxOf(w), minOf(w) / 2, maxOf(w) / 2};
  int choice = std::uniform_int_distribution<int>(0, 11)(rng);
  int64_t center = choice < 9 ? edges[choice] : sem::wrap(rng(), w);
  int64_t length = std::uniform_int_distribution<int>(0, 5)(rng) == 0
                       ? 0
                       : std::uniform_int_distribution<int64_t>(0, span)(rng);
  __int128 lo = static_cast<__int128>(center) -
                std::uniform_int_distribution<int64_t>(0, length)(rng);
  lo = std::max<__int128>(lo, minOf(w));
  lo = std::min<__int128>(lo, static_cast<__int128>(maxOf(w)) - length);
  return range(static_cast<int64_t>(lo), static_cast<int64_t>(lo) + length);
}

/// Checks a binary integer op of width w over many random range pairs.
void checkBinary(Opcode op, int w, ScalarType resultType, int64_t predicate = 0) {
  Builder builder;
  int32_t a = builder.argument(2, w), b = builder.argument(3, w);
  builder.add(op, resultType, {a, b}, predicate, w);
  auto evaluator = make(builder.program);
  std::mt19937_64 rng(static_cast<uint64_t>(op) * 131 + w * 7 + predicate);
  const int64_t span = w == 1 ? 1 : 12;
  for (int trial = 0; trial < 1500; ++trial) {
    AbstractValue x = randomRange(rng, w, span), y = randomRange(rng, w, span);
    AbstractValue got = abstractResult(*evaluator, x, y);
    ASSERT_LE(got.lo, got.hi);
    for (int64_t i : values(x))
      for (int64_t j : values(y)) {
        int64_t exact = concreteResult(builder.program, i, j);
        ASSERT_TRUE(got.lo <= exact && exact <= got.hi)
            << expr::toString(op) << " i" << w << " pred " << predicate << ": [" << x.lo
            << ", " << x.hi << "] op [" << y.lo << ", " << y.hi << "] gave [" << got.lo
            << ", " << got.hi << "] but " << i << " op " << j << " = " << exact;
        if (x.lo == x.hi && y.lo == y.hi)
          ASSERT_EQ(got.lo, got.hi) << expr::toString(op) << " is not exact on points";
      }
  }
}

const Opcode kBinaryOps[] = {
    Opcode::AddI,  Opcode::SubI,  Opcode::MulI,      Opcode::DivSI,      Opcode::DivUI,
    Opcode::CeilDivSI, Opcode::CeilDivUI, Opcode::FloorDivSI, Opcode::RemSI, Opcode::RemUI,
    Opcode::MaxSI, Opcode::MinSI, Opcode::MaxUI,     Opcode::MinUI,      Opcode::AndI,
    Opcode::OrI,   Opcode::XOrI,  Opcode::ShLI,      Opcode::ShRSI,      Opcode::ShRUI};

TEST(IntervalRules, BinaryOpsAreSound) {
  for (int w : {8, 16, 32, 64})
    for (Opcode op : kBinaryOps)
      checkBinary(op, w, intType(w));
  for (Opcode op : {Opcode::AndI, Opcode::OrI, Opcode::XOrI})
    checkBinary(op, 1, ScalarType::I1);
}

TEST(IntervalRules, ComparisonsAreSound) {
  for (int w : {1, 8, 32, 64})
    for (int predicate = sem::EQ; predicate <= sem::UGE; ++predicate)
      checkBinary(Opcode::CmpI, w, ScalarType::I1, predicate);
}

TEST(IntervalRules, ShiftsByRangesAreSound) {
  // Shift amounts around the width, as ranges.
  for (int w : {8, 32})
    for (Opcode op : {Opcode::ShLI, Opcode::ShRSI, Opcode::ShRUI}) {
      Builder builder;
      int32_t a = builder.argument(2, w), b = builder.argument(3, w);
      builder.add(op, intType(w), {a, b});
      auto evaluator = make(builder.program);
      std::mt19937_64 rng(w + static_cast<int>(op));
      for (int trial = 0; trial < 500; ++trial) {
        AbstractValue x = randomRange(rng, w, 10);
        int64_t s = std::uniform_int_distribution<int64_t>(-2, w + 2)(rng);
        AbstractValue y = range(s, s + std::uniform_int_distribution<int64_t>(0, 4)(rng));
        AbstractValue got = abstractResult(*evaluator, x, y);
        for (int64_t i : values(x))
          for (int64_t j : values(y)) {
            int64_t exact = concreteResult(builder.program, i, j);
            ASSERT_TRUE(got.lo <= exact && exact <= got.hi)
                << expr::toString(op) << " " << i << " by " << j;
          }
      }
    }
}

TEST(IntervalRules, UnaryConversionsAreSound) {
  struct Case {
    Opcode op;
    int from, to;
  };
  const Case cases[] = {{Opcode::AbsI, 8, 8},        {Opcode::AbsI, 64, 64},
                        {Opcode::ExtSI, 8, 32},      {Opcode::ExtUI, 8, 32},
                        {Opcode::ExtUI, 1, 8},       {Opcode::ExtSI, 1, 64},
                        {Opcode::TruncI, 32, 8},     {Opcode::TruncI, 64, 16},
                        {Opcode::IndexCast, 64, 32}, {Opcode::IndexCastUI, 32, 64},
                        {Opcode::IndexCastUI, 64, 32}};
  for (const Case &c : cases) {
    Builder builder;
    int32_t a = builder.argument(2, c.from);
    builder.add(c.op, intType(c.to), {a}, 0, c.from);
    auto evaluator = make(builder.program);
    std::mt19937_64 rng(c.from * 100 + c.to + static_cast<int>(c.op));
    for (int trial = 0; trial < 2000; ++trial) {
      AbstractValue x = randomRange(rng, c.from, c.from == 1 ? 1 : 40);
      AbstractValue got = abstractResult(*evaluator, x, range(0, 0));
      for (int64_t i : values(x)) {
        int64_t exact = concreteResult(builder.program, i, 0);
        ASSERT_TRUE(got.lo <= exact && exact <= got.hi)
            << expr::toString(c.op) << " i" << c.from << " -> i" << c.to << " of " << i
            << " in [" << x.lo << ", " << x.hi << "] gave [" << got.lo << ", " << got.hi << "]";
        if (x.lo == x.hi)
          ASSERT_EQ(got.lo, got.hi);
      }
    }
  }
}

//===--- Named cases ------------------------------------------------------===//

/// `op(q, kv)` at width w, evaluated over the given ranges.
AbstractValue apply(Opcode op, int w, AbstractValue a, AbstractValue b, int64_t imm = 0) {
  Builder builder;
  int32_t x = builder.argument(2, w), y = builder.argument(3, w);
  builder.add(op, op == Opcode::CmpI ? ScalarType::I1 : intType(w), {x, y}, imm, w);
  auto evaluator = make(builder.program);
  return abstractResult(*evaluator, a, b);
}

void expectRange(AbstractValue v, int64_t lo, int64_t hi) {
  EXPECT_EQ(v.lo, lo);
  EXPECT_EQ(v.hi, hi);
}

TEST(IntervalRules, Wrapping) {
  // Entirely past the maximum: the wrapped range is exact.
  expectRange(apply(Opcode::AddI, 8, range(120, 127), range(10, 10)), -126, -119);
  // Straddling the wrap-around point: anything.
  expectRange(apply(Opcode::AddI, 8, range(100, 120), range(10, 10)), -128, 127);
  expectRange(apply(Opcode::MulI, 64, range(1, 2), range(INT64_MAX / 2 + 1, INT64_MAX / 2 + 1)),
              INT64_MIN, INT64_MAX);
  expectRange(apply(Opcode::SubI, 32, range(-5, 5), range(1, 1)), -6, 4);
  // index arithmetic near 2^63 wraps like the hardware.
  expectRange(apply(Opcode::AddI, 64, range(INT64_MAX, INT64_MAX), range(1, 1)), INT64_MIN,
              INT64_MIN);
}

TEST(IntervalRules, DivisionByRangesHoldingZero) {
  // x / 0 == 0, so a divisor range through zero adds 0 and both signs.
  expectRange(apply(Opcode::DivSI, 32, range(10, 20), range(-2, 2)), -20, 20);
  expectRange(apply(Opcode::DivUI, 32, range(10, 20), range(0, 4)), 0, 20);
  expectRange(apply(Opcode::DivUI, 32, range(10, 20), range(0, 0)), 0, 0);
  expectRange(apply(Opcode::RemUI, 32, range(10, 20), range(0, 0)), 0, 0);
  // The minimum divided by -1 wraps to itself.
  expectRange(apply(Opcode::DivSI, 8, range(-128, -128), range(-1, -1)), -128, -128);
  expectRange(apply(Opcode::DivSI, 8, range(-128, -127), range(-1, -1)), -128, 127);
  expectRange(apply(Opcode::FloorDivSI, 32, range(-7, -7), range(2, 2)), -4, -4);
  expectRange(apply(Opcode::CeilDivSI, 32, range(-7, 7), range(2, 2)), -3, 4);
}

TEST(IntervalRules, Remainders) {
  // Small dividends are their own remainder; one period maps exactly.
  expectRange(apply(Opcode::RemSI, 32, range(3, 5), range(7, 9)), 3, 5);
  expectRange(apply(Opcode::RemUI, 64, range(17, 19), range(8, 8)), 1, 3);
  expectRange(apply(Opcode::RemSI, 32, range(-19, -17), range(8, 8)), -3, -1);
  expectRange(apply(Opcode::RemUI, 64, range(0, 100), range(8, 8)), 0, 7);
}

TEST(IntervalRules, UnsignedComparisonsOfMixedSignRanges) {
  // -1 is the largest unsigned value: [-1, 5] < 10 can go either way.
  EXPECT_EQ(apply(Opcode::CmpI, 64, range(-1, 5), range(10, 10), sem::ULT).truth(), Truth::Both);
  EXPECT_EQ(apply(Opcode::CmpI, 64, range(-3, -1), range(10, 10), sem::ULT).truth(), Truth::False);
  EXPECT_EQ(apply(Opcode::CmpI, 64, range(0, 5), range(10, 10), sem::ULT).truth(), Truth::True);
  EXPECT_EQ(apply(Opcode::CmpI, 64, range(-3, -1), range(10, 10), sem::SLT).truth(), Truth::True);
  // Both pieces of a mixed-sign range agree: the answer is still exact.
  EXPECT_EQ(apply(Opcode::CmpI, 8, range(-1, 5), range(-2, -2), sem::UGE).truth(), Truth::Both);
  EXPECT_EQ(apply(Opcode::CmpI, 8, range(-1, 5), range(-1, -1), sem::ULE).truth(), Truth::True);
  // divui of a mixed-sign dividend: 0..5 and (2^8 - 1) / 2.
  expectRange(apply(Opcode::DivUI, 8, range(-1, 5), range(2, 2)), 0, 127);
}

TEST(IntervalRules, ThreeValuedLogic) {
  Builder builder;
  int32_t q = builder.argument(2, 64), kv = builder.argument(3, 64);
  int32_t ge = builder.add(Opcode::CmpI, ScalarType::I1, {q, kv}, sem::UGE, 64);
  int32_t c = builder.add(Opcode::Constant, ScalarType::Index, {}, 5);
  int32_t small = builder.add(Opcode::CmpI, ScalarType::I1, {q, c}, sem::SLT, 64);
  int32_t both = builder.add(Opcode::AndI, ScalarType::I1, {ge, small});
  int32_t one = builder.add(Opcode::Constant, ScalarType::Index, {}, 1);
  int32_t two = builder.add(Opcode::Constant, ScalarType::Index, {}, 2);
  builder.add(Opcode::Select, ScalarType::Index, {both, one, two});
  auto evaluator = make(builder.program);
  // q in [10, 20] is never < 5: the and is false whatever the comparison.
  expectRange(abstractResult(*evaluator, range(10, 20), range(0, 100)), 2, 2);
  expectRange(abstractResult(*evaluator, range(0, 4), range(0, 0)), 1, 1);
  expectRange(abstractResult(*evaluator, range(0, 4), range(0, 3)), 1, 2);
}

//===--- Reads ------------------------------------------------------------===//

/// read %t[b, kv] of an i32 tensor (padding `padding` when given).
expr::Program readProgram(bool withPadding, int32_t padding) {
  Builder builder;
  builder.program.captures.push_back({"t", true, ScalarType::I32, 2});
  int32_t b = builder.add(Opcode::Argument, ScalarType::Index, {}, 0);
  int32_t kv = builder.add(Opcode::Argument, ScalarType::Index, {}, 3);
  builder.add(Opcode::Read, ScalarType::I32, {b, kv}, 0);
  builder.program.instructions.back().hasPadding = withPadding;
  builder.program.instructions.back().paddingInt = padding;
  return builder.program;
}

TEST(IntervalReads, OutOfRangeAddsPadding) {
  std::vector<int32_t> data = {5, 6, 7, 8, 9, 50, 60, 70, 80, 90};
  std::vector<CaptureValue> captures{CaptureValue::ofTensor(data.data(), ScalarType::I32, {2, 5})};
  for (bool withPadding : {false, true}) {
    auto evaluator = make(readProgram(withPadding, -100), captures);
    int64_t padding = withPadding ? -100 : 0;
    AbstractValue leading[4] = {range(0, 0), range(0, 0), range(0, 0), range(3, 7)};
    AbstractValue v = evaluator->evaluate(leading);
    EXPECT_EQ(v.lo, std::min<int64_t>(padding, 8));
    EXPECT_EQ(v.hi, 9);
    leading[3] = range(-4, -1); // entirely out of range: the padding only
    v = evaluator->evaluate(leading);
    expectRange(v, padding, padding);
    leading[0] = range(1, 1);
    leading[3] = range(1, 3);
    expectRange(evaluator->evaluate(leading), 60, 80);
    leading[0] = range(0, 1); // two rows
    expectRange(evaluator->evaluate(leading), 6, 80);
    leading[0] = range(2, 9); // no such batch
    expectRange(evaluator->evaluate(leading), padding, padding);
  }
}

/// Random rows of each shape the summary handles, random index boxes, against
/// a scan of the tensor.
TEST(IntervalReads, RangeQueriesMatchScans) {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 60; ++trial) {
    int64_t rows = std::uniform_int_distribution<int64_t>(1, 4)(rng);
    int64_t length = std::uniform_int_distribution<int64_t>(0, 700)(rng);
    std::vector<int32_t> data(rows * length + 1); // never empty: a tensor needs data
    int shape = trial % 4;
    for (int64_t r = 0; r < rows; ++r) {
      int32_t *row = data.data() + r * length;
      for (int64_t i = 0; i < length; ++i)
        row[i] = std::uniform_int_distribution<int32_t>(-1000, 1000)(rng);
      if (shape == 1) // sorted
        std::sort(row, row + length);
      if (shape == 2) { // sorted, then padding
        std::sort(row, row + length);
        for (int64_t i = length * 3 / 4; i < length; ++i)
          row[i] = -1;
      }
      if (shape == 3) // descending then ascending
        std::sort(row, row + length / 2, std::greater<int32_t>());
    }
    std::vector<CaptureValue> captures{
        CaptureValue::ofTensor(data.data(), ScalarType::I32, {rows, length})};
    auto evaluator = make(readProgram(true, 12345), captures);
    for (int query = 0; query < 300; ++query) {
      int64_t b0 = std::uniform_int_distribution<int64_t>(0, rows - 1)(rng);
      int64_t b1 = std::uniform_int_distribution<int64_t>(b0, rows)(rng);
      int64_t k0 = std::uniform_int_distribution<int64_t>(-3, length + 2)(rng);
      int64_t k1 = k0 + std::uniform_int_distribution<int64_t>(0, 300)(rng);
      AbstractValue leading[4] = {range(b0, b1), range(0, 0), range(0, 0), range(k0, k1)};
      AbstractValue v = evaluator->evaluate(leading);
      int64_t lo = INT64_MAX, hi = INT64_MIN;
      for (int64_t b = b0; b <= b1; ++b)
        for (int64_t k = k0; k <= k1; ++k) {
          bool in = b < rows && k >= 0 && k < length;
          int64_t value = in ? data[b * length + k] : 12345;
          lo = std::min(lo, value);
          hi = std::max(hi, value);
        }
      ASSERT_EQ(v.lo, lo) << "trial " << trial << " b [" << b0 << ", " << b1 << "] kv [" << k0
                          << ", " << k1 << "]";
      ASSERT_EQ(v.hi, hi);
    }
  }
}

TEST(IntervalReads, StridedTensor) {
  // A transposed view: element [i, j] at offset j * 3 + i.
  std::vector<int64_t> data = {0, 1, 2, 10, 11, 12};
  CaptureValue tensor;
  tensor.data = data.data();
  tensor.elementType = ScalarType::I64;
  tensor.sizes = {3, 2};
  tensor.strides = {1, 3};
  Builder builder;
  builder.program.captures.push_back({"t", true, ScalarType::I64, 2});
  int32_t b = builder.add(Opcode::Argument, ScalarType::Index, {}, 0);
  int32_t kv = builder.add(Opcode::Argument, ScalarType::Index, {}, 3);
  builder.add(Opcode::Read, ScalarType::I64, {b, kv}, 0);
  auto evaluator = make(builder.program, {tensor});
  AbstractValue leading[4] = {range(2, 2), range(0, 0), range(0, 0), range(0, 1)};
  expectRange(evaluator->evaluate(leading), 2, 12);
}

//===--- Floats -----------------------------------------------------------===//

TEST(IntervalFloats, ExactOnPointsUnknownOtherwise) {
  Builder builder;
  int32_t q = builder.add(Opcode::Argument, ScalarType::Index, {}, 2);
  int32_t f = builder.add(Opcode::SIToFP, ScalarType::F32, {q});
  int32_t half = builder.add(Opcode::Constant, ScalarType::F32);
  builder.program.instructions[half].fimm = 0.5f;
  int32_t scaled = builder.add(Opcode::MulF, ScalarType::F32, {f, half});
  int32_t limit = builder.add(Opcode::Constant, ScalarType::F32);
  builder.program.instructions[limit].fimm = 3.0f;
  builder.add(Opcode::CmpF, ScalarType::I1, {scaled, limit}, sem::OLT);
  auto evaluator = make(builder.program);
  EXPECT_EQ(evaluator->evaluateMask(Box{{0, 0}, {0, 0}, {5, 5}, {0, 9}}), Truth::True);
  EXPECT_EQ(evaluator->evaluateMask(Box{{0, 0}, {0, 0}, {6, 6}, {0, 9}}), Truth::False);
  EXPECT_EQ(evaluator->evaluateMask(Box{{0, 0}, {0, 0}, {0, 1}, {0, 9}}), Truth::Both);
  EXPECT_TRUE(evaluator->dependencies().floatArithmetic);
}

TEST(IntervalFloats, PlatformMathIsNeverExact) {
  // exp may differ by an ulp between CPU and GPU: no proof rests on it.
  Builder builder;
  int32_t zero = builder.add(Opcode::Constant, ScalarType::F32);
  int32_t e = builder.add(Opcode::Exp, ScalarType::F32, {zero});
  int32_t one = builder.add(Opcode::Constant, ScalarType::F32);
  builder.program.instructions[one].fimm = 1.0f;
  builder.add(Opcode::CmpF, ScalarType::I1, {e, one}, sem::OEQ);
  auto evaluator = make(builder.program);
  EXPECT_EQ(evaluator->evaluateMask(Box{}), Truth::Both);
}

//===--- Staging, dependencies, errors -------------------------------------===//

TEST(IntervalEvaluator, StagedEvaluationMatchesWholeEvaluation) {
  // (q / 4 == kv / 4) && b < 1
  Builder builder;
  int32_t b = builder.add(Opcode::Argument, ScalarType::Index, {}, 0);
  int32_t q = builder.add(Opcode::Argument, ScalarType::Index, {}, 2);
  int32_t kv = builder.add(Opcode::Argument, ScalarType::Index, {}, 3);
  int32_t four = builder.add(Opcode::Constant, ScalarType::Index, {}, 4);
  int32_t one = builder.add(Opcode::Constant, ScalarType::Index, {}, 1);
  int32_t qb = builder.add(Opcode::DivUI, ScalarType::Index, {q, four});
  int32_t kb = builder.add(Opcode::DivUI, ScalarType::Index, {kv, four});
  int32_t same = builder.add(Opcode::CmpI, ScalarType::I1, {qb, kb}, sem::EQ, 64);
  int32_t first = builder.add(Opcode::CmpI, ScalarType::I1, {b, one}, sem::SLT, 64);
  builder.add(Opcode::AndI, ScalarType::I1, {same, first});
  auto evaluator = make(builder.program);
  EXPECT_TRUE(evaluator->dependsOn(analysis::MaskArgument::Batch));
  EXPECT_FALSE(evaluator->dependsOn(analysis::MaskArgument::Head));
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    auto r = [&](int64_t n) {
      int64_t lo = std::uniform_int_distribution<int64_t>(0, n)(rng);
      return IntRange{lo, lo + std::uniform_int_distribution<int64_t>(0, 6)(rng)};
    };
    Box box{r(2), {0, 0}, r(20), r(20)};
    Truth whole = evaluator->evaluateMask(box);
    evaluator->fix(box, analysis::MaskArgument::Key);
    ASSERT_EQ(evaluator->evaluateVarying(box.kv), whole);
    evaluator->fix(box, analysis::MaskArgument::Query);
    ASSERT_EQ(evaluator->evaluateVarying(box.q), whole);
  }
}

TEST(IntervalEvaluator, RandomMasksAreClassifiedSoundly) {
  // A box judged false (true) everywhere must be false (true) at every pair
  // in it, through the whole evaluation and the staged one the tile lists
  // use, for random bodies and captures; and enough boxes must be decided
  // for the test to mean something.
  std::mt19937_64 rng(11);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  int decided = 0, boxes = 0;
  for (int seed = 0; seed < test::kRandomMasks; ++seed) {
    SCOPED_TRACE("random mask " + std::to_string(seed));
    const expr::Program mask = test::randomMask(seed);
    for (int round = 0; round < 3; ++round) {
      const int64_t rows = uniform(1, 12), columns = uniform(1, 12);
      std::vector<int32_t> t(uniform(1, 40)), u(rows * columns);
      for (std::vector<int32_t> *tensor : {&t, &u})
        for (int32_t &value : *tensor)
          value = static_cast<int32_t>(uniform(-3, 300));
      const std::vector<CaptureValue> captures = {
          CaptureValue::ofScalar(expr::Value::ofInt(uniform(0, 50))),
          CaptureValue::ofTensor(t.data(), ScalarType::I32, {int64_t(t.size())}),
          CaptureValue::ofTensor(u.data(), ScalarType::I32, {rows, columns})};
      auto evaluator = make(mask, captures);
      std::vector<expr::Value> scratch;
      for (int trial = 0; trial < 40; ++trial) {
        auto span = [&](int64_t limit, int64_t width) {
          const int64_t lo = uniform(0, limit);
          return IntRange{lo, lo + uniform(0, width)};
        };
        const Box box{span(3, 1), span(7, 1), span(600, 20), span(800, 20)};
        const Truth whole = evaluator->evaluateMask(box);
        evaluator->fix(box, analysis::MaskArgument::Key);
        const Truth staged = evaluator->evaluateVarying(box.kv);
        ++boxes;
        decided += whole != Truth::Both;
        for (int64_t b = box.b.lo; b <= box.b.hi; ++b)
          for (int64_t h = box.h.lo; h <= box.h.hi; ++h)
            for (int64_t q = box.q.lo; q <= box.q.hi; ++q)
              for (int64_t kv = box.kv.lo; kv <= box.kv.hi; ++kv) {
                const bool visible = expr::evaluateMask(mask, b, h, q, kv, captures, scratch);
                for (Truth truth : {whole, staged})
                  ASSERT_TRUE(truth == Truth::Both || visible == (truth == Truth::True))
                      << toString(truth) << " at b " << b << " h " << h << " q " << q << " kv " << kv;
              }
      }
    }
  }
  EXPECT_GT(decided, boxes / 5) << decided << " of " << boxes << " boxes decided";
}

TEST(IntervalEvaluator, DependenciesFollowLiveValuesOnly) {
  Builder builder;
  builder.program.captures.push_back({"unused", false, ScalarType::Index, 0});
  builder.program.captures.push_back({"limit", false, ScalarType::Index, 0});
  builder.add(Opcode::Argument, ScalarType::Index, {}, 0); // b, dead
  builder.add(Opcode::Capture, ScalarType::Index, {}, 0);  // dead
  int32_t q = builder.add(Opcode::Argument, ScalarType::Index, {}, 2);
  int32_t limit = builder.add(Opcode::Capture, ScalarType::Index, {}, 1);
  builder.add(Opcode::CmpI, ScalarType::I1, {q, limit}, sem::SLT, 64);
  analysis::Dependencies deps = analysis::computeDependencies(builder.program);
  EXPECT_EQ(deps.leading, (std::vector<bool>{false, false, true, false}));
  EXPECT_EQ(deps.captures, (std::vector<bool>{false, true}));
  EXPECT_FALSE(deps.floatArithmetic);
}

TEST(IntervalEvaluator, RebindSeesNewCapturesOrKeepsTheOld) {
  std::vector<int32_t> first = {5, 6, 7, 8, 9, 50, 60, 70, 80, 90};
  std::vector<int32_t> second = {-3, -2, -1, 0, 1};
  auto evaluator = make(readProgram(false, 0),
                        {CaptureValue::ofTensor(first.data(), ScalarType::I32, {2, 5})});
  AbstractValue leading[4] = {range(1, 1), range(0, 0), range(0, 0), range(1, 3)};
  expectRange(evaluator->evaluate(leading), 60, 80);
  // A different shape and values: summaries and constants follow them.
  ASSERT_EQ(evaluator->rebind({CaptureValue::ofTensor(second.data(), ScalarType::I32, {1, 5})}), "");
  leading[0] = range(0, 0);
  expectRange(evaluator->evaluate(leading), -2, 0);
  leading[0] = range(1, 1); // no such row any more: zero (no padding given)
  expectRange(evaluator->evaluate(leading), 0, 0);
  // Captures that do not fit are refused; the evaluator keeps the last ones.
  const std::string problem = evaluator->rebind({CaptureValue::ofTensor(nullptr, ScalarType::I32, {1, 5})});
  EXPECT_NE(problem.find("capture 't' has no data"), std::string::npos) << problem;
  leading[0] = range(0, 0);
  expectRange(evaluator->evaluate(leading), -2, 0);
}

TEST(IntervalEvaluator, RejectsMalformedInput) {
  Builder builder;
  builder.add(Opcode::Argument, ScalarType::Index, {}, 2);
  builder.add(Opcode::AddI, ScalarType::Index, {0, 5});
  auto bad = IntervalEvaluator::create(builder.program, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error.find("operand 5"), std::string::npos) << bad.error;

  expr::Program reads = readProgram(false, 0);
  auto noCaptures = IntervalEvaluator::create(reads, {});
  ASSERT_FALSE(noCaptures.ok());
  EXPECT_NE(noCaptures.error.find("captures"), std::string::npos) << noCaptures.error;

  Builder scalar;
  scalar.program.captures.push_back({"n", false, ScalarType::I32, 0});
  scalar.add(Opcode::Capture, ScalarType::I32, {}, 0);
  auto tooBig = IntervalEvaluator::create(
      scalar.program, {CaptureValue::ofScalar(expr::Value::ofInt(int64_t{1} << 40))});
  ASSERT_FALSE(tooBig.ok());
  EXPECT_NE(tooBig.error.find("out of range for i32"), std::string::npos) << tooBig.error;
}

} // namespace
