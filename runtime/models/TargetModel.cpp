#include "dflex/runtime/models/TargetModel.h"

#include "dflex/Support/Error.h"
#include "dflex/runtime/checkpoint/SafeTensors.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace dflex::runtime::models {

namespace {

using torch::Tensor;

/// Reads the tensors of one checkpoint, checking shapes and converting them
/// to the model's dtype and device.
class WeightReader {
public:
  WeightReader(const SafeTensorsCheckpoint &checkpoint, std::string prefix,
               const TargetModelOptions &options)
      : checkpoint_(checkpoint), prefix_(std::move(prefix)), options_(options) {}

  Tensor operator()(const std::string &name, std::vector<int64_t> shape) const {
    return read(prefix_ + name, shape);
  }

  Tensor read(const std::string &fullName, const std::vector<int64_t> &shape) const {
    if (!checkpoint_.contains(fullName))
      throw FormatError(checkpoint_.source() + ": missing tensor '" + fullName + "'");
    Tensor t = checkpoint_.tensor(fullName);
    if (t.sizes() != torch::IntArrayRef(shape))
      throw FormatError(checkpoint_.source() + ": tensor '" + fullName + "' has shape " +
                        c10::str(t.sizes()) + ", the config implies " +
                        c10::str(torch::IntArrayRef(shape)));
    return t.to(options_.device, options_.dtype).contiguous();
  }

private:
  const SafeTensorsCheckpoint &checkpoint_;
  std::string prefix_;
  const TargetModelOptions &options_;
};

void checkSupported(const TransformerConfig &c, const std::string &where) {
  if (c.modelType != "qwen3" && c.modelType != "qwen3_5_text")
    throw FormatError(where + ": model_type '" + c.modelType +
                      "' is not supported (qwen3, qwen3_5)");
  checkDecoderConfig(c, where);
  if (c.gatedDelta && (c.gatedDelta->numKeyHeads <= 0 ||
                       c.gatedDelta->numValueHeads % c.gatedDelta->numKeyHeads != 0))
    throw FormatError(where + ": linear_num_value_heads is not a multiple of "
                              "linear_num_key_heads");
}

} // namespace

TargetModel::TargetModel(TransformerConfig config, TargetModelOptions options)
    : config_(std::move(config)), options_(std::move(options)),
      zeroCenteredNorms_(config_.modelType == "qwen3_5_text"),
      rotary_(config_.rope, config_.headDim) {}

TargetModel TargetModel::load(const std::string &directory, const TargetModelOptions &options) {
  TransformerConfig config = loadTransformerConfig(directory);
  checkSupported(config, directory + "/config.json");
  const SafeTensorsCheckpoint checkpoint = SafeTensorsCheckpoint::open(directory);
  // Multimodal Qwen3.5 checkpoints hold the language model under
  // model.language_model; text-only ones under model.
  const std::string prefix =
      checkpoint.contains("model.language_model.embed_tokens.weight") ? "model.language_model."
                                                                      : "model.";
  const WeightReader read(checkpoint, prefix, options);
  TargetModel model(config, options);
  const TransformerConfig &c = model.config_;
  const int64_t hidden = c.hiddenSize, headDim = c.headDim;
  const int64_t qWidth = c.numAttentionHeads * headDim, kvWidth = c.numKeyValueHeads * headDim;

  model.embedTokens_ = read("embed_tokens.weight", {c.vocabSize, hidden});
  model.lmHead_ = c.tieWordEmbeddings ? model.embedTokens_
                                      : read.read("lm_head.weight", {c.vocabSize, hidden});
  model.finalNorm_ = read("norm.weight", {hidden});
  for (int64_t i = 0; i < c.numHiddenLayers; ++i) {
    const std::string layer = "layers." + std::to_string(i) + ".";
    LayerWeights w;
    w.kind = c.layerKinds.at(i);
    w.inputNorm = read(layer + "input_layernorm.weight", {hidden});
    w.postAttentionNorm = read(layer + "post_attention_layernorm.weight", {hidden});
    w.mlpGateUp = torch::cat({read(layer + "mlp.gate_proj.weight", {c.intermediateSize, hidden}),
                              read(layer + "mlp.up_proj.weight", {c.intermediateSize, hidden})});
    w.mlpDown = read(layer + "mlp.down_proj.weight", {hidden, c.intermediateSize});
    if (w.kind == LayerKind::LinearAttention) {
      for (const GatedDeltaTensor &t : gatedDeltaTensors(*c.gatedDelta, hidden))
        w.gatedDelta.*t.member = read(layer + "linear_attn." + t.name, t.shape);
    } else {
      const std::string p = layer + "self_attn.";
      AttentionWeights &a = w.attention;
      // With the output gate, q_proj yields [query | gate] per head.
      const int64_t qRows = qWidth * (c.attentionOutputGate ? 2 : 1);
      a.qkv = torch::cat({read(p + "q_proj.weight", {qRows, hidden}),
                          read(p + "k_proj.weight", {kvWidth, hidden}),
                          read(p + "v_proj.weight", {kvWidth, hidden})});
      a.o = read(p + "o_proj.weight", {hidden, qWidth});
      if (c.attentionBias) {
        a.qkvBias = torch::cat({read(p + "q_proj.bias", {qRows}), read(p + "k_proj.bias", {kvWidth}),
                                read(p + "v_proj.bias", {kvWidth})});
        a.oBias = read(p + "o_proj.bias", {hidden});
      }
      a.qNorm = read(p + "q_norm.weight", {headDim});
      a.kNorm = read(p + "k_norm.weight", {headDim});
    }
    model.layers_.push_back(std::move(w));
  }
  return model;
}

