//===- Inliner.cpp - inline dflex.call -------------------------------------===//

#include "DFlex/Transforms/Inliner.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/SymbolTable.h"

using namespace mlir;
using namespace mlir::dflex;

LogicalResult mlir::dflex::inlineCalls(BodyOpInterface op, Operation *scope) {
  if (!scope)
    scope = op;
  Block &body = op.getBodyBlock();
  size_t size = body.getOperations().size();
  // One walk down the body: a call is replaced by a copy of its callee's
  // operations and the walk goes on from the first of them, so the calls the
  // callee makes are inlined in turn. The verifier rejects recursion, so the
  // walk ends; everything before it is call-free.
  for (Block::iterator it = body.begin(); it != body.end();) {
    auto call = dyn_cast<CallOp>(*it);
    if (!call) {
      ++it;
      continue;
    }
    auto callee = SymbolTable::lookupNearestSymbolFrom<BodyOpInterface>(
        scope, call.getCalleeAttr());
    if (!callee)
      return call.emitOpError("cannot inline: '@")
             << call.getCallee()
             << "' is not a dflex.mask or dflex.score_mod in scope";
    Block &calleeBody = callee.getBodyBlock();
    // The call leaves, the callee's operations but its yield come in. Calls
    // can nest exponentially: the body stops growing at the limit.
    size = size - 1 + calleeBody.getOperations().size() - 1;
    if (size > kMaxInlinedOperations)
      return call.emitOpError("makes the body larger than ")
             << kMaxInlinedOperations << " operations once calls are inlined";
    IRMapping mapping;
    mapping.map(calleeBody.getArguments(), call.getOperands());
    OpBuilder builder(call);
    Operation *first = nullptr;
    for (Operation &inner : calleeBody.without_terminator()) {
      Operation *copy = builder.clone(inner, mapping);
      if (!first)
        first = copy;
    }
    auto yield = cast<YieldOp>(calleeBody.getTerminator());
    call.replaceAllUsesWith(mapping.lookup(yield.getValue()));
    it = first ? Block::iterator(first) : std::next(Block::iterator(call));
    call.erase();
  }
  return success();
}
