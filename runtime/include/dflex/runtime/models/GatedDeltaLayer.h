// Qwen3.5's linear-attention (Gated DeltaNet) layer around the gated delta
// rule, shared by the target model and the drafter's gated-delta layers
// (docs/models.md): its tensors, stored under `layers.N.linear_attn.`, and
// the steps before and after the rule. For tokens x [B, T, H]:
//
//   mixed   = in_proj_qkv x                          [B, T, C = 2 Hk Dk + Hv Dv]
//   q, k, v = split(silu(conv1d(mixed)))             causal depthwise convolution
//   beta    = sigmoid(in_proj_b x)
//   g       = -exp(A_log) softplus(in_proj_a x + dt_bias)   float32
//   o       = gated delta rule(q, k, v, g, beta)     (GatedDeltaRule.h)
//   out     = out_proj(norm(o) * silu(in_proj_z x))  gated RMSNorm per value head
//
// Where the convolution and the rule start from (a sequence start, a cache,
// a drafter block's context) is the caller's.
#pragma once

#include "dflex/runtime/checkpoint/ModelConfig.h"

#include <torch/types.h>

#include <string>
#include <vector>

namespace dflex::runtime::models {

struct GatedDeltaWeights {
  torch::Tensor inProjQkv, inProjZ, inProjB, inProjA;
  torch::Tensor conv; ///< [C, 1, Kc]
  torch::Tensor dtBias, aLog, norm, outProj;
};

/// One tensor of the layer: its name below `layers.N.linear_attn.`, its
/// shape, and the member of GatedDeltaWeights it is.
struct GatedDeltaTensor {
  std::string name;
  std::vector<int64_t> shape;
  torch::Tensor GatedDeltaWeights::*member;
};

/// Every tensor of a layer of `config` in a model of hidden size `hidden`.
std::vector<GatedDeltaTensor> gatedDeltaTensors(const GatedDeltaConfig &config, int64_t hidden);

/// What the rule reads for tokens x: q, k [B, T, Hk, Dk] (not yet
/// L2-normalised), v [B, T, Hv, Dv], g and beta [B, T, Hv].
struct GatedDeltaRuleInputs {
  torch::Tensor q, k, v, g, beta;
};

/// The rule's inputs of tokens x [B, T, H] whose convolution output
/// (conv1d of in_proj_qkv x, [B, T, C]) is `convolved`.
GatedDeltaRuleInputs gatedDeltaRuleInputs(const GatedDeltaConfig &config,
                                          const GatedDeltaWeights &weights,
                                          const torch::Tensor &convolved, const torch::Tensor &x);

/// The layer's output [B, T, H] for tokens x [B, T, H] from the rule's
/// output `core` [B, T, Hv, Dv].
torch::Tensor gatedDeltaOutput(const GatedDeltaConfig &config, const GatedDeltaWeights &weights,
                               const torch::Tensor &core, const torch::Tensor &x, double eps);

} // namespace dflex::runtime::models
