// The target side of a training pair: a thread that runs the target's
// forward for the batches submitted to it, on its own stream of the target's
// device, and copies the context features to the drafter's device on a copy
// stream, while the drafter trains on earlier batches. At most `depth`
// batches are in flight (a double buffer by default); a consumer takes the
// features in submission order, and its stream waits for the copy on the GPU
// (an event), never through host memory. The same code serves a pair of GPUs,
// one GPU with two streams, and the CPU (a thread).
#pragma once

#include "dflex/runtime/data/Batching.h"
#include "dflex/runtime/models/TargetModel.h"
#include "dflex/runtime/train/DrafterStep.h"

#include <torch/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace dflex::runtime {

/// Where the pair's time went since the last take().
struct PipelineTimes {
  double drafterWaitMs = 0; ///< the consumer waited for features
  double targetIdleMs = 0;  ///< the target's thread waited for a batch
  double copyMs = 0;        ///< device-to-device copies (CUDA events)
  double targetForwardMs = 0;
  int64_t batches = 0;
};

class FeaturePipeline {
public:
  FeaturePipeline(const models::TargetModel &target, std::vector<int64_t> targetLayerIds,
                  torch::Device drafterDevice, size_t depth = 2);
  ~FeaturePipeline();
  FeaturePipeline(const FeaturePipeline &) = delete;
  FeaturePipeline &operator=(const FeaturePipeline &) = delete;

  /// Queues `batch` (waits while `depth` batches are in flight).
  void submit(const TrainingBatch &batch);
  /// The features of the oldest submitted batch on the drafter's device,
  /// usable on its current stream. Rethrows what the target's thread threw.
  torch::Tensor next();
  /// Drops what is queued or in flight (a run that stops).
  void drain();

  /// The times since the last call, and resets them.
  PipelineTimes take();

private:
  struct Item {
    TrainingBatch batch;
    torch::Tensor features;
    std::shared_ptr<void> ready; // a CUDA event, when the copy ran on a GPU stream
    std::exception_ptr error;
    bool done = false;
  };
  void work();

  const models::TargetModel &target_;
  ContextFeatureProducer features_; // the target's forward (targetFeatures)
  torch::Device drafterDevice_;
  size_t depth_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::shared_ptr<Item>> items_; // submitted, oldest first
  size_t nextToRun_ = 0;                    // index in items_ of the next batch to compute
  bool stopping_ = false;
  PipelineTimes times_;
  std::thread thread_;
};

} // namespace dflex::runtime
