// The DFlash drafter: a few Qwen3-style decoder layers that read context
// features (hidden states captured from target layers) and predict a block
// of tokens after each anchor in parallel (docs/models.md).
//
//   context = RMSNorm_hidden(fc(concat(target hidden states)))      [B, T, H]
//   x       = embed(block tokens)  (the target's frozen embedding) [B, N*K, H]
//   per layer:  h = RMSNorm(x)
//               Q = q_norm(q_proj h),  K = k_norm(k_proj [context; h]),
//               V = v_proj [context; h],  RoPE at absolute positions
//               (context: the row's position ids; block i: anchor_i's + k)
//               x = x + o_proj(attention(Q, K, V, DFlash mask))
//               x = x + mlp(RMSNorm(x))
//   output  = RMSNorm(x)                                           [B, N, K, H]
//
// A gated-delta (linear_attention) layer replaces the attention by Qwen3.5's
// linear-attention layer run per block: over the block's context, then its
// tokens (DrafterGatedDeltaImpl).
//
// The loss goes through the target's frozen LM head (blockCrossEntropy).
// Parameter names are the tensor names of public DFlash checkpoints
// (fc.weight, hidden_norm.weight, layers.N.self_attn.q_proj.weight, ...,
// norm.weight; no embedding or LM head), and Qwen3.5's for gated-delta
// layers (layers.N.linear_attn.in_proj_qkv.weight, ...).
#pragma once

