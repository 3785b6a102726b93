//===- KernelRoles.h - The kernels of a bundle module -------------*- C++ -*-===//
//
// One definition of every kernel a bundle module can hold: the role the
// manifest and the runtime name it by, the kernel template it instantiates,
// the target it needs, and the launch-constant array it reads; and of those
// arrays (extern "C" int arrays compiled into each module and read back from
// its PTX). The code generator writes modules from this table, dflex-compile
// and the runtime read them with it.
//
//===----------------------------------------------------------------------===//
#ifndef DFLEX_BUNDLE_KERNELROLES_H
#define DFLEX_BUNDLE_KERNELROLES_H

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dflex::bundle {

/// The arch-specific target of the Hopper attention kernels
/// (kernels/attention/sm90: wgmma, setmaxnreg).
inline constexpr const char *kSm90Target = "sm_90a";

/// Whether compiling for `arch` ("sm_90", "sm_90a", "compute_90a", ...)
/// builds code that needs `requiredTarget`: always when it is empty, else
/// for that target and its PTX-only form ("sm_90a" and "compute_90a").
bool buildsFor(std::string_view requiredTarget, std::string_view arch);

/// The launch-constant arrays.
enum class LaunchArray { Forward, Backward, TileClassify, ForwardSm90, BackwardSm90, GatedDelta };

/// Element names of the launch arrays.
namespace launch {
inline constexpr const char *kThreads = "threads";
inline constexpr const char *kSharedBytes = "shared_bytes";
inline constexpr const char *kBlockM = "block_m";
inline constexpr const char *kBlockN = "block_n";
inline constexpr const char *kRowKernelThreads = "row_kernel_threads";
inline constexpr const char *kRowKernelRows = "row_kernel_rows";
inline constexpr const char *kChunkBackwardThreads = "chunk_backward_threads";
inline constexpr const char *kStateThreads = "state_threads";
inline constexpr const char *kChunkTableThreads = "chunk_table_threads";
inline constexpr const char *kFinalizeThreads = "finalize_threads";
inline constexpr const char *kChunk = "chunk";
inline constexpr const char *kValueBlock = "value_block";
} // namespace launch

struct LaunchArrayInfo {
  LaunchArray array;
  const char *symbol;              // the extern "C" array
  std::vector<std::string> names;  // the meaning of each element, in order
  const char *requiredTarget;      // as KernelRoleInfo::requiredTarget
};
const LaunchArrayInfo &launchArray(LaunchArray array);

/// Launch constants of one binary: symbol -> element name -> value.
using LaunchValues = std::map<std::string, std::map<std::string, int64_t>>;

enum class KernelRole {
  AttentionForward,
  AttentionBackwardPreprocess,
  AttentionBackward,
  AttentionBackwardGradQ,
  TileClassify,
  AttentionForwardSm90,
  AttentionBackwardPreprocessSm90,
  AttentionBackwardSm90,
  AttentionBackwardGradQSm90,
  GatedDeltaChunkTable,
  GatedDeltaForwardPrepare,
  GatedDeltaForwardState,
  GatedDeltaForwardOutput,
  GatedDeltaBackwardPrepare,
  GatedDeltaBackwardState,
  GatedDeltaBackwardChunk,
  GatedDeltaBackwardFinalize,
  GatedDeltaBackwardGateParams,
};

struct KernelRoleInfo {
  KernelRole role;
  const char *name;           // in manifests: "attention_forward", ...
  const char *kernelTemplate; // the __global__ template it instantiates
  /// The arch-specific target the kernel needs, or "" when every arch
  /// builds it. The generated source declares such a kernel only when
  /// compiled for that target, so NVRTC must be asked for it only there.
  const char *requiredTarget;
  LaunchArray launch;      // the array of its launch constants
  const char *sharedBytes; // its dynamic shared bytes in `launch`, or null
  /// The part of an arch's binary that holds the kernel. Each part is its
  /// own NVRTC program (the kernels of one pass and family), so the parts
  /// of a binary compile side by side and cache apart.
  const char *part;
};
const KernelRoleInfo &kernelRole(KernelRole role);
/// The role of a manifest name, if there is one.
std::optional<KernelRole> kernelRoleNamed(std::string_view name);
inline const char *roleName(KernelRole role) { return kernelRole(role).name; }
/// Whether a binary for `arch` has the kernels of `role`.
inline bool buildsFor(KernelRole role, std::string_view arch) {
  return buildsFor(kernelRole(role).requiredTarget, arch);
}

/// One kernel of a module: its role and the template instantiation NVRTC
/// lowers.
struct ModuleKernel {
  KernelRole role;
  std::string nameExpression;
};
/// `role`'s kernel template instantiated with `templateArguments`.
ModuleKernel moduleKernel(KernelRole role, const std::string &templateArguments);

/// The parts of a binary for `arch` of a module of `kernels` (those holding
/// a kernel `arch` builds), in table order.
std::vector<std::string> partsOf(const std::vector<ModuleKernel> &kernels, std::string_view arch);
/// The kernels of `kernels` that part `part` of a binary for `arch` holds.
std::vector<ModuleKernel> partKernels(const std::vector<ModuleKernel> &kernels,
                                      std::string_view arch, std::string_view part);

/// The launch arrays of a module of `kernels` that a binary for `arch` has,
/// in table order.
std::vector<LaunchArray> launchArraysOf(const std::vector<ModuleKernel> &kernels,
                                        std::string_view arch);

} // namespace dflex::bundle

#endif // DFLEX_BUNDLE_KERNELROLES_H
