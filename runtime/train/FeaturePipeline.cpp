#include "dflex/runtime/train/FeaturePipeline.h"

#include "dflex/runtime/train/DrafterStep.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <chrono>
#include <optional>

namespace dflex::runtime {

namespace {

using Clock = std::chrono::steady_clock;

double millisecondsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

int indexOf(torch::Device device) { return device.has_index() ? device.index() : 0; }

} // namespace

FeaturePipeline::FeaturePipeline(const models::TargetModel &target,
                                 std::vector<int64_t> targetLayerIds, torch::Device drafterDevice,
                                 size_t depth)
    : target_(target), features_(targetFeatures(target, std::move(targetLayerIds))),
      drafterDevice_(drafterDevice),
      depth_(std::max<size_t>(depth, 1)) {
  thread_ = std::thread([this] { work(); });
}

FeaturePipeline::~FeaturePipeline() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void FeaturePipeline::submit(const TrainingBatch &batch) {
  auto item = std::make_shared<Item>();
  item->batch = batch;
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return items_.size() < depth_; });
  items_.push_back(std::move(item));
  changed_.notify_all();
}

void FeaturePipeline::work() {
  const torch::Device targetDevice = target_.device();
  std::optional<c10::cuda::CUDAStream> targetStream, copyStream;
  if (targetDevice.is_cuda())
    targetStream = c10::cuda::getStreamFromPool(false, indexOf(targetDevice));
  if (drafterDevice_.is_cuda() && drafterDevice_ != targetDevice)
    copyStream = c10::cuda::getStreamFromPool(false, indexOf(drafterDevice_));
  while (true) {
    std::shared_ptr<Item> item;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      const Clock::time_point idle = Clock::now();
      changed_.wait(lock, [&] { return stopping_ || nextToRun_ < items_.size(); });
      times_.targetIdleMs += millisecondsSince(idle);
      if (stopping_)
        return;
      item = items_[nextToRun_++];
    }
    try {
      torch::NoGradGuard noGrad;
      std::optional<c10::cuda::CUDAStreamGuard> onTarget;
      if (targetStream)
        onTarget.emplace(*targetStream);
      const Clock::time_point start = Clock::now();
      torch::Tensor features = features_(item->batch);
      if (targetStream)
        targetStream->synchronize(); // the forward's own time, on this thread only
      const double forwardMs = millisecondsSince(start);
      double copyMs = 0;
      if (copyStream) {
        // Device to device on the copy stream, which waits for the target's.
        c10::cuda::CUDAStreamGuard onCopy(*copyStream);
        auto begin = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
        auto end = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
        begin->record(*copyStream);
        features = features.to(drafterDevice_, /*non_blocking=*/true);
        end->record(*copyStream);
        end->synchronize();
        copyMs = begin->elapsed_time(*end);
        item->ready = end;
      } else if (targetStream && drafterDevice_.is_cuda()) {
        // One GPU, two streams: the consumer's stream waits for this one.
        auto end = std::make_shared<at::cuda::CUDAEvent>();
        end->record(*targetStream);
        item->ready = end;
      } else if (features.device() != drafterDevice_) {
        features = features.to(drafterDevice_);
      }
      item->features = std::move(features);
      std::lock_guard<std::mutex> lock(mutex_);
      times_.copyMs += copyMs;
      times_.targetForwardMs += forwardMs;
    } catch (...) {
      item->error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      item->done = true;
    }
    changed_.notify_all();
  }
}

torch::Tensor FeaturePipeline::next() {
  std::shared_ptr<Item> item;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const Clock::time_point start = Clock::now();
    changed_.wait(lock, [&] { return !items_.empty() && items_.front()->done; });
    times_.drafterWaitMs += millisecondsSince(start);
    ++times_.batches;
    item = items_.front();
    items_.pop_front();
    --nextToRun_;
  }
  changed_.notify_all();
  if (item->error)
    std::rethrow_exception(item->error);
  if (item->ready) {
    const c10::cuda::CUDAStream consumer = c10::cuda::getCurrentCUDAStream(indexOf(drafterDevice_));
    static_cast<at::cuda::CUDAEvent *>(item->ready.get())->block(consumer);
    // The allocator must not hand the features' memory to the target's
    // stream again before the consumer is done with it.
    item->features.record_stream(consumer);
  }
  return item->features;
}

void FeaturePipeline::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  // Batches not started are dropped; those running are waited for.
  items_.erase(items_.begin() + std::ptrdiff_t(nextToRun_), items_.end());
  changed_.wait(lock, [&] {
    for (const auto &item : items_)
      if (!item->done)
        return false;
    return true;
  });
  items_.clear();
  nextToRun_ = 0;
  changed_.notify_all();
}

PipelineTimes FeaturePipeline::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  PipelineTimes times = times_;
  times_ = PipelineTimes();
  return times;
}

} // namespace dflex::runtime
