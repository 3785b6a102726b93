#include "dflex/runtime/loss/BlockLoss.h"

#include "dflex/Support/Error.h"

#include <torch/autograd.h>
#include <torch/torch.h>

namespace dflex::runtime {

namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

/// Logits, log-sum-exp and the loss are accumulated in float32 (float64 for
/// float64 inputs, which the reference checks use).
torch::ScalarType accumulationType(const Tensor &hidden) {
  return hidden.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

/// The LM head in the form chunkLogits multiplies with: CUDA multiplies half
/// types with float32 output directly; elsewhere both sides are converted
/// (once per pass, not per chunk).
Tensor headForMatmul(const Tensor &hidden, const Tensor &lmHead) {
  if (hidden.is_cuda())
    return lmHead;
  return lmHead.to(accumulationType(hidden));
}

/// [rows, V] logits of a chunk in the accumulation type.
Tensor chunkLogits(const Tensor &hidden, const Tensor &head) {
  torch::ScalarType accumulate = accumulationType(hidden);
  if (hidden.scalar_type() != accumulate && hidden.is_cuda())
    return at::mm(hidden, head.t(), accumulate);
  return at::mm(hidden.to(accumulate), head.t());
}

/// d(loss)/d(hidden) of a chunk from d(loss)/d(logits).
Tensor chunkHiddenGrad(const Tensor &logitGrad, const Tensor &head,
                       torch::ScalarType hiddenType) {
  if (head.scalar_type() != logitGrad.scalar_type())
    return at::mm(logitGrad.to(head.scalar_type()), head, logitGrad.scalar_type())
        .to(hiddenType);
  return at::mm(logitGrad, head).to(hiddenType);
}

int64_t rowsPerChunk(const BlockLossOptions &options, int64_t vocab) {
  if (options.chunkRows > 0)
    return options.chunkRows;
  return std::max<int64_t>(1, options.chunkBytes / (vocab * int64_t(sizeof(float))));
}

/// Inputs: hidden [M, H] (positions with positive weight), lmHead [V, H],
/// labels [M], weights [M] float32, normalizer (float32 scalar), chunkRows.
/// Outputs: the loss, and whether each row's argmax is its label.
struct ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
  static tensor_list forward(AutogradContext *ctx, const Tensor &hidden,
                             const Tensor &lmHead, const Tensor &labels,
                             const Tensor &weights, const Tensor &normalizer,
                             int64_t chunkRows) {
    const int64_t rows = hidden.size(0);
    Tensor head = headForMatmul(hidden, lmHead);
    Tensor logSumExp = torch::empty({rows}, weights.options());
    Tensor correct = torch::empty({rows}, labels.options().dtype(torch::kBool));
    Tensor total = torch::zeros({}, weights.options());
    for (int64_t begin = 0; begin < rows; begin += chunkRows) {
      int64_t end = std::min(rows, begin + chunkRows);
      Tensor chunkLabels = labels.slice(0, begin, end);
      Tensor logits = chunkLogits(hidden.slice(0, begin, end), head);
      Tensor target = logits.gather(1, chunkLabels.unsqueeze(1)).squeeze(1);
      auto [maximum, argmax] = logits.max(1);
      correct.slice(0, begin, end).copy_(argmax == chunkLabels);
      // In place: this chunk's logits are the only [rows x V] buffer.
      Tensor lse = logits.sub_(maximum.unsqueeze(1)).exp_().sum(1).log_().add_(maximum);
      logSumExp.slice(0, begin, end).copy_(lse);
      total.add_((weights.slice(0, begin, end) * (lse - target)).sum());
    }
    ctx->save_for_backward({hidden, lmHead, labels, weights, normalizer, logSumExp});
    ctx->saved_data["chunkRows"] = chunkRows;
    ctx->mark_non_differentiable({correct});
    return {total / normalizer, correct};
  }

  static tensor_list backward(AutogradContext *ctx, tensor_list outputGrads) {
    auto saved = ctx->get_saved_variables();
    const Tensor &hidden = saved[0], &lmHead = saved[1], &labels = saved[2];
    const Tensor &weights = saved[3], &normalizer = saved[4], &logSumExp = saved[5];
    const int64_t chunkRows = ctx->saved_data["chunkRows"].toInt();
    const int64_t rows = hidden.size(0);
    Tensor head = headForMatmul(hidden, lmHead);
    // d(loss)/d(logit_ij) = scale_i * (softmax_ij - [j == label_i]).
    Tensor scale = weights * (outputGrads[0] / normalizer);
    Tensor hiddenGrad = torch::empty_like(hidden);
    for (int64_t begin = 0; begin < rows; begin += chunkRows) {
      int64_t end = std::min(rows, begin + chunkRows);
      Tensor chunkLabels = labels.slice(0, begin, end).unsqueeze(1);
      Tensor grad = chunkLogits(hidden.slice(0, begin, end), head);
      grad.sub_(logSumExp.slice(0, begin, end).unsqueeze(1)).exp_();
      grad.scatter_add_(1, chunkLabels,
                        torch::full(chunkLabels.sizes(), -1.0f, grad.options()));
      grad.mul_(scale.slice(0, begin, end).unsqueeze(1));
      hiddenGrad.slice(0, begin, end)
          .copy_(chunkHiddenGrad(grad, head, hidden.scalar_type()));
    }
    return {hiddenGrad, Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

} // namespace

BlockLossResult blockCrossEntropy(const torch::Tensor &hidden,
                                  const torch::Tensor &lmHead,
                                  const torch::Tensor &labels,
                                  const torch::Tensor &weights,
                                  const BlockLossOptions &options) {
  auto shapeText = [](const Tensor &t) { return c10::str(t.sizes()); };
  if (hidden.dim() < 1 || lmHead.dim() != 2 || hidden.size(-1) != lmHead.size(1))
    throw FormatError("blockCrossEntropy: hidden " + shapeText(hidden) +
                      " and lm_head " + shapeText(lmHead) +
                      " do not share the hidden size");
  if (labels.sizes() != hidden.sizes().slice(0, hidden.dim() - 1) ||
      weights.sizes() != labels.sizes())
    throw FormatError("blockCrossEntropy: labels " + shapeText(labels) +
                      " and weights " + shapeText(weights) +
                      " must have the shape of hidden " + shapeText(hidden) +
                      " without its last dimension");
  if (labels.scalar_type() != torch::kLong)
    throw FormatError("blockCrossEntropy: labels must be int64");
  if (hidden.scalar_type() != lmHead.scalar_type() ||
      hidden.device() != lmHead.device())
    throw FormatError("blockCrossEntropy: hidden and lm_head must share dtype and device");
  if (lmHead.requires_grad())
    throw FormatError("blockCrossEntropy: the LM head is frozen; pass it detached "
                      "(it must not require grad)");

  const int64_t vocab = lmHead.size(0);
  Tensor flatWeights = weights.reshape({-1}).to(accumulationType(hidden));
  Tensor flatLabels = labels.reshape({-1});
  if ((flatWeights < 0).any().item<bool>())
    throw FormatError("blockCrossEntropy: weights must not be negative");
  Tensor selected = (flatWeights > 0).nonzero().squeeze(1);
  BlockLossResult result;
  result.weightSum = flatWeights.sum();
  result.correct = torch::zeros(labels.sizes(), labels.options().dtype(torch::kBool));
  if (selected.numel() == 0) {
    // Nothing to learn from: a zero that still carries a (zero) gradient.
    result.loss = (hidden.sum() * 0).to(accumulationType(hidden));
    return result;
  }
  Tensor rowLabels = flatLabels.index_select(0, selected);
  if (rowLabels.min().item<int64_t>() < 0 || rowLabels.max().item<int64_t>() >= vocab)
    throw FormatError("blockCrossEntropy: a label with positive weight is outside [0, " +
                      std::to_string(vocab) + ")");
  Tensor normalizer =
      options.normalizer > 0
          ? torch::full({}, options.normalizer, flatWeights.options())
          : result.weightSum;
  Tensor rows = hidden.reshape({-1, hidden.size(-1)}).index_select(0, selected);
  tensor_list outputs = ChunkedCrossEntropy::apply(
      rows, lmHead, rowLabels, flatWeights.index_select(0, selected),
      normalizer, rowsPerChunk(options, vocab));
  result.loss = outputs[0];
  result.correct.view({-1}).index_copy_(0, selected, outputs[1]);
  return result;
}

} // namespace dflex::runtime
