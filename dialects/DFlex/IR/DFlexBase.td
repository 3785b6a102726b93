//===- DFlexBase.td - dflex dialect definition -------------*- tablegen -*-===//
//
// The dflex dialect: attention masks, score modifications and kernel specs
// that dflex compiles ahead of time into fused GPU kernels.
//
//===----------------------------------------------------------------------===//

#ifndef DFLEX_BASE_TD
#define DFLEX_BASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/EnumAttr.td"

def DFlex_Dialect : Dialect {
  let name = "dflex";
  let cppNamespace = "::mlir::dflex";
  let summary = "Attention masks, score modifications and kernel specs for dflex";
  let description = [{
    `dflex.mask` and `dflex.score_mod` define pure functions of the indices
    (batch, head, query, key) and of captured values, written with upstream
    `arith` and `math` ops. `dflex.attention` and `dflex.gated_delta` are
    kernel specs that name them and fix everything a kernel must know at
    compile time. docs/language.md gives the exact semantics.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::math::MathDialect"];
  let hasConstantMaterializer = 1;
}

class DFlex_Op<string mnemonic, list<Trait> traits = []>
    : Op<DFlex_Dialect, mnemonic, traits>;

def DFlex_GateKind : I32EnumAttr<"GateKind",
    "how the recurrent state decays each token", [
      I32EnumAttrCase<"None", 0, "none">,
      I32EnumAttrCase<"ScalarLog", 1, "scalar_log">,
      I32EnumAttrCase<"ChannelLog", 2, "channel_log">
    ]> {
  let cppNamespace = "::mlir::dflex";
}

// Element types a captured tensor may hold, and scalar capture types.
def DFlex_CaptureElementType : AnyTypeOf<[I32, I64, F32, BF16]>;
def DFlex_CapturedTensor : RankedTensorOf<[I32, I64, F32, BF16]>;
def DFlex_KernelElementType : TypeAttrOf<AnyTypeOf<[BF16, F16]>>;

#endif // DFLEX_BASE_TD