Tensor TargetModel::norm(const Tensor &x, const Tensor &weight) const {
  return zeroCenteredNorms_ ? zeroCenteredRmsNorm(x, weight, config_.rmsNormEps)
                            : rmsNorm(x, weight, config_.rmsNormEps);
}

Tensor TargetModel::attentionLayer(const LayerWeights &layer, const Tensor &x,
                                   const std::pair<Tensor, Tensor> &rope,
                                   const TokenLayout &layout,
                                   TargetCache::Attention *cache) const {
  const AttentionWeights &w = layer.attention;
  const int64_t batch = x.size(0), length = x.size(1), headDim = config_.headDim;
  const int64_t kvWidth = config_.numKeyValueHeads * headDim;
  const Tensor qkv = at::linear(x, w.qkv, w.qkvBias);
  const int64_t qRows = qkv.size(-1) - 2 * kvWidth;
  Tensor projected = qkv.narrow(-1, 0, qRows).view({batch, length, config_.numAttentionHeads, -1});
  Tensor query = projected, gate;
  if (config_.attentionOutputGate) {
    query = projected.narrow(-1, 0, headDim);
    gate = projected.narrow(-1, headDim, headDim).reshape({batch, length, -1});
  }
  query = norm(query, w.qNorm);
  Tensor key = norm(qkv.narrow(-1, qRows, kvWidth).view({batch, length, -1, headDim}), w.kNorm);
  // Contiguous, as the attention paths and the cache expect their inputs.
  Tensor value = qkv.narrow(-1, qRows + kvWidth, kvWidth).contiguous().view({batch, length, -1, headDim});
  query = applyRotary(query, rope.first, rope.second);
  key = applyRotary(key, rope.first, rope.second);
  std::optional<int64_t> window;
  if (layer.kind == LayerKind::SlidingAttention)
    window = config_.slidingWindow;
  const double scale = 1.0 / std::sqrt(double(headDim));
  Tensor out;
  if (cache) {
    cache->keys = torch::cat({cache->keys, key}, 1);
    cache->values = torch::cat({cache->values, value}, 1);
    out = causalAttentionAfter(query, cache->keys, cache->values, window, scale);
  } else {
    const SelfAttentionCall call{query, key, value, layout, window, scale};
    out = options_.attention ? options_.attention(call)
                             : causalAttention(query, key, value, layout, window, scale);
  }
  out = out.reshape({batch, length, -1});
  if (gate.defined())
    out = out * torch::sigmoid(gate);
  return at::linear(out, w.o, w.oBias);
}

