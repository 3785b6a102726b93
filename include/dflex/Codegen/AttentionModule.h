//===- AttentionModule.h - Attention kernels of a dflex.attention spec -*- C++ -*-===//

#ifndef DFLEX_CODEGEN_ATTENTIONMODULE_H
#define DFLEX_CODEGEN_ATTENTIONMODULE_H

#include "dflex/Bundle/KernelRoles.h"
#include "dflex/Bundle/Specs.h"
#include "dflex/Codegen/Variant.h"
#include "dflex/Expr/Program.h"

#include <optional>
#include <string>
#include <vector>

namespace dflex::codegen {

/// A module of generated CUDA source: one spec's kernels. Its launch arrays
/// are those of its kernels' roles (bundle::launchArraysOf).
struct GeneratedModule {
  std::string name;   // the spec's symbol
  std::string kind;   // "attention" or "gated_delta"
  std::string source; // complete CUDA C++, including the kernel templates
  std::vector<bundle::ModuleKernel> kernels;
  VariantLayout layout;
};

/// Whether the Hopper forward exists for a head dim (Sm90AttentionConfigs
/// in kernels/attention/sm90/config.cuh): 64, 128 and 256. Other head dims
/// run the portable kernels only.
bool hasSm90Forward(int64_t headDim);
/// Whether the Hopper backward exists for a head dim (its kHasBackward): 64
/// and 128. At head_dim 256 the Hopper forward pairs with the portable
/// backward.
bool hasSm90Backward(int64_t headDim);
/// Whether DefaultAttentionConfigs (kernels/attention/config.cuh) has
/// portable configs of a compute capability's own: 90 and 120, the values
/// PortableConfigs::of takes.
bool hasOwnPortableConfigs(int computeCapability);

/// A portable forward config other than the defaults' (AttentionForwardConfig
/// in kernels/attention/config.cuh): query rows, key rows, warps and the
/// pipeline, by its name in forwardPipelineNames().
struct PortableForwardConfig {
  int blockM = 0;
  int blockN = 0;
  int warps = 0;
  std::string pipeline;
};
/// A portable backward config other than the defaults' (AttentionBackwardConfig).
struct PortableBackwardConfig {
  int blockM = 0;
  int blockN = 0;
  int warps = 0;
  int gradQChunk = 0;
};
/// The names of the forward pipelines (ForwardPipeline), in its order.
const std::vector<std::string> &forwardPipelineNames();
/// Parses "M,N,WARPS[,PIPELINE]" (the pipeline defaulting to the first name)
/// and "M,N,WARPS,DQ_CHUNK"; the kernels' static_asserts check the rest.
Result<PortableForwardConfig> parsePortableForwardConfig(const std::string &text);
Result<PortableBackwardConfig> parsePortableBackwardConfig(const std::string &text);

/// Which configs the portable kernels take in every binary of a module.
struct PortableConfigs {
  /// The DefaultAttentionConfigs of this compute capability instead of each
  /// binary's own (0): e.g. 120 gives an sm_90 binary sm_120's tiles, and
  /// launch constants that pad their shared memory to sm_120's blocks per
  /// multiprocessor, so that an sm_90 GPU measures the kernels sm_120 runs
  /// at the occupancy sm_120 gives them.
  int of = 0;
  /// Configs chosen outright (candidates measured through the compiled
  /// bundles and the op), replacing the defaults' of that pass.
  std::optional<PortableForwardConfig> forward;
  std::optional<PortableBackwardConfig> backward;
};

/// Generates the forward and backward attention kernels of `spec`: the
/// portable kernels for every arch (with the DefaultAttentionConfigs of the
/// compute capability each binary is compiled for, unless `portable` says
/// otherwise), and for head dims that have them the Hopper kernels
/// (forward, backward) for sm_90a (roles with an "_sm90" suffix, their own
/// launch constants; bundle::kSm90Target). `mask` and `scoreMod` are
/// lowered bodies; `scoreMod`, when present, must carry its derivative
/// (appendScoreDerivative).
Result<GeneratedModule> generateAttention(const bundle::AttentionSpec &spec,
                                          const expr::Program &mask,
                                          const expr::Program *scoreMod,
                                          const std::string &sourceName,
                                          const PortableConfigs &portable = {});

} // namespace dflex::codegen

#endif // DFLEX_CODEGEN_ATTENTIONMODULE_H
