#include "dflex/Support/InputLimits.h"

#include <gtest/gtest.h>

#include <string>

using namespace dflex;

namespace {

TEST(InputLimits, AcceptsOrdinaryInput) {
  EXPECT_FALSE(checkInputLimits("dflex.mask @m(%b: index) {\n  %c = arith.constant 12 : index\n}\n"));
}

TEST(InputLimits, LocatesTheFirstBracketPastTheDepth) {
  std::string text = "x\n" + std::string(4, '(');
  auto problem = checkInputLimits(text, 3);
  ASSERT_TRUE(problem);
  EXPECT_EQ(problem->line, 2);
  EXPECT_EQ(problem->column, 4);
  EXPECT_EQ(problem->message, "brackets nest deeper than 3 levels");
  EXPECT_FALSE(checkInputLimits("((()))(((", 3));
}

TEST(InputLimits, AngleBracketsOpenOnlyAfterANameAndArrowsCloseNothing) {
  EXPECT_FALSE(checkInputLimits("a < b < c < d", 2));
  EXPECT_TRUE(checkInputLimits("tensor<tensor<tensor<", 2));
  // "->" must not close the level "tensor<" opened.
  EXPECT_TRUE(checkInputLimits("tensor<(-> (", 2));
}

TEST(InputLimits, SkipsStringsAndComments) {
  EXPECT_FALSE(checkInputLimits("\"((((\\\"((((\" // ((((((\n", 2));
  EXPECT_TRUE(checkInputLimits("// (((\n(((", 2));
}

TEST(InputLimits, RejectsOverlongNumbers) {
  std::string text = "%c = arith.constant " + std::string(kMaxNumberLength + 1, '7');
  auto problem = checkInputLimits(text);
  ASSERT_TRUE(problem);
  EXPECT_EQ(problem->line, 1);
  EXPECT_EQ(problem->column, 21);
  EXPECT_FALSE(checkInputLimits(std::string(kMaxNumberLength, '7')));
  // Digits inside a name are no number literal.
  EXPECT_FALSE(checkInputLimits("%x" + std::string(kMaxNumberLength + 1, '7')));
}

} // namespace
