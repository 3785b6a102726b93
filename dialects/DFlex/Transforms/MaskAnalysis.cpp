//===- MaskAnalysis.cpp - annotate masks with what their tiles depend on --===//
//
// The static half of the mask analysis: which leading arguments and captures
// reach a mask's result, and whether it computes with floats. The run-time
// half (lib/Analysis) classifies tiles from the same program form, so both
// agree on what "depends on" means.
//
//===----------------------------------------------------------------------===//

#include "DFlex/Transforms/Passes.h"
#include "dflex/Analysis/IntervalEvaluator.h"
#include "dflex/Conversion/DFlexToProgram/DFlexToProgram.h"

#include "mlir/IR/Builders.h"

namespace mlir::dflex {
#define GEN_PASS_DEF_DFLEXMASKANALYSIS
#include "DFlex/Transforms/Passes.h.inc"
} // namespace mlir::dflex

using namespace mlir;
using namespace mlir::dflex;

namespace {

constexpr const char *kLeadingNames[] = {"b", "h", "q_idx", "kv_idx"};

struct DFlexMaskAnalysisPass
    : public mlir::dflex::impl::DFlexMaskAnalysisBase<DFlexMaskAnalysisPass> {
  void runOnOperation() override {
    getOperation().walk([&](MaskOp mask) {
      auto body = cast<BodyOpInterface>(mask.getOperation());
      FailureOr<::dflex::expr::Program> program = lowerToProgram(body);
      if (failed(program)) {
        signalPassFailure();
        return;
      }
      ::dflex::analysis::Dependencies deps = ::dflex::analysis::computeDependencies(*program);
      Builder builder(mask.getContext());
      SmallVector<Attribute> leading, captures;
      for (size_t i = 0; i < deps.leading.size(); ++i)
        if (deps.leading[i])
          leading.push_back(builder.getStringAttr(kLeadingNames[i]));
      for (size_t i = 0; i < deps.captures.size(); ++i)
        if (deps.captures[i])
          captures.push_back(builder.getStringAttr(body.getCaptureName(i)));
      mask->setAttr("dflex.depends_on", builder.getArrayAttr(leading));
      mask->setAttr("dflex.uses_captures", builder.getArrayAttr(captures));
      if (deps.floatArithmetic)
        mask->setAttr("dflex.float_arith", builder.getUnitAttr());
      else
        mask->removeAttr("dflex.float_arith");
    });
  }
};

} // namespace
