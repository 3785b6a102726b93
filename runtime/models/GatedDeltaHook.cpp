// The target models' gated-delta hook (gatedDeltaHook in KernelHooks.h): a
// Qwen3.5 layer's gated delta rule by the gated-delta op on CUDA tensors.
#include "dflex/runtime/models/KernelHooks.h"

#include "dflex/Support/Error.h"
#include "dflex/runtime/gated_delta/GatedDeltaOp.h"
#include "dflex/runtime/models/GatedDeltaRule.h"

#include <cmath>

namespace dflex::runtime::models {

namespace {

/// cu_seqlens (int32, CPU) of a layout's sequences over the flattened rows.
torch::Tensor layoutOffsets(const TokenLayout &layout, const std::string &context) {
  std::vector<int32_t> offsets{0};
  for (const TokenLayout::Segment &s : layout.segments()) {
    if (s.row * layout.length() + s.begin != offsets.back())
      throw FormatError(context + ": the layout's sequences do not tile the rows in order");
    offsets.push_back(static_cast<int32_t>(s.row * layout.length() + s.end));
  }
  return torch::tensor(offsets, torch::kInt);
}

} // namespace

GatedDeltaFn gatedDeltaHook(const std::shared_ptr<const GatedDeltaBundle> &bundle,
                            const std::string &specName) {
  const GatedDeltaKernelSpec &spec = bundle->spec(specName);
  const std::string context = "the target model's gated delta rule (bundle " +
                              bundle->directory() + ", spec '" + spec.name + "')";
  if (spec.gate != "scalar_log" || !spec.deltaRule || !spec.qkL2Norm || spec.inKernelGate)
    throw FormatError(context + ": needs gate scalar_log, delta_rule and qk_l2norm without in_kernel_gate");
  const double modelScale = 1.0 / std::sqrt(double(spec.keyDim));
  if (std::abs(spec.scale - modelScale) > 1e-6 * modelScale)
    throw FormatError(context + ": the model scales q by 1/sqrt(key_dim) = " + std::to_string(modelScale) +
                      ", the spec by " + std::to_string(spec.scale));
  const bool varlen = spec.varlen;
  return [bundle, &spec, varlen, context](const GatedDeltaCall &call) {
    if (!call.q.is_cuda())
      return gatedDeltaRule(call.q, call.k, call.v, call.g, call.beta, call.layout);
    GatedDeltaInputs in;
    in.q = call.q;
    in.k = call.k;
    in.v = call.v;
    in.g = call.g;
    in.beta = call.beta;
    if (varlen)
      in.cuSeqlens = layoutOffsets(call.layout, context);
    else if (call.layout.isPacked())
      throw FormatError(context + ": packed rows need a varlen spec");
    return gatedDelta(bundle, spec, in).out;
  };
}

} // namespace dflex::runtime::models
