#include "dflex/runtime/models/Drafter.h"

#include "dflex/runtime/attention/AttentionOp.h"
#include "dflex/Support/Error.h"
#include "dflex/runtime/checkpoint/SafeTensors.h"
#include "dflex/runtime/models/GatedDeltaRule.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

namespace dflex::runtime::models {

namespace {

using torch::Tensor;

std::string shapeOf(const Tensor &t) { return c10::str(t.sizes()); }

/// The checkpoint config's spelling of a parameter dtype.
std::string dtypeName(torch::ScalarType dtype) {
  switch (dtype) {
  case torch::kBFloat16: return "bfloat16";
  case torch::kHalf: return "float16";
  case torch::kFloat: return "float32";
  case torch::kDouble: return "float64";
  default:
    throw FormatError(std::string("drafter: parameters of dtype ") + c10::toString(dtype) +
                      " cannot be saved");
  }
}

void checkDrafterConfig(const DrafterConfig &config) {
  const TransformerConfig &c = config.model;
  const std::string where = "drafter config";
  checkDecoderConfig(c, where);
  if (c.attentionOutputGate)
    throw FormatError(where + ": an attention output gate is not supported in drafter layers");
  for (size_t i = 0; i < c.layerKinds.size(); ++i) {
    if (c.layerKinds[i] == LayerKind::LinearAttention && !c.gatedDelta)
      throw FormatError(where + ": layer " + std::to_string(i) +
                        " is a linear_attention layer but linear_num_key_heads, "
                        "linear_num_value_heads, linear_key_head_dim, linear_value_head_dim "
                        "and linear_conv_kernel_dim are not set");
    if (c.layerKinds[i] == LayerKind::SlidingAttention && !c.slidingWindow)
      throw FormatError(where + ": layer " + std::to_string(i) +
                        " is a sliding_attention layer but sliding_window is not set");
  }
  if (c.gatedDelta && (c.gatedDelta->numKeyHeads <= 0 ||
                       c.gatedDelta->numValueHeads % c.gatedDelta->numKeyHeads != 0))
    throw FormatError(where + ": linear_num_value_heads " +
                      std::to_string(c.gatedDelta->numValueHeads) +
                      " is not a multiple of linear_num_key_heads " +
                      std::to_string(c.gatedDelta->numKeyHeads));
  if (config.dflash.targetLayerIds.empty())
    throw FormatError(where + ": dflash_config.target_layer_ids is empty");
  if (config.dflash.blockSize <= 0)
    throw FormatError(where + ": block_size must be positive");
}

torch::nn::Linear makeLinear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

/// Registers `value` at the dotted `path` below `module` ("conv1d.weight":
/// parameter weight of a plain submodule conv1d, made when missing), so that
/// named_parameters() are the checkpoint's names.
torch::Tensor registerAt(torch::nn::Module &module, const std::string &path, torch::Tensor value) {
  const size_t dot = path.find('.');
  if (dot == std::string::npos)
    return module.register_parameter(path, std::move(value));
  const std::string child = path.substr(0, dot);
  const auto children = module.named_children();
  const std::shared_ptr<torch::nn::Module> *existing = children.find(child);
  std::shared_ptr<torch::nn::Module> submodule =
      existing ? *existing : module.register_module(child, std::make_shared<torch::nn::Module>());
  return registerAt(*submodule, path.substr(dot + 1), std::move(value));
}

} // namespace

// --- The DFlash mask and the attention backends ---------------------------------

Tensor dflashMask(const DFlashBlocks &blocks, std::optional<int64_t> window) {
  const Tensor &anchors = blocks.anchors;
  if (!anchors.defined() || anchors.dim() != 2 || !blocks.blockValid.defined() ||
      blocks.blockValid.sizes() != anchors.sizes() || !blocks.contextStart.defined() ||
      blocks.contextStart.sizes() != anchors.sizes())
    throw FormatError("DFlash mask: anchors, block_valid and context_start must be [B, N]");
  const int64_t blockSize = blocks.blockSize, contextLength = blocks.contextLength;
  const int64_t queries = anchors.size(1) * blockSize;
  const auto options = torch::TensorOptions(torch::kLong).device(anchors.device());
  const Tensor query = torch::arange(queries, options);
  const Tensor queryBlock = torch::div(query, blockSize, "floor");
  const Tensor queryOffset = query - queryBlock * blockSize; // j
  // Per query [B, Q]: its block's anchor, context start and validity.
  const Tensor anchor = anchors.to(torch::kLong).index_select(1, queryBlock).unsqueeze(-1);
  const Tensor start = blocks.contextStart.to(torch::kLong).index_select(1, queryBlock).unsqueeze(-1);
  const Tensor valid = blocks.blockValid.to(torch::kBool).index_select(1, queryBlock).unsqueeze(-1);

  const Tensor context = torch::arange(contextLength, options);
  Tensor seesContext = (context >= start) & (context < anchor) & valid; // [B, Q, T]
  Tensor seesBlock = (queryBlock.unsqueeze(1) == queryBlock.unsqueeze(0)).unsqueeze(0) & valid;
  if (window) {
    seesContext = seesContext & ((anchor + queryOffset.unsqueeze(-1)) - context < *window);
    const Tensor distance = queryOffset.unsqueeze(1) - queryOffset.unsqueeze(0); // j - j'
    seesBlock = seesBlock & ((distance >= 0) & (distance < *window)).unsqueeze(0);
  }
  return torch::cat({seesContext, seesBlock}, -1);
}

namespace {

void checkAttentionShapes(const Tensor &q, const Tensor &k, const Tensor &v,
                          const DFlashBlocks &blocks) {
  const int64_t queries = blocks.anchors.size(1) * blocks.blockSize;
  if (q.dim() != 4 || k.dim() != 4 || k.sizes() != v.sizes() || q.size(0) != k.size(0) ||
      q.size(1) != queries || k.size(1) != blocks.contextLength + queries ||
      k.size(2) == 0 || q.size(2) % k.size(2) != 0 || q.size(3) != k.size(3))
    throw FormatError("drafter attention: expected q [B, N*K = " + std::to_string(queries) +
                      ", Hq, D] and k, v [B, T + N*K = " +
                      std::to_string(blocks.contextLength + queries) +
                      ", Hkv, D] with Hq a multiple of Hkv, got q " + shapeOf(q) + ", k " +
                      shapeOf(k) + ", v " + shapeOf(v));
}

std::optional<int64_t> layerWindow(LayerKind kind, std::optional<int64_t> window) {
  if (kind != LayerKind::SlidingAttention)
    return std::nullopt;
  if (!window)
    throw FormatError("drafter attention: a sliding-window layer needs a window");
  return window;
}

} // namespace

Tensor DenseDrafterAttention::attend(const Tensor &q, const Tensor &k, const Tensor &v,
                                     const DFlashBlocks &blocks, LayerKind kind,
                                     std::optional<int64_t> window, double scale) const {
  checkAttentionShapes(q, k, v, blocks);
  const int64_t groups = q.size(2) / k.size(2);
  const Tensor visible = dflashMask(blocks, layerWindow(kind, window)).unsqueeze(1);
  const torch::ScalarType wide = q.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  const Tensor qh = q.transpose(1, 2).to(wide);
  const Tensor kh = repeatHeads(k, groups).transpose(1, 2).to(wide);
  const Tensor vh = repeatHeads(v, groups).transpose(1, 2).to(wide);
  const Tensor scores = torch::matmul(qh, kh.transpose(-1, -2)) * scale;
  // The lowest finite value instead of -inf keeps rows that see nothing
  // finite (uniform weights), and multiplying by the mask zeroes them, and
  // their gradients.
  const double lowest = wide == torch::kDouble ? std::numeric_limits<double>::lowest()
                                               : std::numeric_limits<float>::lowest();
  const Tensor weights =
      torch::softmax(scores.masked_fill(visible.logical_not(), lowest), -1) * visible;
  return torch::matmul(weights, vh).transpose(1, 2).to(q.scalar_type());
}

BundleDrafterAttention::BundleDrafterAttention(std::shared_ptr<const KernelBundle> bundle,
                                               const std::string &fullAttentionSpec,
                                               const std::string &slidingWindowSpec,
                                               std::shared_ptr<const KernelBundle> slidingWindowBundle)
    : bundle_(std::move(bundle)), fullSpec_(&bundle_->attention(fullAttentionSpec)),
      slidingBundle_(slidingWindowBundle ? std::move(slidingWindowBundle) : bundle_),
      slidingSpec_(slidingWindowSpec.empty() ? nullptr
                                             : &slidingBundle_->attention(slidingWindowSpec)) {}

std::vector<Tensor> BundleDrafterAttention::captures(const AttentionKernelSpec &spec,
                                                    const std::string &where,
                                                    const DFlashBlocks &blocks,
                                                    std::optional<int64_t> window) const {
  const Tensor valid = blocks.blockValid.to(torch::kBool);
  std::vector<Tensor> captures;
  bool hasContextStart = false;
  for (const std::string &name : spec.captureNames()) {
    if (name == "anchors") {
      captures.push_back(
          torch::where(valid, blocks.anchors.to(torch::kLong), -1).to(torch::kInt).contiguous());
    } else if (name == "ctx_len") {
      captures.push_back(torch::tensor(blocks.contextLength, torch::kLong));
    } else if (name == "window") {
      if (!window)
        throw FormatError(where + ": the spec captures a window, the layer has none");
      captures.push_back(torch::tensor(*window, torch::kLong));
    } else if (name == "context_start") {
      hasContextStart = true;
      captures.push_back(
          torch::where(valid, blocks.contextStart.to(torch::kLong), 0).to(torch::kInt).contiguous());
    } else {
      throw FormatError(where + ": capture '" + name +
                        "' is not one the drafter provides (anchors, ctx_len, window, "
                        "context_start)");
    }
  }
  if (!hasContextStart && (valid & (blocks.contextStart > 0)).any().item<bool>())
    throw FormatError(where + ": the spec's mask has no context_start capture, but blocks of "
                              "this batch see context from a later document start (packed "
                              "rows); use a spec with context_start");
  return captures;
}

const AttentionKernelSpec &BundleDrafterAttention::specFor(std::optional<int64_t> window,
                                                           std::string &where) const {
  if (window && !slidingSpec_)
    throw FormatError("drafter attention (bundle " + bundle_->directory() +
                      "): no spec was given for sliding-window layers");
  const AttentionKernelSpec &spec = window ? *slidingSpec_ : *fullSpec_;
  where = "drafter attention (bundle " + (window ? slidingBundle_ : bundle_)->directory() +
          ", spec '" + spec.name + "')";
  return spec;
}

Tensor BundleDrafterAttention::attend(const Tensor &q, const Tensor &k, const Tensor &v,
                                      const DFlashBlocks &blocks, LayerKind kind,
                                      std::optional<int64_t> window, double scale) const {
  checkAttentionShapes(q, k, v, blocks);
  const std::optional<int64_t> layerWindowSize = layerWindow(kind, window);
  std::string where;
  const AttentionKernelSpec &spec = specFor(layerWindowSize, where);
  if (std::abs(double(spec.scale) - scale) > 1e-6 * scale)
    throw FormatError(where + ": the spec's scale " + std::to_string(spec.scale) +
                      " differs from the layer's 1/sqrt(head_dim) = " + std::to_string(scale));
  return attention(layerWindowSize ? slidingBundle_ : bundle_, spec, q, k, v,
                   captures(spec, where, blocks, layerWindowSize))
      .out;
}

void BundleDrafterAttention::checkMask(int64_t blockSize, std::optional<int64_t> window) const {
  // Two documents of a packed row ([0, 9) and [9, 3 K + 9)), anchors in
  // both and a padding block: every part of the pattern shows.
  const int64_t context = 3 * blockSize + 9;
  DFlashBlocks blocks;
  blocks.anchors = torch::tensor({{3L, 9L + blockSize, 0L}}).reshape({1, 3});
  blocks.blockValid = torch::tensor({{true, true, false}}).reshape({1, 3});
  blocks.contextStart = torch::tensor({{0L, 9L, 0L}}).reshape({1, 3});
  blocks.blockSize = blockSize;
  blocks.contextLength = context;
  std::string where;
  const AttentionKernelSpec &spec = specFor(window, where);
  const Tensor mask = attentionMask(spec, captures(spec, where, blocks, window), 1, 3 * blockSize,
                                    context + 3 * blockSize);
  const Tensor expected = dflashMask(blocks, window);
  const Tensor wrong = (mask[0] != expected).nonzero();
  if (wrong.size(0) == 0)
    return;
  const int64_t head = wrong[0][0].item<int64_t>(), q = wrong[0][1].item<int64_t>(),
                kv = wrong[0][2].item<int64_t>();
  throw FormatError(where + ": the mask is not the DFlash pattern of block_size " +
                    std::to_string(blockSize) +
                    (window ? " and sliding window " + std::to_string(*window) : std::string()) +
                    ": on a probe of a packed row, query " + std::to_string(q) + " of head " +
                    std::to_string(head) + (mask[0][head][q][kv].item<bool>() ? " sees" : " does not see") +
                    " key " + std::to_string(kv) + " (the mask's block size is fixed in its body)");
}

// --- Modules ----------------------------------------------------------------------

RmsNormImpl::RmsNormImpl(int64_t size, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({size}));
}

