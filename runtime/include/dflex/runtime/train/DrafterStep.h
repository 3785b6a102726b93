// One training update of the drafter: for each micro-batch, its context
// features from a producer (the co-located target here; a paired GPU's
// target later), the drafter's forward, the chunked block loss through the
// frozen LM head and the backward, accumulated in float32; then one AdamW
// update (or none, when a gradient is not finite). A micro-batch without a
// valid anchor contributes a zero loss and still runs every pass, so that
// all ranks of a data-parallel run take the same steps.
#pragma once

#include "dflex/runtime/data/Batching.h"
#include "dflex/runtime/distributed/DataParallel.h"
#include "dflex/runtime/loss/BlockLoss.h"
#include "dflex/runtime/models/Drafter.h"
#include "dflex/runtime/models/TargetModel.h"
#include "dflex/runtime/train/Optimizer.h"

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace dflex::runtime {

/// The drafter's context features of a batch ([B, T, n * Ht]), on the
/// producer's device (DrafterStep moves them to the drafter's).
using ContextFeatureProducer = std::function<torch::Tensor(const TrainingBatch &)>;

/// The target's hidden states of `targetLayerIds`, concatenated, computed
/// without gradients on the target's device.
ContextFeatureProducer targetFeatures(const models::TargetModel &target,
                                      std::vector<int64_t> targetLayerIds);

/// Per block position k = 1 .. K-1: correct predictions among the positions
/// with a positive weight; and the empirical acceptance length: 1 + the
/// mean, over valid blocks, of the number of leading positions (from k = 1)
/// predicted correctly, as greedy verification accepts them.
struct BlockAccuracy {
  std::vector<int64_t> correct, counted; // per position k (index k - 1)
  int64_t blocks = 0, acceptedTokens = 0;
  void add(const torch::Tensor &correct, const torch::Tensor &weights);
  std::vector<double> byPosition() const;
  double acceptanceLength() const;
  /// The counts summed over the ranks.
  void sumOver(DataParallel &ranks);
};

/// Wall time of each part of an update; on CUDA each part ends with a
/// synchronisation, so that the time is the part's and not its launch's.
struct StepTimes {
  double featuresMs = 0, transferMs = 0, forwardMs = 0, backwardMs = 0, optimizerMs = 0;
  double allReduceMs = 0; ///< summing the gradients over the ranks
};

struct StepMetrics {
  double loss = 0;     // weighted mean over the update's micro-batches
  double gradNorm = 0; // before clipping
  bool applied = false;
  std::string badTensor; // "loss", or the first non-finite gradient, if any
  double learningRate = 0;
  int64_t contextTokens = 0; // real (non-padding) context tokens
  BlockAccuracy accuracy;
  StepTimes times;
};

class DrafterStep {
public:
  /// With `ranks`, the update is that of all ranks' micro-batches together:
  /// every loss is normalised by the weight sum over all ranks, the float32
  /// gradient buckets are summed over the ranks before the optimizer, and
  /// the metrics (loss, accuracy counts, tokens) are the ranks' totals, so
  /// every rank takes the same decision on a non-finite step.
  DrafterStep(models::DFlashDrafter drafter, DrafterOptimizer &optimizer,
              ContextFeatureProducer features, BlockLossOptions lossOptions = {},
              DataParallel *ranks = nullptr);

  /// One update from `microBatches` at `learningRate`. The loss of each
  /// micro-batch is normalised by the weight sum of all of them, so the
  /// update is that of one batch holding them all. A non-finite loss or
  /// gradient leaves every weight as it was (applied false, badTensor).
  StepMetrics run(const std::vector<TrainingBatch> &microBatches, double learningRate);

private:
  models::DFlashDrafter drafter_;
  DrafterOptimizer &optimizer_;
  ContextFeatureProducer features_;
  BlockLossOptions lossOptions_;
  DataParallel *ranks_;
};

} // namespace dflex::runtime
