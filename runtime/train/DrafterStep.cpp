#include "dflex/runtime/train/DrafterStep.h"

#include "dflex/runtime/train/DrafterInputs.h"

#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <cmath>

namespace dflex::runtime {

namespace {

using Clock = std::chrono::steady_clock;

/// Milliseconds since `start`, once `device`'s queued work is done.
double millisecondsSince(Clock::time_point start, torch::Device device) {
  if (device.is_cuda()) // this thread's stream only: a target on another stream runs on
    c10::cuda::getCurrentCUDAStream(device.has_index() ? device.index() : 0).synchronize();
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

} // namespace

ContextFeatureProducer targetFeatures(const models::TargetModel &target,
                                      std::vector<int64_t> targetLayerIds) {
  return [&target, layers = std::move(targetLayerIds)](const TrainingBatch &batch) {
    torch::NoGradGuard noGrad;
    models::TargetInputs inputs;
    inputs.inputIds = batch.tokens;
    inputs.positionIds = batch.positionIds;
    inputs.cuSeqlens = batch.cuSeqlens;
    inputs.captureLayers = layers;
    return models::concatContextFeatures(target.forward(inputs).hiddenStates);
  };
}

void BlockAccuracy::add(const torch::Tensor &correctTensor, const torch::Tensor &weightTensor) {
  const torch::Tensor right = correctTensor.to(torch::kCPU, torch::kBool).contiguous();
  const torch::Tensor scored = (weightTensor.to(torch::kCPU) > 0).contiguous();
  const int64_t positions = right.size(-1);
  if (correct.empty()) {
    correct.assign(positions - 1, 0);
    counted.assign(positions - 1, 0);
  }
  const torch::Tensor rightRows = right.reshape({-1, positions});
  const torch::Tensor scoredRows = scored.reshape({-1, positions});
  const auto r = rightRows.accessor<bool, 2>();
  const auto s = scoredRows.accessor<bool, 2>();
  for (int64_t block = 0; block < r.size(0); ++block) {
    if (!s[block][1])
      continue; // a padding block, or one without its first label
    ++blocks;
    bool accepting = true;
    for (int64_t k = 1; k < positions; ++k) {
      if (!s[block][k]) {
        accepting = false;
        continue;
      }
      ++counted[k - 1];
      correct[k - 1] += r[block][k];
      accepting = accepting && r[block][k];
      acceptedTokens += accepting;
    }
  }
}

std::vector<double> BlockAccuracy::byPosition() const {
  std::vector<double> accuracy;
  for (size_t k = 0; k < correct.size(); ++k)
    accuracy.push_back(counted[k] ? double(correct[k]) / double(counted[k]) : 0.0);
  return accuracy;
}

double BlockAccuracy::acceptanceLength() const {
  return 1.0 + (blocks ? double(acceptedTokens) / double(blocks) : 0.0);
}

void BlockAccuracy::sumOver(DataParallel &ranks) {
  if (ranks.worldSize() == 1)
    return;
  std::vector<double> counts(correct.begin(), correct.end());
  counts.insert(counts.end(), counted.begin(), counted.end());
  counts.push_back(double(blocks));
  counts.push_back(double(acceptedTokens));
  torch::Tensor total = torch::tensor(counts, torch::kDouble);
  ranks.sum({total}, "accuracy counts");
  const auto t = total.accessor<double, 1>();
  const size_t k = correct.size();
  for (size_t i = 0; i < k; ++i) {
    correct[i] = int64_t(t[int64_t(i)]);
    counted[i] = int64_t(t[int64_t(k + i)]);
  }
  blocks = int64_t(t[int64_t(2 * k)]);
  acceptedTokens = int64_t(t[int64_t(2 * k + 1)]);
}

DrafterStep::DrafterStep(models::DFlashDrafter drafter, DrafterOptimizer &optimizer,
                         ContextFeatureProducer features, BlockLossOptions lossOptions,
                         DataParallel *ranks)
    : drafter_(std::move(drafter)), optimizer_(optimizer), features_(std::move(features)),
      lossOptions_(lossOptions), ranks_(ranks) {}

StepMetrics DrafterStep::run(const std::vector<TrainingBatch> &microBatches, double learningRate) {
  StepMetrics metrics;
  metrics.learningRate = learningRate;
  // One normaliser for the whole update: its micro-batches' weight sum.
  double weightSum = 0;
  for (const TrainingBatch &batch : microBatches) {
    weightSum += batch.weights.sum().item<double>();
    metrics.contextTokens += (batch.documentIds >= 0).sum().item<int64_t>();
  }
  if (ranks_) {
    weightSum = ranks_->sum(weightSum, "the update's loss weight");
    metrics.contextTokens = int64_t(ranks_->sum(double(metrics.contextTokens), "context tokens"));
  }
  BlockLossOptions lossOptions = lossOptions_;
  // No weight at all: a zero loss, every pass still runs (ranks stay in step).
  lossOptions.normalizer = weightSum > 0 ? weightSum : 1.0;

  const torch::Device device = drafter_->fc->weight.device();
  for (const TrainingBatch &batch : microBatches) {
    Clock::time_point start = Clock::now();
    torch::Tensor features = features_(batch);
    metrics.times.featuresMs += millisecondsSince(start, features.device());

    start = Clock::now();
    const models::DrafterInputs inputs = drafterInputs(batch, features.to(device), device);
    features = torch::Tensor();
    const torch::Tensor labels = batch.labels.to(device), weights = batch.weights.to(device);
    metrics.times.transferMs += millisecondsSince(start, device);

    start = Clock::now();
    const torch::Tensor hidden = drafter_->forward(inputs);
    const BlockLossResult loss = drafter_->loss(hidden, labels, weights, lossOptions);
    metrics.times.forwardMs += millisecondsSince(start, device);

    start = Clock::now();
    // On the last micro-step, ranks start summing each gradient bucket as
    // soon as the backward has produced it.
    const bool stream = ranks_ && ranks_->connected() && &batch == &microBatches.back();
    if (stream)
      optimizer_.streamGradients([this](const torch::Tensor &bucket) { ranks_->startSum(bucket); });
    loss.loss.backward();
    if (stream)
      optimizer_.finishStreaming();
    else
      optimizer_.accumulate();
    metrics.times.backwardMs += millisecondsSince(start, device);
    metrics.loss += loss.loss.item<double>();
    metrics.accuracy.add(loss.correct, batch.weights);
  }

  if (ranks_) {
    const Clock::time_point start = Clock::now();
    if (ranks_->connected())
      ranks_->finishSums("gradients"); // what the backward did not hide
    metrics.times.allReduceMs = millisecondsSince(start, device);
    metrics.loss = ranks_->sum(metrics.loss, "loss");
    metrics.accuracy.sumOver(*ranks_);
  }
  if (!std::isfinite(metrics.loss)) {
    optimizer_.discardGradients();
    metrics.badTensor = "loss";
    return metrics;
  }
  const Clock::time_point start = Clock::now();
  const DrafterOptimizer::StepResult update = optimizer_.step(learningRate);
  metrics.times.optimizerMs = millisecondsSince(start, device);
  metrics.gradNorm = update.gradNorm;
  metrics.applied = update.applied;
  metrics.badTensor = update.badTensor;
  return metrics;
}

} // namespace dflex::runtime