Tensor RmsNormImpl::forward(const Tensor &x) const { return rmsNorm(x, weight, eps_); }

DrafterSelfAttentionImpl::DrafterSelfAttentionImpl(const TransformerConfig &c) {
  const int64_t qWidth = c.numAttentionHeads * c.headDim, kvWidth = c.numKeyValueHeads * c.headDim;
  q_proj = register_module("q_proj", makeLinear(c.hiddenSize, qWidth, c.attentionBias));
  k_proj = register_module("k_proj", makeLinear(c.hiddenSize, kvWidth, c.attentionBias));
  v_proj = register_module("v_proj", makeLinear(c.hiddenSize, kvWidth, c.attentionBias));
  o_proj = register_module("o_proj", makeLinear(qWidth, c.hiddenSize, c.attentionBias));
  q_norm = register_module("q_norm", RmsNorm(c.headDim, c.rmsNormEps));
  k_norm = register_module("k_norm", RmsNorm(c.headDim, c.rmsNormEps));
}

SwiGluMlpImpl::SwiGluMlpImpl(const TransformerConfig &c) {
  gate_proj = register_module("gate_proj", makeLinear(c.hiddenSize, c.intermediateSize, false));
  up_proj = register_module("up_proj", makeLinear(c.hiddenSize, c.intermediateSize, false));
  down_proj = register_module("down_proj", makeLinear(c.intermediateSize, c.hiddenSize, false));
}