#include "dflex/runtime/loss/BlockLoss.h"
#include "dflex/runtime/bundle/KernelBundle.h"
#include "dflex/runtime/checkpoint/ModelConfig.h"
#include "dflex/runtime/models/GatedDeltaLayer.h"
#include "dflex/runtime/models/Layers.h"

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dflex::runtime::models {

/// Where the blocks of a batch sit in their rows: block i of row b holds
/// queries [i K, (i + 1) K) and keys T + [i K, (i + 1) K) of the attention.
struct DFlashBlocks {
  torch::Tensor anchors;      ///< int64 [B, N]: the anchor's index in its row
  torch::Tensor blockValid;   ///< bool [B, N]: false for padding blocks
  torch::Tensor contextStart; ///< int64 [B, N]: first context key the block sees
  int64_t blockSize = 16;
  int64_t contextLength = 0; ///< T
};

/// The DFlash attention pattern, query (block i, position j) against key kv:
///  - a context key c < T is visible to a valid block when
///    contextStart_i <= c < anchor_i and, in a sliding-window layer,
///    (anchor_i + j) - c < window (the window counts back from the query's
///    own position, as at inference);
///  - a block key (i', j') is visible when i' == i: every position of the
///    block in a full-attention layer; j' <= j in a sliding-window layer;
///  - padding blocks see nothing (their output is 0).
/// Returns bool [B, N*K, T + N*K] on the device of the anchors.
torch::Tensor dflashMask(const DFlashBlocks &blocks, std::optional<int64_t> window);

/// The attention of a drafter layer. q [B, N*K, Hq, D], k and v
/// [B, T + N*K, Hkv, D] (context keys first); returns [B, N*K, Hq, D],
/// differentiable with respect to q, k and v. A query that sees no key gets 0.
class DrafterAttention {
public:
  virtual ~DrafterAttention() = default;
  virtual torch::Tensor attend(const torch::Tensor &q, const torch::Tensor &k,
                               const torch::Tensor &v, const DFlashBlocks &blocks,
                               LayerKind kind, std::optional<int64_t> window,
                               double scale) const = 0;
};

/// Plain LibTorch: the dense dflashMask and a masked softmax. Memory grows
/// with B * Hq * N*K * (T + N*K): for tests and small runs.
class DenseDrafterAttention : public DrafterAttention {
public:
  torch::Tensor attend(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                       const DFlashBlocks &blocks, LayerKind kind, std::optional<int64_t> window,
                       double scale) const override;
};

/// The dflex attention op (attention/AttentionOp.h) with the specs of kernel
/// bundles: one for full-attention layers and, if the drafter has any, one
/// for sliding-window layers (from `slidingWindowBundle`, or the same bundle
/// when that is null). Throws FormatError when a bundle lacks a spec. Captures are bound by name: "anchors" (int32
/// [B, N], -1 for padding blocks), "ctx_len" (T), "window", and
/// "context_start" (int32 [B, N]) when the spec declares it. A spec without
/// context_start only knows "keys before the anchor": it is refused for
/// batches where a valid block's context starts after 0 (packed rows).
class BundleDrafterAttention : public DrafterAttention {
public:
  BundleDrafterAttention(std::shared_ptr<const KernelBundle> bundle,
                         const std::string &fullAttentionSpec,
                         const std::string &slidingWindowSpec = {},
                         std::shared_ptr<const KernelBundle> slidingWindowBundle = nullptr);
  torch::Tensor attend(const torch::Tensor &q, const torch::Tensor &k, const torch::Tensor &v,
                       const DFlashBlocks &blocks, LayerKind kind, std::optional<int64_t> window,
                       double scale) const override;

  /// Throws FormatError unless the spec of full-attention layers (of
  /// sliding-window layers, given a window) computes dflashMask for
  /// `blockSize` on a probe of a packed row: a bundle compiled for another
  /// block size or window is refused before training.
  void checkMask(int64_t blockSize, std::optional<int64_t> window = std::nullopt) const;

private:
  const AttentionKernelSpec &specFor(std::optional<int64_t> window, std::string &where) const;
  std::vector<torch::Tensor> captures(const AttentionKernelSpec &spec, const std::string &where,
                                      const DFlashBlocks &blocks,
                                      std::optional<int64_t> window) const;

  std::shared_ptr<const KernelBundle> bundle_;
  const AttentionKernelSpec *fullSpec_;
  std::shared_ptr<const KernelBundle> slidingBundle_;
  const AttentionKernelSpec *slidingSpec_; // null: the drafter has no sliding-window layer
};

/// An RMSNorm with its weight (Qwen3 convention).
class RmsNormImpl : public torch::nn::Module {
public:
  RmsNormImpl(int64_t size, double eps);
  torch::Tensor forward(const torch::Tensor &x) const;
  torch::Tensor weight;

private:
  double eps_;
};
TORCH_MODULE(RmsNorm);

class DrafterSelfAttentionImpl : public torch::nn::Module {
public:
  explicit DrafterSelfAttentionImpl(const TransformerConfig &config);
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RmsNorm q_norm{nullptr}, k_norm{nullptr};
};
TORCH_MODULE(DrafterSelfAttention);

class SwiGluMlpImpl : public torch::nn::Module {
public:
  explicit SwiGluMlpImpl(const TransformerConfig &config);
  torch::Tensor forward(const torch::Tensor &x) const;
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(SwiGluMlp);

/// One gated delta rule call of a drafter's gated-delta layer: the rule's
/// inputs (GatedDeltaLayer.h; q and k not yet L2-normalised) of the context
/// runs, one after another in one row ([1, Tc, ...]; their q is not read),
/// and of the blocks, one per row ([rows, K, ...]). Every run starts from a
/// zero state; block i continues from the state run blockRun[i] reaches
/// after its first blockAfter[i] tokens (>= 1), or from a zero state where
/// blockRun[i] is -1. Returns the blocks' outputs [rows, K, Hv, Dv].
struct DrafterGatedDeltaCall {
  const GatedDeltaRuleInputs &context;
  /// [R + 1]: run r is context tokens [runOffsets[r], runOffsets[r + 1]).
  const std::vector<int64_t> &runOffsets;
  const std::vector<int64_t> &blockRun, &blockAfter;
  const GatedDeltaRuleInputs &blocks;

  /// Per run, the blocks that continue it, by their tokens before the
  /// anchor (ties in block order).
  std::vector<std::vector<int64_t>> blocksOfRuns() const;
};
using DrafterGatedDeltaFn = std::function<torch::Tensor(const DrafterGatedDeltaCall &)>;

/// Plain LibTorch on any device: each run once, with the states after its
/// blocks' anchors (gatedDeltaRuleWithState's statesAfter), then all blocks
/// together from their states.
torch::Tensor drafterGatedDeltaRule(const DrafterGatedDeltaCall &call);

/// The token mixer of a gated-delta drafter layer: Qwen3.5's
/// linear-attention layer (GatedDeltaLayer.h; parameters in_proj_qkv,
/// in_proj_z, in_proj_b, in_proj_a, conv1d, dt_bias, A_log, norm, out_proj)
/// run once per block over the block's context and then its tokens, as the
/// attention layers see them: for a valid block with anchor a and context
/// start s, the convolution and the gated delta rule start from zero at s,
/// read the context inputs of [s, a), continue over the block's K tokens,
/// and the block tokens' outputs are the layer's. The context inputs are
/// the projected target features the attention layers take their context
/// keys and values from (hidden_norm(fc(features)), not normed again per
/// layer); the block's are the layer's normed input. Padding blocks get 0.
///
/// Each (row, context start) runs its context once, and every block of it
/// continues from the state after its anchor (DrafterGatedDeltaCall); the
/// rule is the drafter's DrafterGatedDeltaFn: plain LibTorch
/// (drafterGatedDeltaRule) by default, the dflex gated-delta op through
/// drafterGatedDeltaHook (KernelHooks.h). Autograd through both parts.
class DrafterGatedDeltaImpl : public torch::nn::Module {
public:
  /// Needs config.gatedDelta.
  explicit DrafterGatedDeltaImpl(const TransformerConfig &config);
  /// context [B, T, H], h [B, N*K, H] -> [B, N*K, H], the rule by `rule`
  /// (empty: drafterGatedDeltaRule).
  torch::Tensor forward(const torch::Tensor &context, const torch::Tensor &h,
                        const DFlashBlocks &blocks, const DrafterGatedDeltaFn &rule = {}) const;
  /// transformers' initialisation of Qwen3.5's layer: linear and
  /// convolution weights normal(0, 0.02), A_log = log U(0, 16), dt_bias and
  /// norm 1.
  void initialise(at::Generator &generator);

  GatedDeltaWeights weights; ///< the registered parameters

private:
  GatedDeltaConfig config_;
  double eps_;
};
TORCH_MODULE(DrafterGatedDelta);

/// A decoder layer: self_attn for full and sliding-window layers,
/// linear_attn for gated-delta layers.
class DrafterLayerImpl : public torch::nn::Module {
public:
  DrafterLayerImpl(const TransformerConfig &config, LayerKind kind);
  RmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  DrafterSelfAttention self_attn{nullptr};
  DrafterGatedDelta linear_attn{nullptr};
  SwiGluMlp mlp{nullptr};
};
TORCH_MODULE(DrafterLayer);

/// What one drafter step reads (all on the drafter's device).
struct DrafterInputs {
  /// [B, T, n * Ht]: the hidden states of the n target layers of
  /// DFlashConfig::targetLayerIds, concatenated in that order (any floating
  /// dtype: converted to the drafter's).
  torch::Tensor contextFeatures;
  torch::Tensor contextPositions; ///< int64 [B, T]
  torch::Tensor blockTokens;      ///< int64 [B, N, K]
  torch::Tensor blockPositions;   ///< int64 [B, N, K]
  DFlashBlocks blocks;
};

/// The concatenated target hidden states in DFlashConfig order, from
/// TargetOutputs::hiddenStates captured for exactly targetLayerIds.
torch::Tensor concatContextFeatures(const std::vector<torch::Tensor> &hiddenStates);

class DFlashDrafterImpl : public torch::nn::Module {
public:
  /// Layers of any kind (gated-delta layers need config.model.gatedDelta);
  /// hidden_act silu.
  /// Parameters start at the Qwen3 initialisation (normal(0, 0.02) linear
  /// weights, unit norms), drawn from `seed`; float32 on the CPU (use to()).
  /// `targetHiddenSize` is the width of one target layer's hidden state
  /// (0: the drafter's hidden size).
  explicit DFlashDrafterImpl(const DrafterConfig &config, int64_t targetHiddenSize = 0,
                             uint64_t seed = 0);

  /// Reads a checkpoint directory (config.json + safetensors) written by
  /// save() or in the public DFlash format. Every parameter must be present
  /// with its shape; unknown tensors are a FormatError.
  static std::shared_ptr<DFlashDrafterImpl> load(const std::string &directory,
                                                  torch::ScalarType dtype = torch::kFloat,
                                                  torch::Device device = torch::kCPU);
  /// Writes config.json and the parameters (in `dtype`, default: as they
  /// are) as model.safetensors, or shards of at most maxShardBytes.
  void save(const std::string &directory, std::optional<torch::ScalarType> dtype = std::nullopt,
            uint64_t maxShardBytes = uint64_t(5) << 30) const;

  const DrafterConfig &config() const { return config_; }

  /// The target's frozen embedding and LM head ([V, H] each; may be one
  /// tensor). Kept as given: move them to the drafter's device and dtype
  /// first. Needed by forward() and loss().
  void setTargetWeights(torch::Tensor embedTokens, torch::Tensor lmHead);
  const torch::Tensor &lmHead() const { return lmHead_; }

  /// The attention every layer calls (default: DenseDrafterAttention).
  void setAttention(std::shared_ptr<const DrafterAttention> attention);
  /// The gated delta rule of every gated-delta layer (default:
  /// drafterGatedDeltaRule).
  void setGatedDelta(DrafterGatedDeltaFn rule);

  /// Final-normed hidden states of the block positions: [B, N, K, H].
  torch::Tensor forward(const DrafterInputs &inputs);

  /// blockCrossEntropy of the forward() output through the target's LM
  /// head, with TrainingBatch labels and weights ([B, N, K], on the device).
  BlockLossResult loss(const torch::Tensor &hidden, const torch::Tensor &labels,
                       const torch::Tensor &weights, const BlockLossOptions &options = {}) const;

  torch::nn::Linear fc{nullptr};
  RmsNorm hidden_norm{nullptr}, norm{nullptr};
  torch::nn::ModuleList layers{nullptr};

private:
  DrafterConfig config_;
  RotaryEmbedding rotary_;
  std::vector<std::shared_ptr<DrafterLayerImpl>> layerList_;
  std::shared_ptr<const DrafterAttention> attention_;
  DrafterGatedDeltaFn gatedDelta_;
  torch::Tensor embedTokens_, lmHead_;
};
TORCH_MODULE(DFlashDrafter);

} // namespace dflex::runtime::models
