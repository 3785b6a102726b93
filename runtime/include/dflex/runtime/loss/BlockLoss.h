// The DFlash training loss: weighted cross-entropy of the drafter's block
// positions through the target's frozen LM head, computed in row chunks so
// that the [positions x vocabulary] logits (vocabulary ~248k) never exist at
// once, in the forward pass or the backward pass.
#pragma once

#include <torch/types.h>

namespace dflex::runtime {

struct BlockLossOptions {
  /// Rows of logits per chunk; 0 picks them so that a chunk's float32 logits
  /// take about chunkBytes.
  int64_t chunkRows = 0;
  int64_t chunkBytes = int64_t(256) << 20;
  /// Divides the weighted sum; 0 means the local weight sum. Data-parallel
  /// training passes the weight sum over all ranks, so that every rank's
  /// loss (and gradient) is a share of one global weighted mean.
  double normalizer = 0;
};

struct BlockLossResult {
  /// Scalar (float32; float64 for float64 inputs):
  /// sum_i w_i * CE(h_i W^T, label_i) / normalizer;
  /// differentiable with respect to `hidden`. 0 when no weight is positive.
  torch::Tensor loss;
  /// bool, the shape of `labels`: the argmax of the logits is the label
  /// (false wherever the weight is 0). For accuracy and acceptance metrics.
  torch::Tensor correct;
  /// Scalar, the local sum of weights.
  torch::Tensor weightSum;
};

/// hidden: [..., H] (float32, bfloat16 or float16); lmHead: [V, H], same dtype
/// and device, frozen (must not require grad); labels: int64 [...], in [0, V)
/// wherever the weight is positive (anything elsewhere, e.g. -1); weights:
/// float [...], non-negative. Only positions with positive weight are
/// computed. Logits and the log-sum-exp are accumulated in float32 (float64
/// for float64 inputs).
///
/// The backward pass recomputes each chunk's logits from the saved hidden
/// states and per-row log-sum-exp: peak extra memory is one chunk of logits
/// plus O(rows), not O(rows x V).
BlockLossResult blockCrossEntropy(const torch::Tensor &hidden,
                                  const torch::Tensor &lmHead,
                                  const torch::Tensor &labels,
                                  const torch::Tensor &weights,
                                  const BlockLossOptions &options = {});

} // namespace dflex::runtime