Tensor SwiGluMlpImpl::forward(const Tensor &x) const {
  return swiGlu(x, gate_proj->weight, up_proj->weight, down_proj->weight);
}

DrafterGatedDeltaImpl::DrafterGatedDeltaImpl(const TransformerConfig &c)
    : config_(c.gatedDelta.value()), eps_(c.rmsNormEps) {
  for (const GatedDeltaTensor &t : gatedDeltaTensors(config_, c.hiddenSize))
    weights.*t.member = registerAt(*this, t.name, torch::empty(t.shape));
}

void DrafterGatedDeltaImpl::initialise(at::Generator &generator) {
  torch::NoGradGuard noGrad;
  for (Tensor GatedDeltaWeights::*linear :
       {&GatedDeltaWeights::inProjQkv, &GatedDeltaWeights::inProjZ, &GatedDeltaWeights::inProjB,
        &GatedDeltaWeights::inProjA, &GatedDeltaWeights::conv, &GatedDeltaWeights::outProj})
    (weights.*linear).normal_(0.0, 0.02, generator);
  weights.aLog.uniform_(0.0, 16.0, generator).log_();
  weights.dtBias.fill_(1.0);
  weights.norm.fill_(1.0);
}

std::vector<std::vector<int64_t>> DrafterGatedDeltaCall::blocksOfRuns() const {
  std::vector<std::vector<int64_t>> members(runOffsets.size() - 1);
  for (size_t block = 0; block < blockRun.size(); ++block)
    if (blockRun[block] >= 0)
      members.at(size_t(blockRun[block])).push_back(int64_t(block));
  for (std::vector<int64_t> &order : members)
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return blockAfter[size_t(a)] < blockAfter[size_t(b)]; });
  return members;
}

