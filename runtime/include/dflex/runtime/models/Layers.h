// Building blocks shared by the target models and the DFlash drafter: RMS
// norms, rotary position embeddings, the SwiGLU MLP, the token layout of
// packed rows, and the plain LibTorch causal attention (docs/models.md).
//
// Everything here is functional (weights are arguments) and works on any
// device and floating dtype. The dtype flow follows the Hugging Face models
// the runtime has to match: norms compute in float32 and round once, rotary
// tables are computed in float32 and rounded to the activation dtype.
#pragma once

#include "dflex/runtime/checkpoint/ModelConfig.h"

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dflex::runtime::models {

/// The checks every Qwen-style decoder config must pass here: hidden_act
/// silu, query heads a multiple of key/value heads. Throws FormatError
/// "<where>: ...".
void checkDecoderConfig(const TransformerConfig &config, const std::string &where);

/// The dtype norms and recurrences compute in: float64 for float64 inputs
/// (the reference checks), else float32.
torch::ScalarType computeType(const torch::Tensor &x);

/// Qwen3's RMSNorm: weight * round(x / rms(x)), the normalisation in float32
/// (on CUDA fused, rounded once: round(weight * x / rms(x))).
torch::Tensor rmsNorm(const torch::Tensor &x, const torch::Tensor &weight, double eps);

/// Qwen3.5's zero-centred RMSNorm: the stored weight w scales by (1 + w),
/// applied in float32 before the one rounding.
torch::Tensor zeroCenteredRmsNorm(const torch::Tensor &x, const torch::Tensor &weight,
                                  double eps);

/// The gated RMSNorm of Qwen3.5's gated-delta output: weight * round(x / rms(x))
/// times silu(gate) in float32, rounded once. Normalises the last dimension.
torch::Tensor gatedRmsNorm(const torch::Tensor &x, const torch::Tensor &gate,
                           const torch::Tensor &weight, double eps);

/// down(silu(x gate^T) * (x up^T)); weights [I, H], [I, H], [H, I].
torch::Tensor swiGlu(const torch::Tensor &x, const torch::Tensor &gateWeight,
                     const torch::Tensor &upWeight, const torch::Tensor &downWeight);

/// silu(gate) * up of x [gate | up]^T, the last dimension [2I] -> [I]: swiGlu's
/// middle for weights concatenated into one projection.
torch::Tensor swiGluOfProjection(const torch::Tensor &gateAndUp);

/// Rotary position embedding tables of one model: the default (theta only),
/// "linear" and "yarn" (with the YaRN defaults beta_fast 32, beta_slow 1 and
/// the attention factor 0.1 ln(factor) + 1, the fields RopeConfig carries)
/// rope types; others are a FormatError. Rotates the first rotaryDim()
/// dimensions of each head as two halves (rotate_half convention).
class RotaryEmbedding {
public:
  RotaryEmbedding(const RopeConfig &rope, int64_t headDim);

  int64_t rotaryDim() const { return rotaryDim_; }
  /// cos and sin [..., rotaryDim] for integer positions [...], computed in
  /// float32 (float64 for float64) and returned in `dtype` on the device of
  /// `positions`.
  std::pair<torch::Tensor, torch::Tensor> table(const torch::Tensor &positions,
                                                torch::ScalarType dtype) const;

private:
  torch::Tensor inverseFrequencies(const RopeConfig &rope, torch::ScalarType dtype) const;

  int64_t rotaryDim_ = 0;
  // [rotaryDim / 2] on the CPU, computed in float32 and in float64.
  torch::Tensor inverseFrequencies_, inverseFrequencies64_;
  double attentionScaling_ = 1.0;
};

/// Rotates x [B, T, H, D] by the tables [B, T, R] (R <= D, even); the last
/// D - R dimensions pass through.
torch::Tensor applyRotary(const torch::Tensor &x, const torch::Tensor &cos,
                          const torch::Tensor &sin);

/// How the tokens of a [B, T] batch divide into independent sequences. With
/// one sequence per row nothing is materialised; packed rows carry the
/// segments of TrainingBatch::cuSeqlens (over the flattened B*T tokens; a
/// segment never crosses a row).
class TokenLayout {
public:
  struct Segment {
    int64_t row, begin, end; // [begin, end) within the row
  };

  /// One sequence per row.
  static TokenLayout rows(int64_t batch, int64_t length, torch::Device device);
  /// From cu_seqlens (int32 or int64 [S + 1], 0 first, B*T last, increasing,
  /// no segment crossing a row). Throws FormatError naming the problem.
  static TokenLayout packed(const torch::Tensor &cuSeqlens, int64_t batch, int64_t length,
                            torch::Device device);

  int64_t batch() const { return batch_; }
  int64_t length() const { return length_; }
  bool isPacked() const { return packed_; }
  /// Rows, or the packed segments.
  const std::vector<Segment> &segments() const { return segments_; }
  /// int64 [B, T] on the device: the segment of each token (packed only).
  const torch::Tensor &segmentIds() const { return segmentIds_; }
  /// int64 [B, T] on the device: the index of each token in its segment.
  const torch::Tensor &offsets() const { return offsets_; }

private:
  int64_t batch_ = 0, length_ = 0;
  bool packed_ = false;
  std::vector<Segment> segments_;
  torch::Tensor segmentIds_, offsets_;
};

/// Causal self-attention within each sequence of `layout`, optionally
/// limited to a window (query q sees keys kv with q - kv < window).
/// q [B, T, Hq, D], k and v [B, T, Hkv, D] with Hq a multiple of Hkv (query
/// head h reads key/value head h / (Hq / Hkv)); returns [B, T, Hq, D].
/// Plain LibTorch (scaled_dot_product_attention).
torch::Tensor causalAttention(const torch::Tensor &q, const torch::Tensor &k,
                              const torch::Tensor &v, const TokenLayout &layout,
                              std::optional<int64_t> window, double scale);

/// The attention of the last Tq tokens of each row over all Tk tokens of the
/// row (incremental decoding with cached keys and values): query i sits at
/// position Tk - Tq + i and sees keys j with j <= Tk - Tq + i (and, with a
/// window, Tk - Tq + i - j < window), as causalAttention's queries would in
/// the whole row. q [B, Tq, Hq, D], k and v [B, Tk, Hkv, D], Tq <= Tk; one
/// sequence per row; returns [B, Tq, Hq, D]. With Tq == Tk it is
/// causalAttention over rows.
torch::Tensor causalAttentionAfter(const torch::Tensor &q, const torch::Tensor &k,
                                   const torch::Tensor &v, std::optional<int64_t> window,
                                   double scale);

/// Key/value heads repeated to match the query heads: [B, T, Hkv, D] ->
/// [B, T, Hkv * groups, D], each key/value head serving `groups` consecutive
/// query heads.
torch::Tensor repeatHeads(const torch::Tensor &x, int64_t groups);

} // namespace dflex::runtime::models
