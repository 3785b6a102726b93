// dflex attention for LibTorch: a dflex.attention spec of a kernel bundle,
// run on CUDA tensors by the bundle's kernels and on CPU tensors by a float64
// reference with the same semantics (docs/runtime-attention.md).
//
// Shapes: q [B, Tq, Hq, D], k and v [B, Tkv, Hkv, D] (head_dim contiguous;
// other strides free), o [B, Tq, Hq, D], lse [B, Hq, Tq] (natural log).
// Captures are given in the spec's capture order (captureNames()): a tensor
// of the declared element type and rank for a tensor capture, a 0-dim (or
// one-element) tensor for a scalar capture. They may live on the CPU or on
// the device of q; the mask's captures are read on the host to build the
// tile lists (device captures are copied to the host once per call).
// A query that sees no key gets o = 0, lse = -inf and zero gradients.
#pragma once

#include "dflex/Analysis/TileList.h"
#include "dflex/runtime/bundle/KernelBundle.h"

#include <torch/torch.h>

#include <string>
#include <vector>

namespace dflex::runtime {

struct AttentionOutputs {
  torch::Tensor out;       // [B, Tq, Hq, Dv], the dtype of q
  torch::Tensor logSumExp; // [B, Hq, Tq]: float32 (float64 for float64 inputs)
};

struct AttentionGrads {
  torch::Tensor q, k, v;
};

/// Forward pass without autograd. CUDA: q, k, v of the spec's element type.
/// CPU: any floating dtype, computed in float64.
AttentionOutputs attentionForward(const KernelBundle &bundle, const AttentionKernelSpec &spec,
                                  const torch::Tensor &q, const torch::Tensor &k,
                                  const torch::Tensor &v,
                                  const std::vector<torch::Tensor> &captures);

/// Backward pass from the forward's o and lse and the gradient of o.
AttentionGrads attentionBackward(const KernelBundle &bundle, const AttentionKernelSpec &spec,
                                 const torch::Tensor &q, const torch::Tensor &k,
                                 const torch::Tensor &v, const torch::Tensor &out,
                                 const torch::Tensor &logSumExp, const torch::Tensor &gradOut,
                                 const std::vector<torch::Tensor> &captures);

/// Forward with autograd: gradients flow to q, k and v through o (lse is not
/// differentiable). `spec` is one of `bundle`'s; the autograd node keeps
/// the bundle open for the backward.
AttentionOutputs attention(const std::shared_ptr<const KernelBundle> &bundle,
                           const AttentionKernelSpec &spec, const torch::Tensor &q,
                           const torch::Tensor &k, const torch::Tensor &v,
                           const std::vector<torch::Tensor> &captures);

/// The mask as a dense [B, Hq, Tq, Tkv] bool CPU tensor, from the program
/// evaluator (for tests and debugging).
torch::Tensor attentionMask(const AttentionKernelSpec &spec,
                            const std::vector<torch::Tensor> &captures, int64_t batch,
                            int64_t queryLength, int64_t keyLength);

/// Which kernels the CUDA path launches, from DFLEX_ATTENTION_KERNELS:
/// `auto` (unset or empty too) runs the Hopper (sm_90a, wgmma) kernels where
/// the binary has them and the portable ones elsewhere; `portable` always
/// the portable ones; `sm90` the Hopper ones, an error where there are none
/// (for A/B comparisons).
enum class AttentionKernelChoice { Auto, Portable, Sm90 };

/// DFLEX_ATTENTION_KERNELS, read at each call. Throws FormatError on any
/// other value. The backward of an autograd call runs the choice its
/// forward made (the tile lists depend on it).
AttentionKernelChoice attentionKernelChoice();

/// The kernels of one pass: their launch constants in the plan's binary
/// (tile sizes for the tile list) and whether they are the Hopper ones.
struct AttentionPassKernels {
  AttentionLaunch launch;
  bool sm90 = false;
};

/// What the CUDA path runs for a spec on a device.
struct AttentionKernelPlan {
  /// The binary the kernels come from: for compute capability 9.0, the
  /// bundle's sm_90a cubin, else its sm_90 cubin, else the source compiled
  /// at run time for sm_90a when the bundle lists kernels that need it, else
  /// for sm_90 (likewise sm_XXa / sm_XX for other devices).
  std::string arch;
  bool compiled = false; // no cubin for `arch` in the bundle
  AttentionPassKernels forward, backward;
};

/// The plan for `spec` of `bundle` on a device of `computeCapability`
/// (major * 10 + minor): a pass runs its Hopper kernels when `choice` allows
/// and the binary of `arch` has them (the forward at every head dim, the
/// backward at 64 and 128; a bundle compiled before the head_dim 64
/// backward existed has its forward only, one compiled before the head_dim
/// 256 forward neither), with the launch constants of that binary
/// (KernelBundle::attentionLaunches: an arch's configs are its own; for an
/// arch the bundle has no binary for, this compiles the source, the compile
/// the launch then loads). Throws FormatError, saying why, when `choice` is
/// Sm90 and the forward has no Hopper kernel, or when that compile fails.
AttentionKernelPlan planAttentionKernels(const KernelBundle &bundle,
                                         const AttentionKernelSpec &spec, int computeCapability,
                                         AttentionKernelChoice choice);

/// The tile lists the CUDA path builds for one call running `plan`'s
/// kernels, both passes from one evaluation of the mask's captures (for
/// tests).
analysis::AttentionTileLists attentionTileLists(const AttentionKernelSpec &spec,
                                                const AttentionKernelPlan &plan,
                                                const std::vector<torch::Tensor> &captures,
                                                int64_t batch, int64_t queryLength,
                                                int64_t keyLength);

} // namespace dflex::runtime
