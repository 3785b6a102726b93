//===- InlineCalls.cpp - inline dflex.call ---------------------------------===//

#include "DFlex/Transforms/Passes.h"

#include "mlir/IR/IRMapping.h"
#include "mlir/IR/SymbolTable.h"

namespace mlir::dflex {
#define GEN_PASS_DEF_DFLEXINLINECALLS
#include "DFlex/Transforms/Passes.h.inc"
} // namespace mlir::dflex

using namespace mlir;
using namespace mlir::dflex;

LogicalResult mlir::dflex::inlineCalls(BodyOpInterface op) {
  // Inlining a callee may bring in more calls: repeat until none is left.
  // The verifier rejects recursion, so the loop ends.
  while (true) {
    CallOp call;
    op->walk([&](CallOp found) {
      call = found;
      return WalkResult::interrupt();
    });
    if (!call)
      return success();
    auto callee = SymbolTable::lookupNearestSymbolFrom<BodyOpInterface>(
        call, call.getCalleeAttr());
    if (!callee)
      return call.emitOpError("cannot inline: '@")
             << call.getCallee()
             << "' is not a dflex.mask or dflex.score_mod in scope";
    IRMapping mapping;
    mapping.map(callee.getBodyBlock().getArguments(), call.getOperands());
    OpBuilder builder(call);
    for (Operation &inner : callee.getBodyBlock().without_terminator())
      builder.clone(inner, mapping);
    if (op.getBodyBlock().getOperations().size() +
            callee.getBodyBlock().getOperations().size() >
        kMaxInlinedOperations)
      return call.emitOpError("makes the body larger than ")
             << kMaxInlinedOperations << " operations once calls are inlined";
    auto yield = cast<YieldOp>(callee.getBodyBlock().getTerminator());
    call.replaceAllUsesWith(mapping.lookup(yield.getValue()));
    call.erase();
  }
}

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
