//===- DFlexOps.td - dflex operations ----------------------*- tablegen -*-===//

#ifndef DFLEX_OPS_TD
#define DFLEX_OPS_TD

include "DFlex/IR/DFlexBase.td"
include "DFlex/IR/DFlexInterfaces.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"

//===----------------------------------------------------------------------===//
// Function-like body ops
//===----------------------------------------------------------------------===//

class DFlex_BodyOp<string mnemonic, int numLeadingArguments>
    : DFlex_Op<mnemonic, [Symbol, IsolatedFromAbove, SingleBlock,
        DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmBlockArgumentNames"]>,
        DFlex_BodyOpInterface]> {
  let arguments = (ins SymbolNameAttr:$sym_name, StrArrayAttr:$capture_names);
  let regions = (region SizedRegion<1>:$body);
  let hasCustomAssemblyFormat = 1;
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    static constexpr unsigned kNumLeadingArguments = }] # numLeadingArguments # [{;
    static ::mlir::Type getBodyYieldType(::mlir::MLIRContext *context);
  }];
}

def DFlex_MaskOp : DFlex_BodyOp<"mask", 4> {
  let summary = "an attention mask: which keys a query may see";
  let description = [{
    Defines a mask function `(b, h, q_idx, kv_idx, captures...) -> i1`.
    A key is visible to a query exactly when the body yields true. The body
    is one block of `arith`, `math` and `dflex` ops ending in `dflex.yield`.

    ```mlir
    dflex.mask @sliding_window(%b: index, %h: index, %q: index, %kv: index)
        captures(%window: index) {
      %causal = arith.cmpi uge, %q, %kv : index
      %dist = arith.subi %q, %kv : index
      %near = arith.cmpi slt, %dist, %window : index
      %visible = arith.andi %causal, %near : i1
      dflex.yield %visible : i1
    }
    ```
  }];
}

def DFlex_ScoreModOp : DFlex_BodyOp<"score_mod", 5> {
  let summary = "a score modification applied to each visible attention score";
  let description = [{
    Defines `(score: f32, b, h, q_idx, kv_idx, captures...) -> f32`, applied
    to `scale * dot(q, k)` before the softmax. Its derivative with respect to
    the score is derived by the compiler for the backward kernel.

    ```mlir
    dflex.score_mod @softcap(%s: f32, %b: index, %h: index, %q: index, %kv: index) {
      %cap = arith.constant 50.0 : f32
      %x = arith.divf %s, %cap : f32
      %t = math.tanh %x : f32
      %r = arith.mulf %t, %cap : f32
      dflex.yield %r : f32
    }
    ```
  }];
}

//===----------------------------------------------------------------------===//
// Body ops
//===----------------------------------------------------------------------===//

def DFlex_YieldOp : DFlex_Op<"yield", [Pure, Terminator, ReturnLike,
    ParentOneOf<["MaskOp", "ScoreModOp"]>]> {
  let summary = "the value a mask or score_mod body computes";
  let arguments = (ins AnyType:$value);
  let assemblyFormat = "$value attr-dict `:` type($value)";
  let hasVerifier = 1;
}

def DFlex_ReadOp : DFlex_Op<"read", [Pure,
    TypesMatchWith<"result type is the element type of the tensor",
                   "tensor", "result",
                   "::llvm::cast<::mlir::TensorType>($_self).getElementType()">]> {
  let summary = "read one element of a captured tensor";
  let description = [{
    Reads `tensor[indices]`. Every index is compared with the tensor's size
    in that dimension at run time: a read with any index outside `[0, size)`
    yields the `padding` value (zero of the element type when omitted). A read
    is never undefined.

    ```mlir
    %a = dflex.read %anchors[%b, %i] padding -1 : tensor<?x?xi32>
    ```
  }];
  let arguments = (ins DFlex_CapturedTensor:$tensor, Variadic<Index>:$indices,
                       OptionalAttr<TypedAttrInterface>:$padding);
  let results = (outs DFlex_CaptureElementType:$result);
  // Custom: the padding literal takes the tensor's element type, which is
  // only known once the trailing type has been parsed.
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
  let hasFolder = 1;
  let extraClassDeclaration = [{
    /// The value an out-of-range read yields.
    ::mlir::TypedAttr getPaddingOrZero();
  }];
}

def DFlex_DimOp : DFlex_Op<"dim", [Pure]> {
  let summary = "the size of a captured tensor in one dimension";
  let arguments = (ins DFlex_CapturedTensor:$tensor, IndexAttr:$dimension);
  let results = (outs Index:$result);
  let assemblyFormat = "$tensor `,` $dimension attr-dict `:` type($tensor)";
  let hasVerifier = 1;
}

