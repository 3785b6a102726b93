//===- Inliner.h - inline dflex.call ----------------------------*- C++ -*-===//
//
// The one inliner of dflex.call. The -dflex-inline-calls pass runs it on the
// module's bodies in place; the conversion to programs runs it on a copy of
// the body it converts, so the module it reads stays as it is.
//
//===----------------------------------------------------------------------===//

#ifndef DFLEX_TRANSFORMS_INLINER_H
#define DFLEX_TRANSFORMS_INLINER_H

#include "DFlex/IR/DFlexOps.h"

namespace mlir::dflex {

/// Inlines every dflex.call in the body of `op` (a mask or score_mod),
/// transitively: the body is left without calls. Callees are looked up from
/// `scope`, by default `op` itself (a detached copy of a body passes the
/// original). Fails, with a diagnostic on the call, on a callee that cannot
/// be resolved or when inlining the call would make the body larger than
/// kMaxInlinedOperations operations.
LogicalResult inlineCalls(BodyOpInterface op, Operation *scope = nullptr);

} // namespace mlir::dflex

#endif // DFLEX_TRANSFORMS_INLINER_H
