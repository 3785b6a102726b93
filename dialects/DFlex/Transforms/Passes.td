//===- Passes.td - dflex passes ----------------------------*- tablegen -*-===//

#ifndef DFLEX_TRANSFORMS_PASSES_TD
#define DFLEX_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def DFlexInlineCalls : Pass<"dflex-inline-calls", "::mlir::ModuleOp"> {
  let summary = "Inline dflex.call into the calling mask or score_mod";
  let description = [{
    Replaces every `dflex.call` with a copy of the callee's body, its
    arguments bound to the call's operands. Bodies are pure and the verifier
    rejects recursion, so this terminates and preserves semantics. Analyses
    and codegen run on call-free bodies.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect"];
}

#endif // DFLEX_TRANSFORMS_PASSES_TD
