//===- Attention.h - attention kernels from a dflex.attention spec -*- C++ -*-===//

#ifndef DFLEX_CODEGEN_ATTENTION_H
#define DFLEX_CODEGEN_ATTENTION_H

#include "dflex/Codegen/Variant.h"
#include "dflex/Expr/Program.h"

#include <string>
#include <vector>

namespace dflex::codegen {

/// What a dflex.attention op fixes at compile time.
struct AttentionSpec {
  std::string name;
  int64_t numQHeads = 0;
  int64_t numKvHeads = 0;
  int64_t qkHeadDim = 0;
  int64_t vHeadDim = 0;
  std::string elementType; // "bf16" or "f16"
  float scale = 0.0f;
};

/// One __global__ function of a generated module.
struct KernelEntry {
  std::string role;           // e.g. "attention_forward"
  std::string nameExpression; // the template instantiation NVRTC lowers
};

/// A module of generated CUDA source: one spec's kernels.
struct GeneratedModule {
  std::string name;   // the spec's symbol
  std::string kind;   // "attention"
  std::string source; // complete CUDA C++, including the kernel templates
  std::vector<KernelEntry> kernels;
  /// extern "C" __device__ int arrays holding launch constants, read back
  /// from the PTX: symbol -> meaning of each element.
  std::vector<std::pair<std::string, std::vector<std::string>>> launchConstants;
  VariantLayout layout;
};

/// Template version folded into every cache key: bump when the code
/// generator changes what it emits for the same input.
constexpr const char *kTemplateVersion = "dflex-templates-1";

/// Generates the forward and backward attention kernels of `spec`. `mask`
/// and `scoreMod` are lowered bodies; `scoreMod`, when present, must carry
/// its derivative (appendScoreDerivative).
Result<GeneratedModule> generateAttention(const AttentionSpec &spec,
                                          const expr::Program &mask,
                                          const expr::Program *scoreMod,
                                          const std::string &sourceName);

} // namespace dflex::codegen

#endif // DFLEX_CODEGEN_ATTENTION_H