def DFlex_CallOp : DFlex_Op<"call", [Pure,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "evaluate another mask or score_mod";
  let description = [{
    Calls a `dflex.mask` or `dflex.score_mod` with its full argument list:
    the leading arguments followed by the callee's captures. Calls are inlined
    before analysis and codegen; recursion is rejected.

    ```mlir
    %in_doc = dflex.call @same_document(%b, %h, %q, %kv, %doc_ids)
        : (index, index, index, index, tensor<?x?xi32>) -> i1
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$callee, Variadic<AnyType>:$operands);
  let results = (outs AnyTypeOf<[I1, F32]>:$result);
  let assemblyFormat = [{
    $callee `(` $operands `)` attr-dict `:` functional-type($operands, $result)
  }];
}

//===----------------------------------------------------------------------===//
// Kernel specs
//===----------------------------------------------------------------------===//

def DFlex_AttentionOp : DFlex_Op<"attention", [Symbol,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "spec of a fused attention kernel (forward and backward)";
  let description = [{
    Everything the attention kernels fix at compile time: the mask and the
    optional score_mod (by symbol), query and key/value head counts (grouped
    query attention when they differ), head dims of q/k and of v, the element
    type of q, k, v and o, and the softmax scale (default 1/sqrt(qk_head_dim)).
    Batch size and sequence lengths are run-time values.

    ```mlir
    dflex.attention @drafter_attn mask @dflash heads(32, 8) head_dim(128, 128) : bf16
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, FlatSymbolRefAttr:$mask,
                       OptionalAttr<FlatSymbolRefAttr>:$score_mod,
                       ConfinedAttr<I64Attr, [IntPositive]>:$num_q_heads,
                       ConfinedAttr<I64Attr, [IntPositive]>:$num_kv_heads,
                       I64Attr:$qk_head_dim, I64Attr:$v_head_dim,
                       DFlex_KernelElementType:$element_type,
                       OptionalAttr<F32Attr>:$scale);
  let assemblyFormat = [{
    $sym_name `mask` $mask (`score_mod` $score_mod^)?
    `heads` `(` $num_q_heads `,` $num_kv_heads `)`
    `head_dim` `(` $qk_head_dim `,` $v_head_dim `)`
    (`scale` $scale^)? `:` $element_type attr-dict
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The softmax scale: the explicit one, else 1/sqrt(qk_head_dim).
    float getSoftmaxScale();
  }];
}

def DFlex_GatedDeltaOp : DFlex_Op<"gated_delta", [Symbol]> {
  let summary = "spec of a chunked gated delta rule kernel (forward and backward)";
  let description = [{
    The gated delta rule family, per value head with state S (key_dim x
    value_dim, f32):
      S_t = exp(g_t) S_{t-1};  S_t += k_t (beta_t (v_t - S_t^T k_t))^T;
      o_t = scale S_t^T q_t.
    `gate`: `scalar_log` (one log-space gate per head and token),
    `channel_log` (one per key channel), `none` (no decay). Without
    `delta_rule` the update is S_t += k_t v_t^T (gated linear attention).
    Value heads are grouped over key heads (num_value_heads a multiple of
    num_key_heads). `qk_l2norm` normalises q and k inside the kernel;
    `initial_state` / `final_state` add the state input / output; `varlen`
    packs sequences with cumulative offsets; `in_kernel_gate` computes
    g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b) in the
    kernel from the raw projections.

    ```mlir
    dflex.gated_delta @gdn heads(16, 32) dims(128, 128) gate(scalar_log)
        delta_rule qk_l2norm : bf16
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       ConfinedAttr<I64Attr, [IntPositive]>:$num_key_heads,
                       ConfinedAttr<I64Attr, [IntPositive]>:$num_value_heads,
                       I64Attr:$key_dim, I64Attr:$value_dim,
                       DFlex_GateKind:$gate,
                       UnitAttr:$delta_rule, UnitAttr:$qk_l2norm,
                       UnitAttr:$initial_state, UnitAttr:$final_state,
                       UnitAttr:$varlen, UnitAttr:$in_kernel_gate,
                       DFlex_KernelElementType:$element_type,
                       OptionalAttr<F32Attr>:$scale);
  let assemblyFormat = [{
    $sym_name `heads` `(` $num_key_heads `,` $num_value_heads `)`
    `dims` `(` $key_dim `,` $value_dim `)` `gate` `(` $gate `)`
    (`delta_rule` $delta_rule^)? (`qk_l2norm` $qk_l2norm^)?
    (`initial_state` $initial_state^)? (`final_state` $final_state^)?
    (`varlen` $varlen^)? (`in_kernel_gate` $in_kernel_gate^)?
    (`scale` $scale^)? `:` $element_type attr-dict
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The output scale: the explicit one, else 1/sqrt(key_dim).
    float getOutputScale();
  }];
}

#endif // DFLEX_OPS_TD