Tensor drafterGatedDeltaRule(const DrafterGatedDeltaCall &call) {
  const GatedDeltaRuleInputs &blocks = call.blocks;
  const int64_t rows = blocks.v.size(0);
  const std::vector<std::vector<int64_t>> members = call.blocksOfRuns();
  const int64_t runs = int64_t(members.size());
  std::vector<Tensor> states{torch::zeros({1, blocks.v.size(2), blocks.q.size(3), blocks.v.size(3)},
                                          blocks.v.options().dtype(computeType(blocks.v)))};
  std::vector<int64_t> stateOf(size_t(rows), 0);
  int64_t next = 1;
  for (int64_t run = 0; run < runs; ++run) {
    if (members[size_t(run)].empty())
      continue;
    const int64_t begin = call.runOffsets[size_t(run)];
    auto piece = [&](const Tensor &x) {
      return x.narrow(1, begin, call.runOffsets[size_t(run) + 1] - begin);
    };
    std::vector<int64_t> after;
    for (int64_t block : members[size_t(run)])
      after.push_back(call.blockAfter[size_t(block)]);
    const GatedDeltaRuleInputs &in = call.context;
    // Only the states are read: the keys stand in for the queries.
    states.push_back(gatedDeltaRuleWithState(piece(in.k), piece(in.k), piece(in.v), piece(in.g),
                                             piece(in.beta), Tensor(), {}, after)
                         .states[0]);
    for (int64_t block : members[size_t(run)])
      stateOf[size_t(block)] = next++;
  }
  const Tensor initial = torch::cat(states).index_select(
      0, torch::tensor(stateOf, torch::kLong).to(blocks.v.device()));
  return gatedDeltaRuleWithState(blocks.q, blocks.k, blocks.v, blocks.g, blocks.beta, initial,
                                 shortCallOptions(blocks.v.size(1)))
      .output;
}

