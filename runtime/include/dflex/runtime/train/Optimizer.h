// The drafter's optimizer: AdamW with float32 master weights and moments for
// parameters of any floating dtype (a bf16 drafter trains in bf16 and
// updates in float32), gradients accumulated in float32 over the micro-steps
// of one update, global gradient-norm clipping, and a step that refuses
// non-finite gradients, naming the tensor, without touching any weight. The
// update is LibTorch's fused multi-tensor AdamW (one pass over the state, as
// torch.optim.AdamW(fused=True)), the norms one multi-tensor pass. The
// learning rate follows a linear warmup then a cosine decay to 0.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace dflex::runtime {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0.01;
  double gradClip = 1.0; // 0: no clipping
  /// Bytes of float32 gradients per bucket (gradientBuckets()).
  int64_t bucketBytes = int64_t(25) << 20;
};

/// Linear warmup from 0 over `warmupSteps` updates, then cosine decay from
/// `peak` to 0 at `totalSteps`.
struct LearningRateSchedule {
  double peak = 0;
  int64_t warmupSteps = 0;
  int64_t totalSteps = 1;
  /// warmupSteps = ceil(warmupRatio * totalSteps).
  static LearningRateSchedule warmupCosine(double peak, double warmupRatio, int64_t totalSteps);
  /// The rate of update `step` (0-based).
  double at(int64_t step) const;
};

class DrafterOptimizer {
public:
  /// `parameters` by name (Module::named_parameters order); their float32
  /// master copies start equal to them.
  DrafterOptimizer(std::vector<std::pair<std::string, torch::Tensor>> parameters,
                   AdamWOptions options);

  /// Adds the parameters' .grad into the float32 accumulators and clears
  /// .grad (after each micro-step's backward; parameters without a
  /// gradient add nothing).
  void accumulate();

  struct StepResult {
    double gradNorm = 0;   // of the accumulated gradients, before clipping
    bool applied = false;  // false: a gradient was NaN or infinite
    std::string badTensor; // the first such parameter
  };
  /// One AdamW update at `learningRate` from the accumulated gradients
  /// (scaled by `gradScale`, e.g. 1 / micro-steps), clipped to the global
  /// norm; the parameters get the master weights in their dtype. Non-finite
  /// gradients skip the update (nothing changes but the accumulators,
  /// which every step clears).
  StepResult step(double learningRate, double gradScale = 1.0);
  /// Drops the accumulated gradients without an update.
  void discardGradients();

  int64_t updates() const { return updates_; }

  /// For an update's last micro-step, where data-parallel ranks sum the
  /// gradients while the backward goes on: from now until
  /// finishStreaming(), each parameter's gradient is added to its
  /// accumulator as the backward produces it, and `bucketReady` is called
  /// with each bucket once all its gradients are in (from the backward's
  /// thread), in bucket order. finishStreaming() takes what no hook saw and
  /// hands over the buckets not yet handed over.
  void streamGradients(std::function<void(const torch::Tensor &bucket)> bucketReady);
  void finishStreaming();

  /// The float32 gradient accumulators, as flat buckets of about
  /// AdamWOptions::bucketBytes (parameters in reverse order, as a backward
  /// produces them): what data-parallel ranks sum before step().
  const std::vector<torch::Tensor> &gradientBuckets() const { return buckets_; }

  /// Exact integer sums of the master weights' bit patterns (their low and
  /// high 16 bits): ranks whose weights differ in any bit differ here, but
  /// for a collision.
  std::array<double, 2> checksum() const;

  /// Master weights, moments and the update count, by name
  /// ("master.<p>", "exp_avg.<p>", "exp_avg_sq.<p>", "updates"), on the CPU.
  std::map<std::string, torch::Tensor> state() const;
  /// Restores state(); the parameters get the master weights. Throws
  /// FormatError naming a missing or mis-shaped entry.
  void loadState(const std::map<std::string, torch::Tensor> &state);

private:
  struct Slot {
    std::string name;
    torch::Tensor parameter, master, grad, expAvg, expAvgSq;
    torch::Tensor updates; // float32 scalar beside the master: the fused update's count
    size_t bucket = 0;
    bool streamed = false; // its gradient came through a hook this micro-step
  };
  std::vector<Slot> slots_;
  std::vector<torch::Tensor> buckets_; // slots' grad are views into them
  // While streaming: hooks, gradients still missing per bucket, the callback.
  std::mutex streamMutex_;
  std::vector<unsigned> hooks_;
  std::vector<size_t> missing_;
  size_t handedOver_ = 0; // buckets before it are handed to bucketReady
  std::function<void(const torch::Tensor &)> bucketReady_;
  AdamWOptions options_;
  int64_t updates_ = 0;
};

} // namespace dflex::runtime
