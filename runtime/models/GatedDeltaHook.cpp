// The models' gated-delta hooks (KernelHooks.h): a Qwen3.5 target layer's
// gated delta rule by the gated-delta op on CUDA tensors (gatedDeltaHook),
// and a drafter's gated-delta layers by it (drafterGatedDeltaHook).
#include "dflex/runtime/models/KernelHooks.h"

#include "dflex/Support/Error.h"
#include "dflex/runtime/gated_delta/GatedDeltaOp.h"
#include "dflex/runtime/models/GatedDeltaRule.h"

#include <algorithm>
#include <cmath>

namespace dflex::runtime::models {

namespace {

using torch::Tensor;

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

/// Throws unless `spec` scales q by 1/sqrt(key_dim), as the models do.
void checkModelScale(const GatedDeltaKernelSpec &spec, const std::string &context) {
  const double modelScale = 1.0 / std::sqrt(double(spec.keyDim));
  if (std::abs(spec.scale - modelScale) > 1e-6 * modelScale)
    throw FormatError(context + ": the model scales q by 1/sqrt(key_dim) = " + std::to_string(modelScale) +
                      ", the spec by " + std::to_string(spec.scale));
}

} // namespace

GatedDeltaFn gatedDeltaHook(const std::shared_ptr<const GatedDeltaBundle> &bundle,
                            const std::string &specName) {
  const GatedDeltaKernelSpec &spec = bundle->spec(specName);
  const std::string context = "the target model's gated delta rule (bundle " +
                              bundle->directory() + ", spec '" + spec.name + "')";
  if (spec.gate != "scalar_log" || !spec.deltaRule || !spec.qkL2Norm || spec.inKernelGate)
    throw FormatError(context + ": needs gate scalar_log, delta_rule and qk_l2norm without in_kernel_gate");
  checkModelScale(spec, context);
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

DrafterGatedDeltaFn drafterGatedDeltaHook(const std::shared_ptr<const GatedDeltaBundle> &bundle,
                                          const std::string &specName,
                                          const GatedDeltaConfig &layers) {
  const GatedDeltaKernelSpec &spec = bundle->spec(specName);
  const std::string context = "the drafter's gated delta rule (bundle " + bundle->directory() +
                              ", spec '" + spec.name + "')";
  if (spec.gate != "scalar_log" || !spec.deltaRule || !spec.varlen || spec.qkL2Norm ||
      spec.inKernelGate)
    throw FormatError(context + ": needs gate scalar_log, delta_rule and varlen, without qk_l2norm "
                                "(the hook normalises q and k) or in_kernel_gate");
  const int64_t heads = layers.numValueHeads;
  if (spec.numKeyHeads != heads || spec.numValueHeads != heads || spec.keyDim != layers.keyHeadDim ||
      spec.valueDim != layers.valueHeadDim)
    throw FormatError(context + ": is heads(" + std::to_string(spec.numKeyHeads) + ", " +
                      std::to_string(spec.numValueHeads) + ") dims(" + std::to_string(spec.keyDim) +
                      ", " + std::to_string(spec.valueDim) + ") but the layers need heads(" +
                      std::to_string(heads) + ", " + std::to_string(heads) + ") dims(" +
                      std::to_string(layers.keyHeadDim) + ", " +
                      std::to_string(layers.valueHeadDim) +
                      ") (the key heads repeated to the value heads)");
  checkModelScale(spec, context);
  return [bundle, &spec](const DrafterGatedDeltaCall &call) {
    const GatedDeltaRuleInputs &blocks = call.blocks;
    const int64_t rows = blocks.v.size(0), size = blocks.v.size(1), heads = blocks.v.size(2);
    const int64_t contextTokens = call.runOffsets.back(), blockTokens = rows * size;
    // The sequences: each run up to its last anchor with the probes of its
    // blocks after their anchors, then every block's tokens. Each token
    // takes k, v, g and beta from row stateRow of [the runs' tokens | a zero
    // token | the blocks' tokens] and q from row queryRow of [a zero token |
    // the blocks' probe queries | the blocks' queries].
    std::vector<int64_t> stateRow, queryRow;
    std::vector<int32_t> offsets{0};
    // Per block token: its probe's and its own token's row of [a zero
    // output | the call's outputs].
    std::vector<int64_t> probeOutput(static_cast<size_t>(blockTokens), 0);
    std::vector<int64_t> ownOutput(static_cast<size_t>(blockTokens));
    const std::vector<std::vector<int64_t>> members = call.blocksOfRuns();
    for (size_t run = 0; run < members.size(); ++run) {
      const std::vector<int64_t> &order = members[run];
      if (order.empty())
        continue;
      int64_t token = call.runOffsets[run];
      for (int64_t block : order) {
        for (const int64_t end = call.runOffsets[run] + call.blockAfter[size_t(block)]; token < end;
             ++token) {
          stateRow.push_back(token);
          queryRow.push_back(0);
        }
        for (int64_t j = 0; j < size; ++j) {
          probeOutput[size_t(block * size + j)] = int64_t(stateRow.size()) + 1;
          stateRow.push_back(contextTokens);
          queryRow.push_back(1 + block * size + j);
        }
      }
      offsets.push_back(int32_t(stateRow.size()));
    }
    for (int64_t token = 0; token < blockTokens; ++token) {
      ownOutput[size_t(token)] = int64_t(stateRow.size()) + 1;
      stateRow.push_back(contextTokens + 1 + token);
      queryRow.push_back(1 + blockTokens + token);
      if ((token + 1) % size == 0)
        offsets.push_back(int32_t(stateRow.size()));
    }
    const torch::Device device = blocks.v.device();
    const torch::ScalarType type = blocks.v.scalar_type();
    auto rowsOf = [&](const std::vector<int64_t> &index) {
      return torch::tensor(index, torch::kLong).to(device);
    };
    // [one row of zeros | parts...] flattened over tokens, picked by `index`.
    auto pick = [&](std::vector<Tensor> parts, const Tensor &index, torch::ScalarType dtype) {
      for (Tensor &part : parts)
        part = part.flatten(0, 1);
      parts.insert(parts.end() - 1, torch::zeros_like(parts.back().narrow(0, 0, 1)));
      return torch::cat(parts).index_select(0, index).unsqueeze(0).to(dtype);
    };
    // Undefined context inputs: no block sees context.
    auto withContext = [&](const Tensor &contextPart, const Tensor &blockPart) {
      return contextPart.defined() ? std::vector<Tensor>{contextPart, blockPart}
                                   : std::vector<Tensor>{blockPart};
    };
    const Tensor states = rowsOf(stateRow);
    GatedDeltaOptions normalised;
    const GatedDeltaRuleInputs &c = call.context;
    GatedDeltaInputs in;
    const torch::ScalarType gateType = device.is_cuda() ? torch::kFloat : blocks.g.scalar_type();
    in.k = pick(withContext(c.k.defined() ? perValueHead(c.k, heads, normalised) : Tensor(),
                            perValueHead(blocks.k, heads, normalised)),
                states, type);
    in.v = pick(withContext(c.v, blocks.v), states, type);
    in.g = pick(withContext(c.g, blocks.g), states, gateType);
    in.beta = pick(withContext(c.beta, blocks.beta), states, type);
    in.q = torch::cat({torch::zeros({1, heads, blocks.q.size(3)}, blocks.q.options().dtype(
                                                                       computeType(blocks.q))),
                       initialStateQueries(blocks.q, blocks.k, blocks.g, blocks.beta)
                           .reshape({blockTokens, heads, -1}),
                       perValueHead(blocks.q, heads, normalised).reshape({blockTokens, heads, -1})})
               .index_select(0, rowsOf(queryRow))
               .unsqueeze(0)
               .to(type);
    in.cuSeqlens = torch::tensor(offsets, torch::kInt);
    const Tensor out = gatedDelta(bundle, spec, in).out[0];
    const Tensor outputs = torch::cat({torch::zeros({1, heads, out.size(2)}, out.options()), out});
    return (outputs.index_select(0, rowsOf(probeOutput)) +
            outputs.index_select(0, rowsOf(ownOutput)))
        .view({rows, size, heads, -1});
  };
}

} // namespace dflex::runtime::models
