//===- InterpreterTest.cpp - exact semantics of body operations -----------===//

#include "TestUtil.h"
#include "dflex/Expr/Semantics.h"

#include <cmath>
#include <limits>

using namespace dflex;
using expr::CaptureValue;
using expr::ScalarType;
using expr::Value;

namespace {

/// Evaluates a score_mod `@f` whose body is `body`, with scalar captures
/// %x: i32 and %y: i32 and the score %s.
float evalScoreMod(const std::string &body, float score, int32_t x, int32_t y) {
  std::string source =
      "dflex.score_mod @f(%s: f32, %b: index, %h: index, %q: index, %kv: index) "
      "captures(%x: i32, %y: i32) {\n" + body + "\n}\n";
  auto loaded = test::LoadedModule::fromString(source);
  expr::Program program = loaded.program("f");
  std::vector<Value> scratch;
  return expr::evaluateScoreMod(program, score, 0, 0, 0, 0,
                                {CaptureValue::ofScalar(Value::ofInt(x)),
                                 CaptureValue::ofScalar(Value::ofInt(y))},
                                scratch);
}

/// Applies the i32 op `op` to x and y and returns the result as f32.
float intOp(const std::string &op, int32_t x, int32_t y) {
  return evalScoreMod("%r = arith." + op + " %x, %y : i32\n"
                      "%f = arith.sitofp %r : i32 to f32\n"
                      "dflex.yield %f : f32",
                      0.0f, x, y);
}

TEST(Semantics, DivisionByZeroIsZero) {
  for (const char *op : {"divsi", "divui", "remsi", "remui", "ceildivsi",
                         "ceildivui", "floordivsi"})
    EXPECT_EQ(intOp(op, 17, 0), 0.0f) << op;
}

TEST(Semantics, SignedDivisionRounding) {
  EXPECT_EQ(intOp("divsi", -7, 2), -3.0f);
  EXPECT_EQ(intOp("floordivsi", -7, 2), -4.0f);
  EXPECT_EQ(intOp("ceildivsi", 7, 2), 4.0f);
  EXPECT_EQ(intOp("ceildivsi", -7, 2), -3.0f);
  EXPECT_EQ(intOp("remsi", -7, 2), -1.0f);
  EXPECT_EQ(intOp("remui", -1, 10), 5.0f); // 4294967295 % 10
  // The minimum value divided by -1 wraps instead of trapping.
  EXPECT_EQ(intOp("divsi", std::numeric_limits<int32_t>::min(), -1),
            static_cast<float>(std::numeric_limits<int32_t>::min()));
}

TEST(Semantics, WrappingAndShifts) {
  EXPECT_EQ(intOp("addi", std::numeric_limits<int32_t>::max(), 1),
            static_cast<float>(std::numeric_limits<int32_t>::min()));
  EXPECT_EQ(intOp("shli", 1, 31), static_cast<float>(std::numeric_limits<int32_t>::min()));
  EXPECT_EQ(intOp("shli", 1, 32), 0.0f);
  EXPECT_EQ(intOp("shrui", -1, 40), 0.0f);
  EXPECT_EQ(intOp("shrsi", -8, 40), -1.0f);
  EXPECT_EQ(intOp("shrsi", -8, 1), -4.0f);
  EXPECT_EQ(intOp("maxui", -1, 3), -1.0f);
  EXPECT_EQ(intOp("minsi", -1, 3), -1.0f);
}

TEST(Semantics, SaturatingConversions) {
  auto toI32 = [](float s) {
    return evalScoreMod("%i = arith.fptosi %s : f32 to i32\n"
                        "%f = arith.sitofp %i : i32 to f32\n"
                        "dflex.yield %f : f32",
                        s, 0, 0);
  };
  EXPECT_EQ(toI32(1e20f), static_cast<float>(std::numeric_limits<int32_t>::max()));
  EXPECT_EQ(toI32(-1e20f), static_cast<float>(std::numeric_limits<int32_t>::min()));
  EXPECT_EQ(toI32(std::nanf("")), 0.0f);
  EXPECT_EQ(toI32(-2.75f), -2.0f);
}

TEST(Semantics, Bf16AndF16Rounding) {
  auto roundTrip = [](const char *type, float s) {
    return evalScoreMod(std::string("%t = arith.truncf %s : f32 to ") + type +
                            "\n%f = arith.extf %t : " + type +
                            " to f32\ndflex.yield %f : f32",
                        s, 0, 0);
  };
  EXPECT_EQ(roundTrip("bf16", 1.0f + 1.0f / 256.0f), 1.0f);            // tie to even
  EXPECT_EQ(roundTrip("bf16", 1.0f + 3.0f / 256.0f), 1.0f + 4.0f / 256.0f);
  EXPECT_EQ(roundTrip("f16", 1.0f + 1.0f / 2048.0f), 1.0f);            // tie to even
  EXPECT_EQ(roundTrip("f16", 70000.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(roundTrip("f16", 65504.0f), 65504.0f);
  // Every f16 and bf16 value survives a round trip; others land on neighbours.
  for (float f : {0.1f, -3.3f, 1e-6f, 123456.0f, -0.0f})
    for (const char *type : {"bf16", "f16"}) {
      float once = roundTrip(type, f);
      EXPECT_EQ(roundTrip(type, once), once) << type << " " << f;
    }
}

TEST(Semantics, F16RoundingMatchesCompiler) {
#ifdef __FLT16_MAX__
  for (float f : {1e-7f, 3e-8f, 6.1e-5f, 0.3333f, 2049.0f, 65519.0f, 65520.0f, -7.77e-6f})
    EXPECT_EQ(sem::roundF16(f), static_cast<float>(static_cast<_Float16>(f))) << f;
#else
  GTEST_SKIP() << "no _Float16 in this compiler";
#endif
}

TEST(Semantics, FloatComparisonsAndNaN) {
  auto compare = [](const char *predicate, float s, float other) {
    return evalScoreMod(std::string("%c = arith.constant ") + std::to_string(other) +
                            " : f32\n%r = arith.cmpf " + predicate +
                            ", %s, %c : f32\n%z = arith.constant 0.0 : f32\n"
                            "%o = arith.constant 1.0 : f32\n"
                            "%f = arith.select %r, %o, %z : f32\ndflex.yield %f : f32",
                        s, 0, 0);
  };
  float nan = std::nanf("");
  EXPECT_EQ(compare("olt", 1.0f, 2.0f), 1.0f);
  EXPECT_EQ(compare("olt", nan, 2.0f), 0.0f);
  EXPECT_EQ(compare("ult", nan, 2.0f), 1.0f);
  EXPECT_EQ(compare("uno", nan, 2.0f), 1.0f);
  EXPECT_EQ(compare("one", 2.0f, 2.0f), 0.0f);
  auto maxOf = [&](const char *op, float s) {
    return evalScoreMod(std::string("%c = arith.constant 1.0 : f32\n%r = arith.") + op +
                            " %s, %c : f32\ndflex.yield %r : f32",
                        s, 0, 0);
  };
  EXPECT_TRUE(std::isnan(maxOf("maximumf", nan)));
  EXPECT_EQ(maxOf("maxnumf", nan), 1.0f);
}

TEST(Semantics, OutOfRangeReadsYieldPadding) {
  auto loaded = test::LoadedModule::fromString(R"(
    dflex.mask @m(%b: index, %h: index, %q: index, %kv: index)
        captures(%t: tensor<?x?xi64>) {
      %v = dflex.read %t[%q, %kv] padding 7 : tensor<?x?xi64>
      %seven = arith.constant 7 : i64
      %is_padding = arith.cmpi eq, %v, %seven : i64
      dflex.yield %is_padding : i1
    })");
  expr::Program program = loaded.program("m");
  std::vector<int64_t> data = {1, 2, 3, 4, 5, 6}; // 2 x 3
  std::vector<CaptureValue> captures{CaptureValue::ofTensor(data.data(), ScalarType::I64, {2, 3})};
  std::vector<Value> scratch;
  for (int64_t q = 0; q < 4; ++q)
    for (int64_t kv = 0; kv < 5; ++kv)
      EXPECT_EQ(expr::evaluateMask(program, 0, 0, q, kv, captures, scratch), q >= 2 || kv >= 3)
          << q << "," << kv;
  // A negative index (reachable through index arithmetic) is out of range too.
  auto negative = test::LoadedModule::fromString(R"(
    dflex.mask @m(%b: index, %h: index, %q: index, %kv: index)
        captures(%t: tensor<?xi32>) {
      %d = arith.subi %q, %kv : index
      %v = dflex.read %t[%d] padding -5 : tensor<?xi32>
      %c = arith.constant -5 : i32
      %r = arith.cmpi eq, %v, %c : i32
      dflex.yield %r : i1
    })");
  expr::Program negativeProgram = negative.program("m");
  std::vector<int32_t> small = {10, 20, 30};
  std::vector<CaptureValue> smallCaptures{CaptureValue::ofTensor(small.data(), ScalarType::I32, {3})};
  EXPECT_TRUE(expr::evaluateMask(negativeProgram, 0, 0, 1, 2, smallCaptures, scratch));
  EXPECT_FALSE(expr::evaluateMask(negativeProgram, 0, 0, 2, 1, smallCaptures, scratch));
}

TEST(Semantics, CallsAreInlined) {
  auto loaded = test::LoadedModule::fromString(test::kCallingMasks);
  expr::Program program = loaded.program("outer");
  std::vector<Value> scratch;
  std::vector<CaptureValue> captures{CaptureValue::ofScalar(Value::ofInt(3))};
  for (int64_t q = 0; q < 10; ++q)
    for (int64_t kv = 0; kv < 10; ++kv)
      EXPECT_EQ(expr::evaluateMask(program, 0, 0, q, kv, captures, scratch),
                q >= kv && q - kv < 3);
}

TEST(Semantics, CaptureChecks) {
  auto loaded = test::LoadedModule::fromFile(std::string(DFLEX_EXAMPLES_DIR) + "/dflash.mlir");
  expr::Program program = loaded.program("dflash");
  std::vector<int64_t> wrongType(4);
  std::vector<int32_t> starts(4);
  std::string error = expr::checkCaptures(
      program, {CaptureValue::ofTensor(wrongType.data(), ScalarType::I64, {2, 2}),
                CaptureValue::ofTensor(starts.data(), ScalarType::I32, {2, 2}),
                CaptureValue::ofScalar(Value::ofInt(1))});
  EXPECT_NE(error.find("'anchors' must hold i32"), std::string::npos) << error;
  error = expr::checkCaptures(program, {});
  EXPECT_NE(error.find("takes 3 captures"), std::string::npos) << error;
}

} // namespace
