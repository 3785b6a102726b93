// Pieces of the gated-delta op shared by its CPU reference and CUDA paths.
#pragma once

#include "dflex/runtime/gated_delta/GatedDeltaOp.h"

#include <torch/torch.h>

#include <string>
#include <vector>

namespace dflex::runtime::detail {

/// Sizes of one call, checked against its spec.
struct GatedDeltaProblem {
  int64_t batch = 0;
  int64_t length = 0;    // tokens per row
  int64_t tokens = 0;    // batch * length
  int64_t sequences = 0; // N: batch, or len(cu_seqlens) - 1 with varlen
  int64_t keyHeads = 0, valueHeads = 0, keyDim = 0, valueDim = 0;
  /// Token offsets of the sequences on the host, [N + 1].
  std::vector<int64_t> offsets;
};

/// "dflex gated_delta '<spec>'": the prefix of every error.
std::string where(const GatedDeltaKernelSpec &spec);

/// Checks every input against `spec` (presence, shapes, dtypes, devices,
/// cu_seqlens) and reads the sequence offsets; throws FormatError naming
/// the spec and the tensor. A device cu_seqlens is copied to the host once
/// (a synchronising copy).
GatedDeltaProblem checkInputs(const GatedDeltaKernelSpec &spec, const GatedDeltaInputs &inputs);

/// Checks o's gradient and the final state's (undefined = zeros).
void checkOutputGrads(const GatedDeltaKernelSpec &spec, const GatedDeltaProblem &problem,
                      const GatedDeltaInputs &inputs, const torch::Tensor &gradOut,
                      const torch::Tensor &gradFinalState);

// CPU reference, float64 (GatedDelta.cpp).
GatedDeltaOutputs referenceForward(const GatedDeltaKernelSpec &spec, const GatedDeltaProblem &problem,
                                   const GatedDeltaInputs &inputs);
GatedDeltaGrads referenceBackward(const GatedDeltaKernelSpec &spec, const GatedDeltaProblem &problem,
                                  const GatedDeltaInputs &inputs, const torch::Tensor &gradOut,
                                  const torch::Tensor &gradFinalState);

// CUDA path (GatedDeltaCuda.cpp).

/// The forward's outputs and what its backward reads: the kernels'
/// workspace (one byte tensor) and cu_seqlens on the device.
struct CudaForwardState {
  GatedDeltaOutputs outputs;
  torch::Tensor workspace;
  torch::Tensor cuSeqlens;
};

CudaForwardState cudaForward(const GatedDeltaBundle &bundle, const GatedDeltaKernelSpec &spec,
                             const GatedDeltaProblem &problem, const GatedDeltaInputs &inputs);
/// The backward kernels on the workspace of a forward over the same inputs.
GatedDeltaGrads cudaBackward(const GatedDeltaBundle &bundle, const GatedDeltaKernelSpec &spec,
                             const GatedDeltaProblem &problem, const GatedDeltaInputs &inputs,
                             const CudaForwardState &forward, const torch::Tensor &gradOut,
                             const torch::Tensor &gradFinalState);

} // namespace dflex::runtime::detail
