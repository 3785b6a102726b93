// From samples to training batches: packing samples into rows of a fixed
// token budget, drawing anchors among loss-mask positions, and building the
// DFlash blocks with their labels and position weights (docs/data.md).
#pragma once

#include "dflex/runtime/data/TokenData.h"

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace dflex::runtime {

/// Several samples ("documents") laid end to end in one row of tokenBudget
/// tokens, padded at the end.
struct PackedRow {
  std::vector<int32_t> tokens;      ///< tokenBudget entries; padding: padTokenId
  std::vector<uint8_t> lossMask;    ///< 0 on padding
  std::vector<int32_t> positionIds; ///< restart at 0 in every document
  std::vector<int32_t> documentIds; ///< 0, 1, ... per document; -1 on padding
  /// Document boundaries: document d is [documentStarts[d], documentStarts[d+1]);
  /// the last entry is numTokens.
  std::vector<int32_t> documentStarts;
  std::vector<uint64_t> sampleIndices; ///< dataset index of each document
  int32_t numTokens = 0;               ///< real tokens; padding follows
};

struct PackingOptions {
  int64_t tokenBudget = 8192;
  int32_t padTokenId = 0;
  /// Samples held back to pick from: each row is filled by repeatedly taking
  /// the longest buffered sample that still fits (1: plain order).
  size_t lookahead = 64;
  /// Samples longer than the budget are cut to it (else a FormatError).
  bool truncateLongSamples = true;
};

struct PackingStats {
  uint64_t samples = 0;          ///< taken into rows
  uint64_t truncated = 0;        ///< cut to the budget
  uint64_t droppedWithoutLoss = 0; ///< skipped: no loss-mask position at all
  uint64_t rows = 0;
  uint64_t realTokens = 0;
  uint64_t paddingTokens = 0;
};

/// A buffered sample of a Packer, after any truncation.
struct PendingSample {
  TokenSample sample;
  uint64_t datasetIndex = 0;
};

/// Streams packed rows from a sample source; memory is bounded by the
/// lookahead, not the dataset.
class Packer {
public:
  /// `buffered`: the pending() of an earlier packer over the same source,
  /// which continues from the sample after them (resuming a run).
  Packer(SampleSource &source, PackingOptions options, std::vector<PendingSample> buffered = {});
  /// The next row; false once the source and the buffer are empty.
  bool next(PackedRow &row);
  const PackingStats &stats() const { return stats_; }
  /// The samples read from the source but not yet packed, in buffer order:
  /// with the source's position, what a resumed packer needs to produce the
  /// same rows.
  const std::vector<PendingSample> &pending() const { return pending_; }

private:
  using Pending = PendingSample;
  void refill();

  SampleSource &source_;
  PackingOptions options_;
  PackingStats stats_;
  std::vector<Pending> pending_;
  bool sourceDone_ = false;
};

struct BlockOptions {
  int64_t blockSize = 16;
  /// Anchors per row (fewer when fewer positions are eligible).
  int64_t maxAnchors = 512;
  int32_t maskTokenId = 0;
  /// Position k >= 1 of a block is weighted exp(-(k - 1) / gamma).
  double gamma = 7.0;
};

/// Positions that may anchor a block: a loss-mask position a whose block has
/// at least one label, i.e. some k in [1, blockSize) with a + k in a's
/// document and in the loss mask. Ascending.
std::vector<int32_t> eligibleAnchors(const PackedRow &row, int64_t blockSize);

/// Up to maxAnchors eligible positions drawn uniformly without replacement
/// (all of them when there are no more), ascending. Deterministic in `seed`.
std::vector<int32_t> sampleAnchors(const PackedRow &row,
                                   const BlockOptions &options, uint64_t seed);

/// Everything one training step needs, for B rows of T tokens and N blocks
/// of K = blockSize positions per row.
struct TrainingBatch {
  // The context the target model runs on: [B, T].
  torch::Tensor tokens;      ///< int64
  torch::Tensor positionIds; ///< int64, restart per document
  torch::Tensor documentIds; ///< int32, -1 on padding
  torch::Tensor lossMask;    ///< bool
  /// int32 [S + 1]: segment boundaries over the flattened B*T tokens, for
  /// varlen kernels (gated delta): each document is a segment, and so is each
  /// row's padding tail, so that the segments cover every position.
  torch::Tensor cuSeqlens;
  int64_t maxSeqlen = 0; ///< longest segment

  // The blocks: [B, N] and [B, N, K].
  torch::Tensor anchors;      ///< int64 [B, N]; 0 for padding blocks
  torch::Tensor blockValid;   ///< bool [B, N]
  /// int32 [B, N]: block i sees context keys [contextStart, anchor) of its
  /// row (its document's tokens strictly before the anchor); padding blocks
  /// have an empty range.
  torch::Tensor contextStart;
  torch::Tensor blockTokens;      ///< int64 [B, N, K]: token[a], then MASK
  torch::Tensor blockPositionIds; ///< int64 [B, N, K]: positionIds[a] + k
  torch::Tensor labels;  ///< int64 [B, N, K]: token[a + k], -1 where weight 0
  torch::Tensor weights; ///< float32 [B, N, K]: the loss weight of each position

  std::vector<std::vector<uint64_t>> sampleIndices; ///< per row, per document
};

/// Builds the batch; row r draws its anchors with seed mixSeed(seed, r).
/// N is the largest anchor count of any row (at least 1). Tensors are on the
/// CPU; rows must all have the same length.
TrainingBatch makeTrainingBatch(const std::vector<PackedRow> &rows,
                                const BlockOptions &options, uint64_t seed);

} // namespace dflex::runtime