Tensor DrafterGatedDeltaImpl::forward(const Tensor &context, const Tensor &h,
                                      const DFlashBlocks &blocks,
                                      const DrafterGatedDeltaFn &rule) const {
  const GatedDeltaConfig &g = config_;
  const int64_t count = blocks.anchors.size(1), blockSize = blocks.blockSize;
  if (context.dim() != 3 || h.dim() != 3 || h.size(0) != context.size(0) ||
      h.size(1) != count * blockSize || h.size(2) != context.size(2) ||
      context.size(1) != blocks.contextLength)
    throw FormatError("drafter gated delta: expected context [B, T = " +
                      std::to_string(blocks.contextLength) + ", H] and h [B, N*K = " +
                      std::to_string(count * blockSize) + ", H], got context " + shapeOf(context) +
                      ", h " + shapeOf(h));
  const int64_t batch = context.size(0), contextLength = context.size(1);
  const int64_t rows = batch * count; // every block of the batch, padding included
  const torch::Device device = context.device();
  const Tensor contextMixed = at::linear(context, weights.inProjQkv); // [B, T, C]
  const int64_t width = contextMixed.size(2);

  // The context runs, one per (row, context start) of the valid blocks
  // that see context: [start, the last anchor). Other blocks start from a
  // zero state.
  const Tensor anchors = blocks.anchors.to(torch::kCPU, torch::kLong).contiguous();
  const Tensor starts = blocks.contextStart.to(torch::kCPU, torch::kLong).contiguous();
  const Tensor valid = blocks.blockValid.to(torch::kCPU, torch::kBool).contiguous();
  const int64_t *anchor = anchors.data_ptr<int64_t>(), *start = starts.data_ptr<int64_t>();
  const bool *isValid = valid.data_ptr<bool>();
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> runs; // -> blocks (b N + i)
  for (int64_t block = 0; block < rows; ++block)
    if (isValid[block] && anchor[block] > start[block])
      runs[{block / count, start[block]}].push_back(block);
  std::vector<int64_t> runOffsets{0}, blockRun(size_t(rows), -1), blockAfter(size_t(rows), 0);
  std::vector<int64_t> runTokens; // flattened B*T indices of the runs' tokens
  for (const auto &[run, members] : runs) {
    const int64_t row = run.first, runStart = run.second;
    int64_t length = 0;
    for (int64_t block : members) {
      blockRun[size_t(block)] = int64_t(runOffsets.size()) - 1;
      blockAfter[size_t(block)] = anchor[block] - runStart;
      length = std::max(length, anchor[block] - runStart);
    }
    for (int64_t t = 0; t < length; ++t)
      runTokens.push_back(row * contextLength + runStart + t);
    runOffsets.push_back(runOffsets.back() + length);
  }
  GatedDeltaRuleInputs contextIn;
  if (!runTokens.empty()) {
    const Tensor index = torch::tensor(runTokens, torch::kLong).to(device);
    auto gathered = [&](const Tensor &x) {
      return x.reshape({-1, x.size(2)}).index_select(0, index).unsqueeze(0);
    };
    const Tensor convolved =
        causalDepthwiseConv(gathered(contextMixed), weights.conv,
                            TokenLayout::packed(torch::tensor(runOffsets, torch::kLong), 1,
                                                runOffsets.back(), device));
    contextIn = gatedDeltaRuleInputs(g, weights, convolved, gathered(context));
  }

  // The blocks' convolution reads the Kc - 1 context inputs before the
  // anchor (zeros before the context start), then the block's.
  const int64_t history = g.convKernelDim - 1;
  const auto longs = torch::TensorOptions(torch::kLong).device(device);
  const Tensor positions =
      blocks.anchors.to(longs).unsqueeze(-1) + torch::arange(-history, 0, longs); // [B, N, Kc-1]
  const Tensor seen = positions >= blocks.contextStart.to(longs).unsqueeze(-1);
  // Rows padded in front by Kc - 1 zeros: position p of row b is padded row
  // b (T + Kc - 1) + p + Kc - 1.
  const Tensor padded =
      torch::constant_pad_nd(contextMixed, {0, 0, history, 0}).reshape({-1, width});
  const Tensor flat = positions + history +
                      torch::arange(batch, longs).view({batch, 1, 1}) * (contextLength + history);
  const Tensor before = padded.index_select(0, flat.view({-1})).view({rows, history, width}) *
                        seen.view({rows, history, 1}).to(padded.scalar_type());
  const Tensor x = h.reshape({rows, blockSize, h.size(2)});
  const Tensor window = torch::cat({before, at::linear(x, weights.inProjQkv)}, 1);
  const Tensor convolved = causalDepthwiseConv(window, weights.conv,
                                               TokenLayout::rows(rows, history + blockSize, device))
                              .narrow(1, history, blockSize);
  const GatedDeltaRuleInputs in = gatedDeltaRuleInputs(g, weights, convolved, x);
  const DrafterGatedDeltaCall call{contextIn, runOffsets, blockRun, blockAfter, in};
  const Tensor core = rule ? rule(call) : drafterGatedDeltaRule(call);
  const Tensor blockValid = blocks.blockValid.to(device, x.scalar_type()).view({rows, 1, 1});
  return (gatedDeltaOutput(g, weights, core, x, eps_) * blockValid)
      .view({batch, count * blockSize, -1});
}

