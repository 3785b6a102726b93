//===- KernelRoles.cpp - The kernels of a bundle module -------------------===//

#include "dflex/Bundle/KernelRoles.h"

#include <algorithm>
#include <cassert>

namespace dflex::bundle {

namespace {

using namespace launch;

const std::vector<LaunchArrayInfo> &launchArrays() {
  // The order of each array's elements is the order the generated module
  // emits them in (lib/Codegen).
  static const std::vector<LaunchArrayInfo> arrays = {
      {LaunchArray::Forward, "dflex_forward_launch", {kThreads, kSharedBytes, kBlockM, kBlockN}, ""},
      {LaunchArray::Backward,
       "dflex_backward_launch",
       {kThreads, kSharedBytes, kBlockM, kBlockN, kRowKernelThreads, kRowKernelRows},
       ""},
      {LaunchArray::TileClassify, "dflex_tile_classify_launch", {kThreads}, ""},
      {LaunchArray::ForwardSm90,
       "dflex_forward_sm90_launch",
       {kThreads, kSharedBytes, kBlockM, kBlockN},
       kSm90Target},
      {LaunchArray::BackwardSm90,
       "dflex_backward_sm90_launch",
       {kThreads, kSharedBytes, kBlockM, kBlockN, kRowKernelThreads, kRowKernelRows},
       kSm90Target},
      {LaunchArray::GatedDelta,
       "dflex_gated_delta_launch",
       {kThreads, kChunkBackwardThreads, kStateThreads, kChunkTableThreads, kFinalizeThreads, kChunk,
        kValueBlock, "forward_prepare_shared_bytes", "forward_state_shared_bytes",
        "forward_output_shared_bytes", "backward_prepare_shared_bytes",
        "backward_state_shared_bytes", "backward_chunk_shared_bytes"},
       ""},
  };
  return arrays;
}

const std::vector<KernelRoleInfo> &kernelRoles() {
  using R = KernelRole;
  using L = LaunchArray;
  static const std::vector<KernelRoleInfo> roles = {
      {R::AttentionForward, "attention_forward", "dflex::kernels::attention_forward_kernel", "",
       L::Forward, kSharedBytes, "forward"},
      {R::AttentionBackwardPreprocess, "attention_backward_preprocess",
       "dflex::kernels::attention_backward_preprocess_kernel", "", L::Backward, nullptr, "backward"},
      {R::AttentionBackward, "attention_backward", "dflex::kernels::attention_backward_kernel", "",
       L::Backward, kSharedBytes, "backward"},
      {R::AttentionBackwardGradQ, "attention_backward_grad_q",
       "dflex::kernels::attention_backward_grad_q_kernel", "", L::Backward, nullptr, "backward"},
      {R::TileClassify, "tile_classify", "dflex::kernels::tile_classify_kernel", "",
       L::TileClassify, nullptr, "forward"},
      {R::AttentionForwardSm90, "attention_forward_sm90",
       "dflex::kernels::attention_forward_sm90_kernel", kSm90Target, L::ForwardSm90, kSharedBytes, "forward_sm90"},
      // The Hopper backward's own preprocess (the same code, instantiated
      // with the Hopper config) and dQ conversion (its accumulator layout).
      {R::AttentionBackwardPreprocessSm90, "attention_backward_preprocess_sm90",
       "dflex::kernels::attention_backward_preprocess_kernel", kSm90Target, L::BackwardSm90,
       nullptr, "backward_sm90"},
      {R::AttentionBackwardSm90, "attention_backward_sm90",
       "dflex::kernels::attention_backward_sm90_kernel", kSm90Target, L::BackwardSm90,
       kSharedBytes, "backward_sm90"},
      {R::AttentionBackwardGradQSm90, "attention_backward_grad_q_sm90",
       "dflex::kernels::attention_backward_grad_q_sm90_kernel", kSm90Target, L::BackwardSm90,
       nullptr, "backward_sm90"},
      {R::GatedDeltaChunkTable, "gated_delta_chunk_table",
       "dflex::kernels::gated_delta_chunk_table_kernel", "", L::GatedDelta, nullptr, "gated_delta_forward"},
      {R::GatedDeltaForwardPrepare, "gated_delta_forward_prepare",
       "dflex::kernels::gated_delta_forward_prepare_kernel", "", L::GatedDelta,
       "forward_prepare_shared_bytes", "gated_delta_forward"},
      {R::GatedDeltaForwardState, "gated_delta_forward_state",
       "dflex::kernels::gated_delta_forward_state_kernel", "", L::GatedDelta,
       "forward_state_shared_bytes", "gated_delta_forward"},
      {R::GatedDeltaForwardOutput, "gated_delta_forward_output",
       "dflex::kernels::gated_delta_forward_output_kernel", "", L::GatedDelta,
       "forward_output_shared_bytes", "gated_delta_forward"},
      {R::GatedDeltaBackwardPrepare, "gated_delta_backward_prepare",
       "dflex::kernels::gated_delta_backward_prepare_kernel", "", L::GatedDelta,
       "backward_prepare_shared_bytes", "gated_delta_backward"},
      {R::GatedDeltaBackwardState, "gated_delta_backward_state",
       "dflex::kernels::gated_delta_backward_state_kernel", "", L::GatedDelta,
       "backward_state_shared_bytes", "gated_delta_backward"},
      {R::GatedDeltaBackwardChunk, "gated_delta_backward_chunk",
       "dflex::kernels::gated_delta_backward_chunk_kernel", "", L::GatedDelta,
       "backward_chunk_shared_bytes", "gated_delta_backward"},
      {R::GatedDeltaBackwardFinalize, "gated_delta_backward_finalize",
       "dflex::kernels::gated_delta_backward_finalize_kernel", "", L::GatedDelta, nullptr, "gated_delta_backward"},
      {R::GatedDeltaBackwardGateParams, "gated_delta_backward_gate_params",
       "dflex::kernels::gated_delta_backward_gate_params_kernel", "", L::GatedDelta, nullptr, "gated_delta_backward"},
  };
  return roles;
}

} // namespace

bool buildsFor(std::string_view requiredTarget, std::string_view arch) {
  if (requiredTarget.empty() || arch == requiredTarget)
    return true;
  // "sm_90a" -> also "compute_90a" (PTX only, same features).
  return requiredTarget.substr(0, 3) == "sm_" && arch.substr(0, 8) == "compute_" &&
         arch.substr(8) == requiredTarget.substr(3);
}

const LaunchArrayInfo &launchArray(LaunchArray array) {
  const LaunchArrayInfo &info = launchArrays()[static_cast<size_t>(array)];
  assert(info.array == array);
  return info;
}

const KernelRoleInfo &kernelRole(KernelRole role) {
  const KernelRoleInfo &info = kernelRoles()[static_cast<size_t>(role)];
  assert(info.role == role);
  return info;
}

std::optional<KernelRole> kernelRoleNamed(std::string_view name) {
  for (const KernelRoleInfo &info : kernelRoles())
    if (name == info.name)
      return info.role;
  return std::nullopt;
}

ModuleKernel moduleKernel(KernelRole role, const std::string &templateArguments) {
  return {role, std::string(kernelRole(role).kernelTemplate) + "<" + templateArguments + ">"};
}

std::vector<std::string> partsOf(const std::vector<ModuleKernel> &kernels, std::string_view arch) {
  std::vector<std::string> parts;
  for (const KernelRoleInfo &info : kernelRoles()) {
    if (!buildsFor(info.requiredTarget, arch) ||
        std::find(parts.begin(), parts.end(), info.part) != parts.end())
      continue;
    for (const ModuleKernel &kernel : kernels)
      if (kernelRole(kernel.role).part == std::string_view(info.part)) {
        parts.push_back(info.part);
        break;
      }
  }
  return parts;
}

std::vector<ModuleKernel> partKernels(const std::vector<ModuleKernel> &kernels,
                                      std::string_view arch, std::string_view part) {
  std::vector<ModuleKernel> result;
  for (const ModuleKernel &kernel : kernels)
    if (buildsFor(kernel.role, arch) && kernelRole(kernel.role).part == part)
      result.push_back(kernel);
  return result;
}

std::vector<LaunchArray> launchArraysOf(const std::vector<ModuleKernel> &kernels,
                                        std::string_view arch) {
  std::vector<LaunchArray> arrays;
  for (const LaunchArrayInfo &info : launchArrays()) {
    if (!buildsFor(info.requiredTarget, arch))
      continue;
    for (const ModuleKernel &kernel : kernels)
      if (kernelRole(kernel.role).launch == info.array && buildsFor(kernel.role, arch)) {
        arrays.push_back(info.array);
        break;
      }
  }
  return arrays;
}

} // namespace dflex::bundle
