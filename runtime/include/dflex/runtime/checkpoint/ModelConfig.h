// Hugging Face config.json for the models the runtime trains against and
// produces: Qwen3 (dense), Qwen3.5 (hybrid: gated-delta "linear attention"
// layers between full-attention layers; its config nests the language model
// under "text_config"), and DFlash drafters (a Qwen3 config plus
// "dflash_config").
//
// Both the transformers 4.x spelling (rope_theta, rope_scaling, torch_dtype)
// and the 5.x spelling (rope_parameters, dtype) are read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dflex::runtime {

enum class LayerKind {
  FullAttention,    ///< "full_attention"
  SlidingAttention, ///< "sliding_attention" (window: slidingWindow)
  LinearAttention,  ///< "linear_attention": a gated delta rule (GDN) layer
};

const char *toString(LayerKind kind);

struct RopeConfig {
  std::string type = "default"; ///< rope_type: default, linear, yarn, ...
  double theta = 10000.0;
  /// Fraction of head_dim that is rotated (Qwen3.5: 0.25).
  double partialRotaryFactor = 1.0;
  /// Scaling factor of the scaled variants; 1 when none.
  double factor = 1.0;
  std::optional<int64_t> originalMaxPositionEmbeddings;
  /// Qwen3.5's multimodal sections of the rotary half-dimension; for text all
  /// sections see the same position, so the text runtime may ignore them.
  std::vector<int64_t> mropeSection;
  bool mropeInterleaved = false;
};

/// Shapes of Qwen3.5's gated-delta layers.
struct GatedDeltaConfig {
  int64_t numKeyHeads = 0;
  int64_t numValueHeads = 0;
  int64_t keyHeadDim = 0;
  int64_t valueHeadDim = 0;
  int64_t convKernelDim = 0;
};

/// A decoder-only language model (the text part of the config).
struct TransformerConfig {
  /// model_type of the text config: "qwen3" or "qwen3_5_text".
  std::string modelType;
  int64_t vocabSize = 0;
  int64_t hiddenSize = 0;
  int64_t intermediateSize = 0;
  int64_t numHiddenLayers = 0;
  int64_t numAttentionHeads = 0;
  int64_t numKeyValueHeads = 0;
  int64_t headDim = 0;
  int64_t maxPositionEmbeddings = 0;
  double rmsNormEps = 1e-6;
  std::string hiddenAct = "silu";
  bool attentionBias = false;
  /// Qwen3.5 gates the attention output with a sigmoid of a second q_proj half.
  bool attentionOutputGate = false;
  bool tieWordEmbeddings = false;
  RopeConfig rope;
  /// One entry per layer.
  std::vector<LayerKind> layerKinds;
  /// Window of SlidingAttention layers (tokens), when there are any.
  std::optional<int64_t> slidingWindow;
  /// Present when any layer is LinearAttention.
  std::optional<GatedDeltaConfig> gatedDelta;
  std::optional<int64_t> bosTokenId;
  std::optional<int64_t> padTokenId;
  std::vector<int64_t> eosTokenIds;
  /// Parameter dtype name as written ("bfloat16"); empty if not given.
  std::string dtype;

  /// Rotated dimensions per head: headDim * partialRotaryFactor.
  int64_t rotaryDim() const;
  int64_t numLayersOf(LayerKind kind) const;
};

/// The DFlash part of a drafter config.
struct DFlashConfig {
  /// Target layers whose outputs (hidden_states[id + 1] in Hugging Face's
  /// numbering, where [0] is the embedding output) feed the drafter.
  std::vector<int64_t> targetLayerIds;
  int64_t blockSize = 16;
  int64_t maskTokenId = 0;
  /// Layers of the target model, when the config records it.
  std::optional<int64_t> numTargetLayers;
};

struct DrafterConfig {
  TransformerConfig model;
  DFlashConfig dflash;
};

/// Parses config.json text of a Qwen3 or Qwen3.5 model (top level or nested
/// under text_config). `source` names the text in errors. Throws FormatError
/// naming the source and key for missing, mistyped or inconsistent fields.
TransformerConfig parseTransformerConfig(const std::string &jsonText,
                                         const std::string &source);
/// Reads `path`: a config.json, or a directory that holds one.
TransformerConfig loadTransformerConfig(const std::string &path);

/// Parses a DFlash drafter config. Missing target_layer_ids are derived from
/// num_target_layers with defaultTargetLayerIds; block_size may sit in
/// dflash_config or at the top level (both present must agree).
DrafterConfig parseDrafterConfig(const std::string &jsonText,
                                 const std::string &source);
DrafterConfig loadDrafterConfig(const std::string &path);

/// The config.json a drafter checkpoint ships with: a Qwen3 config (what
/// serving engines instantiate) with architectures ["DFlashDraftModel"],
/// dflash_config {target_layer_ids, block_size, mask_token_id},
/// num_target_layers and a top-level block_size.
std::string writeDrafterConfig(const DrafterConfig &config);
/// Writes writeDrafterConfig() to `directory`/config.json atomically.
void saveDrafterConfig(const std::string &directory, const DrafterConfig &config);

/// The DFlash default choice of target layers: `count` layers spread evenly
/// over [1, numTargetLayers - 3] (rounded half to even), or the middle layer
/// when count is 1.
std::vector<int64_t> defaultTargetLayerIds(int64_t numTargetLayers,
                                           int64_t count);

} // namespace dflex::runtime
