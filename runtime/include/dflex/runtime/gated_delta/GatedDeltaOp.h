// The chunked gated delta rule for LibTorch: a dflex.gated_delta spec of a
// kernel bundle, run on CUDA tensors by the bundle's kernels and on CPU
// tensors by a float64 reference with the same semantics, with autograd
// (docs/runtime-gated-delta.md; the kernels: docs/gated-delta.md).
//
// Per value head hv (key head hv / (Hv / Hk)), state S [Dk, Dv], for each
// token t of a sequence:
//   S = exp(g_t) S;  delta_t = beta_t (v_t - S^T k_t)  (without the delta
//   rule: delta_t = v_t);  S = S + k_t delta_t^T;  o_t = scale S^T q_t
// with q, k replaced by x / sqrt(|x|^2 + 1e-6) under qk_l2norm, and with
// in_kernel_gate g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b).
//
// Shapes: q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta, a, b [B, T, Hv];
// A_log, dt_bias [Hv]; states [N, Hv, Dk, Dv]; o [B, T, Hv, Dv]. Without
// varlen the N = B rows are the sequences; with varlen, cu_seqlens (int32
// [N + 1], 0 first, B*T last, strictly increasing) cuts the flattened B*T
// tokens into N sequences.
#pragma once

#include "dflex/runtime/bundle/GatedDeltaBundle.h"

#include <torch/torch.h>

#include <memory>

namespace dflex::runtime {

/// The tensors of one call; leave undefined what the spec does not take.
struct GatedDeltaInputs {
  torch::Tensor q, k, v;
  torch::Tensor g, beta;            // without in_kernel_gate (g: gate scalar_log; beta: delta_rule)
  torch::Tensor a, b, aLog, dtBias; // with in_kernel_gate (b: delta_rule)
  torch::Tensor initialState;       // initial_state; undefined = zeros
  torch::Tensor cuSeqlens;          // varlen
};

struct GatedDeltaOutputs {
  torch::Tensor out;        // [B, T, Hv, Dv], the dtype of q
  torch::Tensor finalState; // [N, Hv, Dk, Dv] with final_state, else undefined
};

/// Gradients of the inputs the spec takes (undefined for the others).
struct GatedDeltaGrads {
  torch::Tensor q, k, v, g, beta, a, b, aLog, dtBias, initialState;
};

/// Forward without autograd. CUDA: q, k, v, beta, a, b bf16; g, A_log,
/// dt_bias, initial_state float32. CPU: any floating dtypes, computed in
/// float64. Throws FormatError naming the spec and the tensor at fault.
GatedDeltaOutputs gatedDeltaForward(const GatedDeltaBundle &bundle, const GatedDeltaKernelSpec &spec,
                                    const GatedDeltaInputs &inputs);

/// The gradients for dL/do = gradOut and dL/d final_state = gradFinalState
/// (undefined: zeros). CUDA runs the forward kernels again for their
/// workspace; autograd (gatedDelta) keeps the forward's instead.
GatedDeltaGrads gatedDeltaBackward(const GatedDeltaBundle &bundle, const GatedDeltaKernelSpec &spec,
                                   const GatedDeltaInputs &inputs, const torch::Tensor &gradOut,
                                   const torch::Tensor &gradFinalState);

/// Forward with autograd through o and final_state to every floating input.
/// `spec` is one of `bundle`'s; the autograd node keeps the bundle open for
/// the backward.
GatedDeltaOutputs gatedDelta(const std::shared_ptr<const GatedDeltaBundle> &bundle,
                             const GatedDeltaKernelSpec &spec, const GatedDeltaInputs &inputs);

} // namespace dflex::runtime