DrafterLayerImpl::DrafterLayerImpl(const TransformerConfig &c, LayerKind kind) {
  input_layernorm = register_module("input_layernorm", RmsNorm(c.hiddenSize, c.rmsNormEps));
  if (kind == LayerKind::LinearAttention)
    linear_attn = register_module("linear_attn", DrafterGatedDelta(c));
  else
    self_attn = register_module("self_attn", DrafterSelfAttention(c));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RmsNorm(c.hiddenSize, c.rmsNormEps));
  mlp = register_module("mlp", SwiGluMlp(c));
}

DFlashDrafterImpl::DFlashDrafterImpl(const DrafterConfig &config, int64_t targetHiddenSize,
                                     uint64_t seed)
    : config_((checkDrafterConfig(config), config)),
      rotary_(config.model.rope, config.model.headDim),
      attention_(std::make_shared<DenseDrafterAttention>()) {
  const TransformerConfig &c = config_.model;
  const int64_t targetHidden = targetHiddenSize > 0 ? targetHiddenSize : c.hiddenSize;
  const int64_t features = int64_t(config_.dflash.targetLayerIds.size()) * targetHidden;
  fc = register_module("fc", makeLinear(features, c.hiddenSize, false));
  hidden_norm = register_module("hidden_norm", RmsNorm(c.hiddenSize, c.rmsNormEps));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.numHiddenLayers; ++i) {
    auto layer = std::make_shared<DrafterLayerImpl>(c, c.layerKinds.at(i));
    layers->push_back(layer);
    layerList_.push_back(layer);
  }
  norm = register_module("norm", RmsNorm(c.hiddenSize, c.rmsNormEps));

  // Qwen3's initialisation: linear weights normal(0, 0.02), biases 0, norms 1.
  torch::NoGradGuard noGrad;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto &module : modules(/*include_self=*/false)) {
    if (auto *linearModule = module->as<torch::nn::Linear>()) {
      linearModule->weight.normal_(0.0, 0.02, generator);
      if (linearModule->bias.defined())
        linearModule->bias.zero_();
    } else if (auto *gatedDelta = module->as<DrafterGatedDeltaImpl>()) {
      gatedDelta->initialise(generator);
    }
  }
}

