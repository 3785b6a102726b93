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

def DFlexMaskAnalysis : Pass<"dflex-mask-analysis", "::mlir::ModuleOp"> {
  let summary = "Annotate each dflex.mask with what its tile lists depend on";
  let description = [{
    For every `dflex.mask` (calls inlined on the way, as in every analysis),
    attaches:

    - `dflex.depends_on`: the leading arguments (`b`, `h`, `q_idx`,
      `kv_idx`) whose value reaches the yielded result. A mask that does not
      depend on `b` (`h`) has one tile list for all batches (heads).
    - `dflex.uses_captures`: the captures whose value reaches the result.
      When empty, the tile lists depend only on the lengths and tile sizes,
      so they can be built once and reused across steps.
    - `dflex.float_arith` (unit), when the result depends on float
      arithmetic: the run-time tile classification only proves float
      comparisons on single points, so such masks get more partial tiles.

    Existing values of these attributes are replaced. The tile classes
    themselves depend on run-time lengths and captures and are computed by
    the runtime (lib/Analysis).
  }];
}

#endif // DFLEX_TRANSFORMS_PASSES_TD