Tensor TargetModel::gatedDeltaLayer(const GatedDeltaWeights &w, const Tensor &x,
                                    const TokenLayout &layout,
                                    TargetCache::GatedDelta *cache) const {
  const int64_t batch = x.size(0), length = x.size(1);
  const Tensor projected = at::linear(x, w.inProjQkv);
  Tensor convolved;
  if (cache) {
    // The convolution over the cached K-1 inputs and the new ones; its
    // first K-1 outputs belong to earlier calls.
    const int64_t history = cache->conv.size(2);
    cache->convWindow = torch::cat({cache->conv.transpose(1, 2), projected}, 1);
    convolved = causalDepthwiseConv(cache->convWindow, w.conv,
                                    TokenLayout::rows(batch, history + length, x.device()))
                    .narrow(1, history, length);
    cache->conv = cache->convWindow.narrow(1, length, history).transpose(1, 2).contiguous();
  } else {
    convolved = causalDepthwiseConv(projected, w.conv, layout);
  }
  const GatedDeltaRuleInputs in = gatedDeltaRuleInputs(*config_.gatedDelta, w, convolved, x);
  Tensor core;
  if (cache) {
    GatedDeltaResult result = gatedDeltaRuleWithState(in.q, in.k, in.v, in.g, in.beta,
                                                      cache->state, shortCallOptions(length));
    cache->stateBefore = std::move(cache->state);
    cache->state = std::move(result.state);
    cache->keys = in.k;
    cache->values = in.v;
    cache->decay = in.g;
    cache->beta = in.beta;
    core = std::move(result.output);
  } else {
    const GatedDeltaCall call{in.q, in.k, in.v, in.g, in.beta, layout};
    core = options_.gatedDelta ? options_.gatedDelta(call)
                               : gatedDeltaRule(in.q, in.k, in.v, in.g, in.beta, layout);
  }
  return gatedDeltaOutput(*config_.gatedDelta, w, core, x, config_.rmsNormEps);
}

void TargetModel::startCache(TargetCache &cache, int64_t batch) const {
  const auto options = torch::TensorOptions(options_.dtype).device(options_.device);
  cache = TargetCache();
  cache.batch = batch;
  for (const LayerWeights &layer : layers_) {
    TargetCache::Layer entry;
    if (layer.kind == LayerKind::LinearAttention) {
      const GatedDeltaConfig &g = *config_.gatedDelta;
      const torch::ScalarType wide =
          options_.dtype == torch::kDouble ? torch::kDouble : torch::kFloat;
      entry.gatedDelta.state = torch::zeros(
          {batch, g.numValueHeads, g.keyHeadDim, g.valueHeadDim}, options.dtype(wide));
      entry.gatedDelta.conv = torch::zeros(
          {batch, layer.gatedDelta.conv.size(0), layer.gatedDelta.conv.size(2) - 1}, options);
    } else {
      const std::vector<int64_t> empty{batch, 0, config_.numKeyValueHeads, config_.headDim};
      entry.attention.keys = torch::empty(empty, options);
      entry.attention.values = torch::empty(empty, options);
    }
    cache.layers.push_back(std::move(entry));
  }
}

void TargetCache::truncate(int64_t newLength) {
  if (newLength < lengthBeforeLastForward || newLength > length)
    throw FormatError("target cache: cannot truncate to " + std::to_string(newLength) +
                      " tokens: only lengths from " + std::to_string(lengthBeforeLastForward) +
                      " (before the last forward) to " + std::to_string(length) +
                      " (the cache's length) can be recovered");
  if (newLength == length)
    return;
  const int64_t kept = newLength - lengthBeforeLastForward;
  for (Layer &layer : layers) {
    if (layer.attention.keys.defined()) {
      layer.attention.keys = layer.attention.keys.narrow(1, 0, newLength);
      layer.attention.values = layer.attention.values.narrow(1, 0, newLength);
    } else if (layer.gatedDelta.state.defined()) {
      GatedDelta &d = layer.gatedDelta;
      if (kept == 0) {
        d.state = d.stateBefore;
      } else {
        // The state depends on the keys, not the queries.
        auto prefix = [&](const Tensor &x) { return x.narrow(1, 0, kept); };
        const Tensor keys = prefix(d.keys);
        d.state = gatedDeltaRuleWithState(keys, keys, prefix(d.values), prefix(d.decay),
                                          prefix(d.beta), d.stateBefore, shortCallOptions(kept))
                      .state;
      }
      d.conv = d.convWindow.narrow(1, kept, d.conv.size(2)).transpose(1, 2).contiguous();
    }
  }
  length = newLength;
}

TargetOutputs TargetModel::forward(const TargetInputs &inputs) const {
  return run(inputs, nullptr);
}

