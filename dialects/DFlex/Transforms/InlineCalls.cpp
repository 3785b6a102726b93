//===- InlineCalls.cpp - the -dflex-inline-calls pass ----------------------===//

#include "DFlex/Transforms/Inliner.h"
#include "DFlex/Transforms/Passes.h"

namespace mlir::dflex {
#define GEN_PASS_DEF_DFLEXINLINECALLS
#include "DFlex/Transforms/Passes.h.inc"
} // namespace mlir::dflex

using namespace mlir;
using namespace mlir::dflex;

namespace {
struct DFlexInlineCallsPass
    : public mlir::dflex::impl::DFlexInlineCallsBase<DFlexInlineCallsPass> {
  void runOnOperation() override {
    getOperation().walk([&](BodyOpInterface op) {
      if (failed(inlineCalls(op)))
        signalPassFailure();
    });
  }
};
} // namespace
