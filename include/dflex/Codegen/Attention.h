//===- Attention.h - attention kernels from a dflex.attention spec -*- C++ -*-===//

#ifndef DFLEX_CODEGEN_ATTENTION_H
#define DFLEX_CODEGEN_ATTENTION_H

#include "dflex/Codegen/Variant.h"
#include "dflex/Expr/Program.h"

#include <array>
#include <string>
#include <string_view>
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
  /// The arch-specific target the kernel needs ("sm_90a" for the wgmma
  /// kernels), or empty when every arch builds it. The generated source
  /// declares such a kernel only when compiled for that target, so NVRTC
  /// must be asked for it only there (buildsFor).
  std::string requiredTarget;
};

/// An extern "C" __device__ int array of launch constants, read back from
/// the PTX of each arch that builds it: its values are those of the configs
/// that arch is compiled with.
struct LaunchConstants {
  std::string symbol;
  std::vector<std::string> names; // the meaning of each element
  std::string requiredTarget;     // as KernelEntry::requiredTarget
};

/// The elements of a pass's launch-constant array, in the order the
/// generated module emits them: its main kernel's threads per block, dynamic
/// shared bytes, query tile and key tile, and for a backward the threads of
/// its row kernels (preprocess and dQ conversion). The values follow the
/// configs of the arch a binary is compiled for.
inline constexpr std::array<const char *, 4> kForwardLaunchNames = {"threads", "shared_bytes",
                                                                    "block_m", "block_n"};
inline constexpr std::array<const char *, 5> kBackwardLaunchNames = {
    "threads", "shared_bytes", "block_m", "block_n", "row_kernel_threads"};

/// Whether compiling for `arch` ("sm_90", "sm_90a", "compute_90a", ...)
/// builds code that needs `requiredTarget`: always when it is empty, else
/// for that target and its PTX-only form ("sm_90a" and "compute_90a").
bool buildsFor(std::string_view requiredTarget, std::string_view arch);

/// A module of generated CUDA source: one spec's kernels.
struct GeneratedModule {
  std::string name;   // the spec's symbol
  std::string kind;   // "attention"
  std::string source; // complete CUDA C++, including the kernel templates
  std::vector<KernelEntry> kernels;
  std::vector<LaunchConstants> launchConstants;
  VariantLayout layout;
};

/// Template version folded into every cache key: bump when the code
/// generator changes what it emits for the same input.
constexpr const char *kTemplateVersion = "dflex-templates-4";

/// The layout of a bundle's manifest.json (docs/bundle.md), which
/// dflex-compile writes and the runtime reads: bump when it changes.
/// Version 2: each binary carries its own launch constants.
constexpr int kBundleFormatVersion = 2;

/// The arch-specific target of the Hopper attention kernels
/// (kernels/attention/sm90: wgmma, setmaxnreg).
constexpr const char *kSm90Target = "sm_90a";

/// Which Hopper kernels exist for a head dim (Sm90AttentionConfigs in
/// kernels/attention/sm90/config.cuh): a forward for 64 and 128, a backward
/// for 128. Other head dims run the portable kernels only.
struct Sm90Kernels {
  bool forward = false;
  bool backward = false;
};
Sm90Kernels sm90KernelsFor(int64_t headDim);

/// Generates the forward and backward attention kernels of `spec`: the
/// portable kernels for every arch (with the DefaultAttentionConfigs of the
/// compute capability each binary is compiled for), and for head dims that have them the
/// Hopper kernels for sm_90a (roles with an "_sm90" suffix, their own launch
/// constants; requiredTarget kSm90Target). `mask` and `scoreMod` are lowered
/// bodies; `scoreMod`, when present, must carry its derivative
/// (appendScoreDerivative).
Result<GeneratedModule> generateAttention(const AttentionSpec &spec,
                                          const expr::Program &mask,
                                          const expr::Program *scoreMod,
                                          const std::string &sourceName);

} // namespace dflex::codegen

#endif // DFLEX_CODEGEN_ATTENTION_H
