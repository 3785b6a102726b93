// The target models a drafter learns from, for inference without gradients:
// Qwen3 (dense) and the Qwen3.5 hybrid text model (gated-delta layers
// between gated full-attention layers), loaded from a Hugging Face model
// directory (config.json + safetensors, single or sharded). The forward pass
// returns the hidden states of chosen layers and, on request, the logits
// (docs/models.md).
#pragma once

#include "dflex/runtime/checkpoint/ModelConfig.h"
#include "dflex/runtime/models/GatedDeltaLayer.h"
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

/// What a batch of sequences has seen so far, for incremental (greedy
/// speculative) decoding with TargetModel::forward(inputs, cache): one
/// sequence per row, every row `length` tokens long. A default-constructed
/// cache is empty; the first cached forward sizes it for its model and batch.
/// Tensors sit on the model's device.
///
/// Rollback: truncate(n) keeps the first n tokens, n anywhere in
/// [lengthBeforeLastForward, length] (the draft tokens of the last call that
/// the target accepted). Attention layers cut their keys and values; a
/// gated-delta layer's state after token n is not kept per token but
/// recomputed: each cached forward keeps, per gated-delta layer, the state
/// before the call and the call's inputs of the rule and the convolution,
/// and truncate reruns the rule over the kept n - lengthBeforeLastForward
/// tokens (one chunk of the chunked rule for a draft block; the convolution
/// state is a slice). Repeated truncates within the range are allowed.
///
/// Every call replaces the cache's tensors and never writes into them: a
/// copy of a cache is an independent snapshot, and a forward that throws
/// leaves the cache as it was. The price: each call concatenates the new
/// keys and values to the cached ones (a copy of the layer's cache, linear
/// in its length), not an in-place append into preallocated memory.
struct TargetCache {
  /// A full or sliding-window attention layer: keys and values after the
  /// norms and RoPE, [B, length, Hkv, D] in the model's dtype. Sliding
  /// layers keep every key too (the mask applies the window).
  struct Attention {
    torch::Tensor keys, values;
  };
  /// A gated-delta (linear-attention) layer.
  struct GatedDelta {
    /// The recurrent state [B, Hv, Dk, Dv] in float32 (float64 for a float64
    /// model).
    torch::Tensor state;
    /// The convolution's last K-1 inputs (the in_proj_qkv outputs) [B, C,
    /// K-1] in the model's dtype; zeros before the first token.
    torch::Tensor conv;
    /// For truncate, from the last forward of n tokens: the state before it,
    /// the keys [B, n, Hk, Dk] (not L2-normalised), values [B, n, Hv, Dv],
    /// log decays and betas [B, n, Hv] it fed the rule, and the
    /// convolution's window [B, K-1+n, C] (the K-1 inputs before the call,
    /// then the call's).
    torch::Tensor stateBefore, keys, values, decay, beta, convWindow;
  };
  /// Per decoder layer; the member of the layer's kind is set.
  struct Layer {
    Attention attention;
    GatedDelta gatedDelta;
  };

  std::vector<Layer> layers;
  int64_t batch = 0;
  int64_t length = 0;              ///< tokens seen per row
  int64_t lengthBeforeLastForward = 0;

  bool empty() const { return layers.empty(); }
  /// Back to the first `length` tokens; `length` must lie in
  /// [lengthBeforeLastForward, this->length], else a FormatError naming
  /// both bounds and `length`.
  void truncate(int64_t length);
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

  /// Incremental decoding: inputs.inputIds [B, n] are the next n tokens of
  /// every row of `cache`, at positions cache.length .. cache.length + n - 1
  /// (inputs.positionIds, if given, only change the RoPE positions).
  /// Attention reads the cached keys and values plus the new ones causally
  /// (sliding-window layers within the window counted back from each
  /// query's index); gated-delta layers continue from the cached state and
  /// convolution inputs. Returns the captured layers' outputs [B, n, H] and,
  /// with computeLogits, the final norm and logits of the n tokens; the cache
  /// grows by n (see TargetCache for rollback). Every layer runs whatever is
  /// captured, to keep the cache whole. No packed rows (cuSeqlens must be
  /// undefined). Plain LibTorch: options.attention and options.gatedDelta
  /// (shaped for whole training rows) are not used on this path.
  TargetOutputs forward(const TargetInputs &inputs, TargetCache &cache) const;

  /// The frozen weights a drafter borrows: [V, H] each (the same tensor when
  /// the embeddings are tied).
  const torch::Tensor &embedTokens() const { return embedTokens_; }
  const torch::Tensor &lmHead() const { return lmHead_; }

private:
  /// The frozen projections that read the same input are concatenated at
  /// load, so each is one GEMM: q_proj, k_proj, v_proj as qkv (rows in that
  /// order) and gate_proj, up_proj as mlpGateUp.
  struct AttentionWeights {
    torch::Tensor qkv, o;
    torch::Tensor qkvBias, oBias; ///< attention_bias only
    torch::Tensor qNorm, kNorm;
  };
  struct LayerWeights {
    LayerKind kind = LayerKind::FullAttention;
    torch::Tensor inputNorm, postAttentionNorm;
    AttentionWeights attention;   ///< full and sliding-window layers
    GatedDeltaWeights gatedDelta; ///< linear-attention layers
    torch::Tensor mlpGateUp, mlpDown;
  };

  TargetModel(TransformerConfig config, TargetModelOptions options);
  torch::Tensor norm(const torch::Tensor &x, const torch::Tensor &weight) const;
  /// Both forwards: without a cache the training shapes (hooks, packed
  /// rows); with one, incremental decoding.
  TargetOutputs run(const TargetInputs &inputs, TargetCache *cache) const;
  void startCache(TargetCache &cache, int64_t batch) const;
  torch::Tensor attentionLayer(const LayerWeights &layer, const torch::Tensor &x,
                               const std::pair<torch::Tensor, torch::Tensor> &rope,
                               const TokenLayout &layout, TargetCache::Attention *cache) const;
  torch::Tensor gatedDeltaLayer(const GatedDeltaWeights &layer, const torch::Tensor &x,
                                const TokenLayout &layout, TargetCache::GatedDelta *cache) const;

  TransformerConfig config_;
  TargetModelOptions options_;
  bool zeroCenteredNorms_ = false;
  RotaryEmbedding rotary_;
  torch::Tensor embedTokens_, lmHead_, finalNorm_;
  std::vector<LayerWeights> layers_;
};

} // namespace dflex::runtime::models
