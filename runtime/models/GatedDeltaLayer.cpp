// GatedDeltaLayer.h: the tensors and the steps around the gated delta rule of
// Qwen3.5's linear-attention layers.
#include "dflex/runtime/models/GatedDeltaLayer.h"

#include "dflex/runtime/models/Layers.h"

#include <torch/torch.h>

namespace dflex::runtime::models {

std::vector<GatedDeltaTensor> gatedDeltaTensors(const GatedDeltaConfig &g, int64_t hidden) {
  const int64_t keyWidth = g.numKeyHeads * g.keyHeadDim;
  const int64_t valueWidth = g.numValueHeads * g.valueHeadDim;
  const int64_t mixed = 2 * keyWidth + valueWidth;
  using W = GatedDeltaWeights;
  return {{"in_proj_qkv.weight", {mixed, hidden}, &W::inProjQkv},
          {"in_proj_z.weight", {valueWidth, hidden}, &W::inProjZ},
          {"in_proj_b.weight", {g.numValueHeads, hidden}, &W::inProjB},
          {"in_proj_a.weight", {g.numValueHeads, hidden}, &W::inProjA},
          {"conv1d.weight", {mixed, 1, g.convKernelDim}, &W::conv},
          {"dt_bias", {g.numValueHeads}, &W::dtBias},
          {"A_log", {g.numValueHeads}, &W::aLog},
          {"norm.weight", {g.valueHeadDim}, &W::norm},
          {"out_proj.weight", {hidden, valueWidth}, &W::outProj}};
}

GatedDeltaRuleInputs gatedDeltaRuleInputs(const GatedDeltaConfig &g, const GatedDeltaWeights &w,
                                          const torch::Tensor &convolved, const torch::Tensor &x) {
  const int64_t batch = x.size(0), length = x.size(1);
  const int64_t keyWidth = g.numKeyHeads * g.keyHeadDim;
  const torch::Tensor mixed = torch::silu(convolved);
  GatedDeltaRuleInputs in;
  in.q = mixed.narrow(-1, 0, keyWidth).view({batch, length, -1, g.keyHeadDim});
  in.k = mixed.narrow(-1, keyWidth, keyWidth).view({batch, length, -1, g.keyHeadDim});
  in.v = mixed.narrow(-1, 2 * keyWidth, g.numValueHeads * g.valueHeadDim)
             .view({batch, length, -1, g.valueHeadDim});
  in.beta = torch::sigmoid(at::linear(x, w.inProjB));
  // g = -exp(A_log) softplus(a + dt_bias) in float32 (A may be large;
  // float64 for float64).
  const torch::Tensor a = at::linear(x, w.inProjA).to(computeType(x));
  in.g = -w.aLog.to(a.scalar_type()).exp() * torch::softplus(a + w.dtBias);
  return in;
}

torch::Tensor gatedDeltaOutput(const GatedDeltaConfig &g, const GatedDeltaWeights &w,
                               const torch::Tensor &core, const torch::Tensor &x, double eps) {
  const int64_t batch = x.size(0), length = x.size(1);
  const torch::Tensor z = at::linear(x, w.inProjZ).view({batch, length, -1, g.valueHeadDim});
  const torch::Tensor normed = gatedRmsNorm(core, z, w.norm, eps);
  return at::linear(normed.reshape({batch, length, -1}), w.outProj);
}

} // namespace dflex::runtime::models
