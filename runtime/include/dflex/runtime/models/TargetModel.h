// The target models a drafter learns from, for inference without gradients:
// Qwen3 (dense) and the Qwen3.5 hybrid text model (gated-delta layers
// between gated full-attention layers), loaded from a Hugging Face model
// directory (config.json + safetensors, single or sharded). The forward pass
// returns the hidden states of chosen layers and, on request, the logits
// (docs/models.md).
#pragma once

#include "dflex/runtime/checkpoint/ModelConfig.h"
#include "dflex/runtime/models/GatedDeltaRule.h"
#include "dflex/runtime/models/Layers.h"

#include <torch/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dflex::runtime::models {

/// One causal self-attention call of a target layer: q [B, T, Hq, D], k and
/// v [B, T, Hkv, D] after the norms and RoPE. Returns [B, T, Hq, D].
struct SelfAttentionCall {
  const torch::Tensor &q, &k, &v;
  const TokenLayout &layout;
  std::optional<int64_t> window; ///< sliding-window layers
  double scale;
};
using SelfAttentionFn = std::function<torch::Tensor(const SelfAttentionCall &)>;

/// One gated-delta call of a Qwen3.5 linear-attention layer (shapes as
/// gatedDeltaRule; q and k not yet L2-normalised).
struct GatedDeltaCall {
  const torch::Tensor &q, &k, &v, &g, &beta;
  const TokenLayout &layout;
};
using GatedDeltaFn = std::function<torch::Tensor(const GatedDeltaCall &)>;

struct TargetModelOptions {
  torch::ScalarType dtype = torch::kBFloat16;
  torch::Device device = torch::kCPU;
  /// Hook points for the GPU kernels: the dflex attention op with a
  /// document-causal spec and the dflex gated-delta op (attentionHook and
  /// gatedDeltaHook, models/KernelHooks.h). Empty: causalAttention and
  /// gatedDeltaRule in plain LibTorch.
  SelfAttentionFn attention;
  GatedDeltaFn gatedDelta;
};

struct TargetInputs {
  torch::Tensor inputIds; ///< int64 [B, T]
  /// int64 [B, T]; default: 0, 1, ... per sequence of the layout.
  torch::Tensor positionIds;
  /// int32 [S + 1] over the flattened B*T tokens (TrainingBatch::cuSeqlens):
  /// packed rows, every segment an independent sequence (attention, the
  /// gated-delta state and its convolution all restart). Undefined: one
  /// sequence per row.
  torch::Tensor cuSeqlens;
  /// Layers whose outputs to return, each in [0, L): layer l is the output
  /// of decoder layer l before any final norm (Hugging Face's
  /// hidden_states[l + 1] for l < L - 1).
  std::vector<int64_t> captureLayers;
  /// Also run the final norm and the LM head. Without it the pass stops
  /// after the last captured layer.
  bool computeLogits = false;
};

struct TargetOutputs {
  std::vector<torch::Tensor> hiddenStates; ///< per captureLayers: [B, T, H]
  torch::Tensor finalHidden;               ///< after the final norm (with logits)
  torch::Tensor logits;                    ///< [B, T, V] (with computeLogits)
};

class TargetModel {
public:
  /// Reads `directory`/config.json (Qwen3 or Qwen3.5) and its safetensors
  /// checkpoint; weights are converted to options.dtype on options.device.
  /// Qwen3.5 tensors may sit under "model.language_model." (the multimodal
  /// checkpoints) or "model."; vision and MTP tensors are ignored. Missing or
  /// mis-shaped tensors are FormatErrors naming the tensor.
  static TargetModel load(const std::string &directory, const TargetModelOptions &options = {});

  const TransformerConfig &config() const { return config_; }
  torch::ScalarType dtype() const { return options_.dtype; }
  torch::Device device() const { return options_.device; }

  /// Runs without autograd. Inputs may be on any device (moved to the
  /// model's).
  TargetOutputs forward(const TargetInputs &inputs) const;

  /// The frozen weights a drafter borrows: [V, H] each (the same tensor when
  /// the embeddings are tied).
  const torch::Tensor &embedTokens() const { return embedTokens_; }
  const torch::Tensor &lmHead() const { return lmHead_; }

private:
  struct AttentionWeights {
    torch::Tensor q, k, v, o;
    torch::Tensor qBias, kBias, vBias, oBias; ///< attention_bias only
    torch::Tensor qNorm, kNorm;
  };
  struct GatedDeltaWeights {
    torch::Tensor inProjQkv, inProjZ, inProjB, inProjA;
    torch::Tensor conv; ///< [C, 1, K]
    torch::Tensor dtBias, aLog, norm, outProj;
  };
  struct LayerWeights {
    LayerKind kind = LayerKind::FullAttention;
    torch::Tensor inputNorm, postAttentionNorm;
    AttentionWeights attention;   ///< full and sliding-window layers
    GatedDeltaWeights gatedDelta; ///< linear-attention layers
    torch::Tensor mlpGate, mlpUp, mlpDown;
  };

  TargetModel(TransformerConfig config, TargetModelOptions options);
  torch::Tensor norm(const torch::Tensor &x, const torch::Tensor &weight) const;
  torch::Tensor attentionLayer(const LayerWeights &layer, const torch::Tensor &x,
                               const std::pair<torch::Tensor, torch::Tensor> &rope,
                               const TokenLayout &layout) const;
  torch::Tensor gatedDeltaLayer(const GatedDeltaWeights &layer, const torch::Tensor &x,
                                const TokenLayout &layout) const;

  TransformerConfig config_;
  TargetModelOptions options_;
  bool zeroCenteredNorms_ = false;
  RotaryEmbedding rotary_;
  torch::Tensor embedTokens_, lmHead_, finalNorm_;
  std::vector<LayerWeights> layers_;
};

} // namespace dflex::runtime::models
