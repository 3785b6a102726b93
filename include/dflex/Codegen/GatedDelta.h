//===- GatedDelta.h - gated-delta kernels from a dflex.gated_delta spec -*- C++ -*-===//

#ifndef DFLEX_CODEGEN_GATEDDELTA_H
#define DFLEX_CODEGEN_GATEDDELTA_H

#include "dflex/Codegen/Attention.h"

namespace dflex::codegen {

/// What a dflex.gated_delta op fixes at compile time.
struct GatedDeltaSpec {
  std::string name;
  int64_t numKeyHeads = 0;
  int64_t numValueHeads = 0;
  int64_t keyDim = 0;
  int64_t valueDim = 0;
  std::string gate; // "none", "scalar_log" or "channel_log"
  bool deltaRule = false;
  bool qkL2Norm = false;
  bool initialState = false;
  bool finalState = false;
  bool varlen = false;
  bool inKernelGate = false;
  std::string elementType; // "bf16"
  float scale = 0.0f;
};

/// Instantiates the chunked gated-delta kernels (kernels/gated_delta) for
/// `spec`: the kernels its options need, in launch order
/// (docs/gated-delta.md), with their shared memory as launch constants.
Result<GeneratedModule> generateGatedDelta(const GatedDeltaSpec &spec,
                                           const std::string &sourceName);

} // namespace dflex::codegen

#endif // DFLEX_CODEGEN_GATEDDELTA_H
