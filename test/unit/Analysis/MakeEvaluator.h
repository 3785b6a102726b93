//===- MakeEvaluator.h - interval evaluators for analysis tests -*- C++ -*-===//

#ifndef DFLEX_TEST_ANALYSIS_MAKEEVALUATOR_H
#define DFLEX_TEST_ANALYSIS_MAKEEVALUATOR_H

#include "dflex/Analysis/IntervalEvaluator.h"

#include <gtest/gtest.h>

namespace dflex::test {

/// An evaluator of `program`; fails the test if there is none.
inline std::unique_ptr<analysis::IntervalEvaluator>
makeEvaluator(const expr::Program &program, const std::vector<expr::CaptureValue> &captures = {}) {
  auto result = analysis::IntervalEvaluator::create(program, captures);
  EXPECT_TRUE(result.ok()) << result.error;
  return std::move(result.evaluator);
}

} // namespace dflex::test

#endif // DFLEX_TEST_ANALYSIS_MAKEEVALUATOR_H
