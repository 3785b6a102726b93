// One training update: the drafter learns, micro-batches make the update of
// the batch that holds them, a batch without anchors still steps, and the
// accuracy and acceptance-length bookkeeping.
#include "DrafterTestSupport.h"
#include "TestSupport.h"

#include "dflex/runtime/train/DrafterStep.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace dflex::runtime;
using dflex::runtime::test::kHidden;
using dflex::runtime::test::kVocab;
using dflex::runtime::test::packedRow;

namespace {

BlockOptions blockOptions() {
  BlockOptions options;
  options.blockSize = test::kBlockSize;
  options.maxAnchors = 6;
  options.maskTokenId = 299;
  return options;
}

/// A tiny drafter on the CPU with the target's frozen embedding and LM head.
models::DFlashDrafter tinyDrafter(torch::ScalarType dtype) {
  models::DFlashDrafter drafter(test::tinyDrafterConfig(), 0, 7);
  drafter->to(dtype);
  torch::manual_seed(3);
  drafter->setTargetWeights(torch::randn({kVocab, kHidden}).to(dtype),
                            (torch::randn({kVocab, kHidden}) * 0.2).to(dtype));
  return drafter;
}

/// Context features that are a fixed function of the tokens, as a target's
/// would be.
ContextFeatureProducer tokenFeatures(torch::ScalarType dtype) {
  torch::manual_seed(9);
  const torch::Tensor table = torch::randn({kVocab, 2 * kHidden}).to(dtype);
  return [table](const TrainingBatch &batch) {
    const torch::Tensor &tokens = batch.tokens;
    return table.index_select(0, tokens.flatten()).view({tokens.size(0), tokens.size(1), -1});
  };
}

TEST(DrafterStep, TheDrafterLearns) {
  models::DFlashDrafter drafter = tinyDrafter(torch::kFloat);
  DrafterOptimizer optimizer(drafter->named_parameters().pairs(), AdamWOptions{});
  DrafterStep step(drafter, optimizer, tokenFeatures(torch::kFloat));
  const TrainingBatch batch =
      makeTrainingBatch({packedRow({13, 17}, 30, 1), packedRow({21}, 30, 2)}, blockOptions(), 11);
  StepMetrics first, last;
  for (int update = 0; update < 30; ++update) {
    const StepMetrics metrics = step.run({batch}, 1e-2);
    ASSERT_TRUE(metrics.applied) << metrics.badTensor;
    (update == 0 ? first : last) = metrics;
  }
  EXPECT_LT(last.loss, 0.5 * first.loss) << first.loss << " -> " << last.loss;
  EXPECT_GT(last.accuracy.byPosition()[0], first.accuracy.byPosition()[0]);
  EXPECT_GT(last.accuracy.acceptanceLength(), first.accuracy.acceptanceLength());
  EXPECT_EQ(first.contextTokens, 51);
  EXPECT_EQ(optimizer.updates(), 30);
}

TEST(DrafterStep, MicroBatchesAreNormalisedAsOneBatch) {
  // The same batch as two micro-batches: the normaliser is their joint
  // weight sum, so the loss and the update equal those of the batch once.
  const TrainingBatch batch =
      makeTrainingBatch({packedRow({13, 17}, 30, 1), packedRow({21}, 30, 2)}, blockOptions(), 11);
  models::DFlashDrafter once = tinyDrafter(torch::kDouble), twice = tinyDrafter(torch::kDouble);
  DrafterOptimizer a(once->named_parameters().pairs(), AdamWOptions{}),
      b(twice->named_parameters().pairs(), AdamWOptions{});
  DrafterStep stepOnce(once, a, tokenFeatures(torch::kDouble));
  DrafterStep stepTwice(twice, b, tokenFeatures(torch::kDouble));
  for (int update = 0; update < 3; ++update) {
    const StepMetrics one = stepOnce.run({batch}, 1e-3);
    const StepMetrics two = stepTwice.run({batch, batch}, 1e-3);
    EXPECT_NEAR(one.loss, two.loss, 1e-12 * one.loss);
    EXPECT_NEAR(one.gradNorm, two.gradNorm, 1e-9 * one.gradNorm);
    EXPECT_EQ(two.accuracy.blocks, 2 * one.accuracy.blocks);
  }
  const auto pa = once->named_parameters(), pb = twice->named_parameters();
  for (const auto &item : pa)
    EXPECT_TRUE(torch::allclose(item.value(), pb[item.key()], 1e-6, 1e-9)) << item.key();
}

TEST(DrafterStep, ABatchWithoutAnchorsStillSteps) {
  models::DFlashDrafter drafter = tinyDrafter(torch::kFloat);
  DrafterOptimizer optimizer(drafter->named_parameters().pairs(), AdamWOptions{});
  DrafterStep step(drafter, optimizer, tokenFeatures(torch::kFloat));
  PackedRow row = packedRow({12}, 16, 4);
  std::fill(row.lossMask.begin(), row.lossMask.end(), 0); // no position trains
  const TrainingBatch empty = makeTrainingBatch({row}, blockOptions(), 1);
  ASSERT_FALSE(empty.blockValid.any().item<bool>());
  const StepMetrics metrics = step.run({empty}, 1e-3);
  EXPECT_TRUE(metrics.applied);
  EXPECT_EQ(metrics.loss, 0.0);
  EXPECT_EQ(metrics.gradNorm, 0.0);
  EXPECT_EQ(metrics.accuracy.blocks, 0);
  EXPECT_EQ(metrics.accuracy.acceptanceLength(), 1.0);
  EXPECT_EQ(optimizer.updates(), 1);
}

TEST(BlockAccuracy, CountsPositionsAndLeadingAcceptedTokens) {
  // Two blocks of 4: positions 1..3. Block 0 right, wrong, right (accepts 1);
  // block 1 right, right, unscored (accepts 2); block 2 is padding.
  const torch::Tensor correct =
      torch::tensor({0, 1, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0}, torch::kBool).view({1, 3, 4});
  const torch::Tensor weights =
      torch::tensor({0.f, 1.f, 0.9f, 0.8f, 0.f, 1.f, 0.9f, 0.f, 0.f, 0.f, 0.f, 0.f}).view({1, 3, 4});
  BlockAccuracy accuracy;
  accuracy.add(correct, weights);
  EXPECT_EQ(accuracy.blocks, 2);
  EXPECT_EQ(accuracy.counted, (std::vector<int64_t>{2, 2, 1}));
  EXPECT_EQ(accuracy.correct, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(accuracy.byPosition(), (std::vector<double>{1.0, 0.5, 1.0}));
  EXPECT_DOUBLE_EQ(accuracy.acceptanceLength(), 1.0 + (1 + 2) / 2.0);
}

} // namespace