TargetOutputs TargetModel::forward(const TargetInputs &inputs, TargetCache &cache) const {
  // On a shallow copy (the layers replace their tensors, never write into
  // them): a forward that throws leaves the cache as it was.
  TargetCache next = cache;
  TargetOutputs outputs = run(inputs, &next);
  cache = std::move(next);
  return outputs;
}

TargetOutputs TargetModel::run(const TargetInputs &inputs, TargetCache *cache) const {
  // No grad, but not inference mode: the captured hidden states feed the
  // drafter's autograd graph.
  torch::NoGradGuard noGrad;
  const Tensor &ids = inputs.inputIds;
  if (!ids.defined() || ids.dim() != 2 || ids.is_floating_point())
    throw FormatError("target forward: input_ids must be an integer tensor [B, T]");
  const int64_t batch = ids.size(0), length = ids.size(1), layers = config_.numHiddenLayers;
  for (int64_t layer : inputs.captureLayers)
    if (layer < 0 || layer >= layers)
      throw FormatError("target forward: capture layer " + std::to_string(layer) +
                        " is outside [0, " + std::to_string(layers) + ")");
  if (cache) {
    if (inputs.cuSeqlens.defined())
      throw FormatError("target forward with a cache: packed rows (cu_seqlens) are not "
                        "supported, one sequence per row");
    if (length < 1)
      throw FormatError("target forward with a cache: input_ids " + c10::str(ids.sizes()) +
                        " holds no token");
    if (cache->empty())
      startCache(*cache, batch);
    else if (cache->batch != batch || int64_t(cache->layers.size()) != layers)
      throw FormatError("target forward with a cache: the cache holds " +
                        std::to_string(cache->batch) + " rows of a " +
                        std::to_string(cache->layers.size()) + "-layer model, input_ids " +
                        c10::str(ids.sizes()) + " for this " + std::to_string(layers) +
                        "-layer model");
  }
  const torch::Device device = options_.device;
  const Tensor tokens = ids.to(device, torch::kLong);
  const TokenLayout layout = inputs.cuSeqlens.defined()
                                 ? TokenLayout::packed(inputs.cuSeqlens, batch, length, device)
                                 : TokenLayout::rows(batch, length, device);
  Tensor positions = inputs.positionIds.defined() ? inputs.positionIds.to(device, torch::kLong)
                     : cache                      ? layout.offsets() + cache->length
                                                  : layout.offsets();
  if (positions.sizes() != ids.sizes())
    throw FormatError("target forward: position_ids " + c10::str(positions.sizes()) +
                      " must match input_ids " + c10::str(ids.sizes()));
  const std::pair<Tensor, Tensor> rope = rotary_.table(positions, options_.dtype);

  int64_t lastLayer = inputs.computeLogits || cache ? layers - 1 : -1;
  for (int64_t layer : inputs.captureLayers)
    lastLayer = std::max(lastLayer, layer);
  TargetOutputs outputs;
  outputs.hiddenStates.resize(inputs.captureLayers.size());
  Tensor x = torch::embedding(embedTokens_, tokens);
  for (int64_t i = 0; i <= lastLayer; ++i) {
    const LayerWeights &layer = layers_[i];
    TargetCache::Layer *entry = cache ? &cache->layers[i] : nullptr;
    const Tensor normed = norm(x, layer.inputNorm);
    x = x + (layer.kind == LayerKind::LinearAttention
                 ? gatedDeltaLayer(layer.gatedDelta, normed, layout,
                                   entry ? &entry->gatedDelta : nullptr)
                 : attentionLayer(layer, normed, rope, layout,
                                  entry ? &entry->attention : nullptr));
    x = x + at::linear(swiGluOfProjection(at::linear(norm(x, layer.postAttentionNorm), layer.mlpGateUp)),
                       layer.mlpDown);
    for (size_t c = 0; c < inputs.captureLayers.size(); ++c)
      if (inputs.captureLayers[c] == i)
        outputs.hiddenStates[c] = x;
  }
  if (cache) {
    cache->lengthBeforeLastForward = cache->length;
    cache->length += length;
  }
  if (inputs.computeLogits) {
    outputs.finalHidden = norm(x, finalNorm_);
    outputs.logits = at::linear(outputs.finalHidden, lmHead_);
  }
  return outputs;
}

} // namespace dflex::runtime::models