std::shared_ptr<DFlashDrafterImpl> DFlashDrafterImpl::load(const std::string &directory,
                                                            torch::ScalarType dtype,
                                                            torch::Device device) {
  const DrafterConfig config = loadDrafterConfig(directory);
  const SafeTensorsCheckpoint checkpoint = SafeTensorsCheckpoint::open(directory);
  if (!checkpoint.contains("fc.weight"))
    throw FormatError(checkpoint.source() + ": missing tensor 'fc.weight'");
  const int64_t features = checkpoint.info("fc.weight").shape.at(1);
  const int64_t count = int64_t(config.dflash.targetLayerIds.size());
  if (count == 0 || features % count != 0)
    throw FormatError(checkpoint.source() + ": fc.weight has " + std::to_string(features) +
                      " input features, not a multiple of the " + std::to_string(count) +
                      " target layers");
  auto drafter = std::make_shared<DFlashDrafterImpl>(config, features / count);
  torch::NoGradGuard noGrad;
  std::set<std::string> expected;
  for (auto &item : drafter->named_parameters()) {
    const std::string &name = item.key();
    expected.insert(name);
    if (!checkpoint.contains(name))
      throw FormatError(checkpoint.source() + ": missing tensor '" + name + "'");
    const Tensor stored = checkpoint.tensor(name);
    if (stored.sizes() != item.value().sizes())
      throw FormatError(checkpoint.source() + ": tensor '" + name + "' has shape " +
                        shapeOf(stored) + ", the config implies " + shapeOf(item.value()));
    item.value().copy_(stored);
  }
  std::string unknown;
  for (const std::string &name : checkpoint.names())
    if (!expected.count(name))
      unknown += (unknown.empty() ? "" : ", ") + name;
  if (!unknown.empty())
    throw FormatError(checkpoint.source() + ": tensors the drafter does not have: " + unknown);
  drafter->to(device, dtype);
  return drafter;
}

void DFlashDrafterImpl::save(const std::string &directory,
                             std::optional<torch::ScalarType> dtype,
                             uint64_t maxShardBytes) const {
  NamedTensors tensors;
  torch::ScalarType savedType = fc->weight.scalar_type();
  for (const auto &item : named_parameters()) {
    Tensor value = item.value().detach();
    if (dtype)
      value = value.to(*dtype);
    savedType = value.scalar_type();
    tensors.emplace_back(item.key(), value);
  }
  DrafterConfig saved = config_;
  saved.model.dtype = dtypeName(savedType);
  std::filesystem::create_directories(directory);
  saveSafeTensorsCheckpoint(directory, tensors, maxShardBytes);
  saveDrafterConfig(directory, saved);
}

void DFlashDrafterImpl::setTargetWeights(Tensor embedTokens, Tensor lmHead) {
  const int64_t hidden = config_.model.hiddenSize;
  if (!embedTokens.defined() || embedTokens.dim() != 2 || embedTokens.size(1) != hidden ||
      !lmHead.defined() || lmHead.dim() != 2 || lmHead.size(1) != hidden)
    throw FormatError("drafter: the target's embedding and LM head must be [V, " +
                      std::to_string(hidden) + "] (the drafter's hidden size)");
  embedTokens_ = embedTokens.detach();
  lmHead_ = lmHead.detach();
}

void DFlashDrafterImpl::setAttention(std::shared_ptr<const DrafterAttention> attention) {
  if (!attention)
    throw FormatError("drafter: the attention must not be null");
  attention_ = std::move(attention);
}

void DFlashDrafterImpl::setGatedDelta(DrafterGatedDeltaFn rule) { gatedDelta_ = std::move(rule); }

Tensor DFlashDrafterImpl::forward(const DrafterInputs &in) {
  const TransformerConfig &c = config_.model;
  if (!embedTokens_.defined())
    throw FormatError("drafter forward: setTargetWeights() was not called");
  const Tensor &features = in.contextFeatures;
  if (!features.defined() || features.dim() != 3 || features.size(2) != fc->weight.size(1))
    throw FormatError("drafter forward: context features must be [B, T, " +
                      std::to_string(fc->weight.size(1)) + "], got " +
                      (features.defined() ? shapeOf(features) : std::string("none")));
  const int64_t batch = features.size(0), contextLength = features.size(1);
  const Tensor &tokens = in.blockTokens;
  if (!tokens.defined() || tokens.dim() != 3 || tokens.size(0) != batch ||
      tokens.size(2) != config_.dflash.blockSize || !in.blockPositions.defined() ||
      in.blockPositions.sizes() != tokens.sizes() || !in.contextPositions.defined() ||
      in.contextPositions.sizes() != features.sizes().slice(0, 2) ||
      in.blocks.blockSize != config_.dflash.blockSize ||
      in.blocks.contextLength != contextLength || !in.blocks.anchors.defined() ||
      in.blocks.anchors.sizes() != tokens.sizes().slice(0, 2))
    throw FormatError("drafter forward: expected block tokens and positions [B, N, K = " +
                      std::to_string(config_.dflash.blockSize) +
                      "], context positions [B, T], blocks of K and T matching, got features " +
                      shapeOf(features) + ", block tokens " +
                      (tokens.defined() ? shapeOf(tokens) : std::string("none")));
  const int64_t blocks = tokens.size(1), queries = blocks * tokens.size(2);
  const int64_t headDim = c.headDim;
  const torch::ScalarType dtype = fc->weight.scalar_type();

  // Target hidden states may come in the target's dtype (bfloat16).
  const Tensor context = hidden_norm(fc(features.to(dtype)));
  Tensor x = torch::embedding(embedTokens_, tokens.reshape({batch, queries})).to(dtype);
  const Tensor queryPositions = in.blockPositions.reshape({batch, queries});
  const auto queryRope = rotary_.table(queryPositions, dtype);
  const auto keyRope = rotary_.table(torch::cat({in.contextPositions, queryPositions}, 1), dtype);
  const double scale = 1.0 / std::sqrt(double(headDim));
  for (size_t i = 0; i < layerList_.size(); ++i) {
    DrafterLayerImpl &layer = *layerList_[i];
    const Tensor h = layer.input_layernorm(x);
    if (layer.linear_attn) {
      x = x + layer.linear_attn->forward(context, h, in.blocks, gatedDelta_);
    } else {
      DrafterSelfAttentionImpl &attn = *layer.self_attn;
      const Tensor keyInput = torch::cat({context, h}, 1);
      Tensor q = attn.q_norm(attn.q_proj(h).view({batch, queries, -1, headDim}));
      Tensor k =
          attn.k_norm(attn.k_proj(keyInput).view({batch, contextLength + queries, -1, headDim}));
      const Tensor v = attn.v_proj(keyInput).view({batch, contextLength + queries, -1, headDim});
      q = applyRotary(q, queryRope.first, queryRope.second);
      k = applyRotary(k, keyRope.first, keyRope.second);
      const Tensor attended =
          attention_->attend(q, k, v, in.blocks, c.layerKinds.at(i), c.slidingWindow, scale);
      x = x + attn.o_proj(attended.reshape({batch, queries, -1}));
    }
    x = x + layer.mlp(layer.post_attention_layernorm(x));
  }
  return norm(x).view({batch, blocks, tokens.size(2), c.hiddenSize});
}

BlockLossResult DFlashDrafterImpl::loss(const Tensor &hidden, const Tensor &labels,
                                        const Tensor &weights,
                                        const BlockLossOptions &options) const {
  if (!lmHead_.defined())
    throw FormatError("drafter loss: setTargetWeights() was not called");
  return blockCrossEntropy(hidden, lmHead_, labels, weights, options);
}

Tensor concatContextFeatures(const std::vector<Tensor> &hiddenStates) {
  if (hiddenStates.empty())
    throw FormatError("context features: no target hidden states");
  return torch::cat(hiddenStates, -1);
}

} // namespace dflex::runtime::models
