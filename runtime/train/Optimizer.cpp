#include "dflex/runtime/train/Optimizer.h"

#include "dflex/Support/Error.h"

#include <cmath>

namespace dflex::runtime {

LearningRateSchedule LearningRateSchedule::warmupCosine(double peak, double warmupRatio,
                                                        int64_t totalSteps) {
  LearningRateSchedule schedule;
  schedule.peak = peak;
  schedule.totalSteps = std::max<int64_t>(totalSteps, 1);
  schedule.warmupSteps = static_cast<int64_t>(std::ceil(warmupRatio * double(schedule.totalSteps)));
  return schedule;
}

double LearningRateSchedule::at(int64_t step) const {
  if (step < warmupSteps)
    return peak * double(step + 1) / double(warmupSteps);
  const int64_t decaySteps = std::max<int64_t>(totalSteps - warmupSteps, 1);
  const double progress = std::min(1.0, double(step - warmupSteps) / double(decaySteps));
  return peak * 0.5 * (1.0 + std::cos(M_PI * progress));
}

DrafterOptimizer::DrafterOptimizer(std::vector<std::pair<std::string, torch::Tensor>> parameters,
                                   AdamWOptions options)
    : options_(options) {
  torch::NoGradGuard noGrad;
  for (auto &[name, parameter] : parameters) {
    Slot slot;
    slot.name = name;
    slot.parameter = parameter;
    slot.master = parameter.detach().to(torch::kFloat).clone();
    slot.expAvg = torch::zeros_like(slot.master);
    slot.expAvgSq = torch::zeros_like(slot.master);
    slot.updates = torch::zeros({}, slot.master.options());
    slots_.push_back(std::move(slot));
  }
  // Buckets from the last parameter back; each slot's accumulator is a view.
  size_t end = slots_.size();
  while (end > 0) {
    size_t begin = end;
    int64_t elements = 0;
    while (begin > 0 && (elements == 0 || (elements + slots_[begin - 1].master.numel()) * 4 <= options_.bucketBytes))
      elements += slots_[--begin].master.numel();
    torch::Tensor bucket = torch::zeros({elements}, slots_[begin].master.options());
    int64_t offset = 0;
    for (size_t i = begin; i < end; ++i) {
      const int64_t n = slots_[i].master.numel();
      slots_[i].grad = bucket.narrow(0, offset, n).view(slots_[i].master.sizes());
      slots_[i].bucket = buckets_.size();
      offset += n;
    }
    buckets_.push_back(bucket);
    end = begin;
  }
}

void DrafterOptimizer::streamGradients(std::function<void(const torch::Tensor &)> bucketReady) {
  bucketReady_ = std::move(bucketReady);
  handedOver_ = 0;
  missing_.assign(buckets_.size(), 0);
  for (const Slot &slot : slots_)
    ++missing_[slot.bucket];
  for (Slot &slot : slots_) {
    slot.streamed = false;
    hooks_.push_back(slot.parameter.register_hook([this, &slot](const torch::Tensor &grad) {
      {
        torch::NoGradGuard noGrad;
        slot.grad.add_(grad.to(torch::kFloat));
      }
      std::lock_guard<std::mutex> lock(streamMutex_);
      slot.streamed = true;
      --missing_[slot.bucket];
      // Buckets are handed over in index order, whatever order the backward
      // completes them in: ranks must start their collectives alike.
      while (handedOver_ < buckets_.size() && missing_[handedOver_] == 0)
        bucketReady_(buckets_[handedOver_++]);
    }));
  }
}

void DrafterOptimizer::finishStreaming() {
  torch::NoGradGuard noGrad;
  for (size_t i = 0; i < slots_.size(); ++i)
    slots_[i].parameter.remove_hook(hooks_[i]);
  hooks_.clear();
  for (Slot &slot : slots_) {
    torch::Tensor &grad = slot.parameter.mutable_grad();
    if (grad.defined() && !slot.streamed)
      slot.grad.add_(grad.to(torch::kFloat));
    grad = torch::Tensor(); // what a hook saw is in the accumulator already
    slot.streamed = false;
  }
  while (handedOver_ < buckets_.size())
    bucketReady_(buckets_[handedOver_++]);
  bucketReady_ = nullptr;
}

std::array<double, 2> DrafterOptimizer::checksum() const {
  torch::NoGradGuard noGrad;
  torch::Tensor low = torch::zeros({}, torch::TensorOptions(torch::kLong).device(slots_.front().master.device()));
  torch::Tensor high = low.clone();
  for (const Slot &slot : slots_) {
    const torch::Tensor bits = slot.master.contiguous().view(torch::kInt);
    low += bits.bitwise_and(0xFFFF).to(torch::kLong).sum();
    high += bits.bitwise_right_shift(16).bitwise_and(0xFFFF).to(torch::kLong).sum();
  }
  const torch::Tensor both = torch::stack({low, high}).cpu();
  return {double(both[0].item<int64_t>()), double(both[1].item<int64_t>())};
}

void DrafterOptimizer::accumulate() {
  torch::NoGradGuard noGrad;
  for (Slot &slot : slots_) {
    torch::Tensor &grad = slot.parameter.mutable_grad();
    if (!grad.defined())
      continue;
    slot.grad.add_(grad.to(torch::kFloat));
    grad = torch::Tensor();
  }
}

DrafterOptimizer::StepResult DrafterOptimizer::step(double learningRate, double gradScale) {
  torch::NoGradGuard noGrad;
  StepResult result;
  std::vector<torch::Tensor> masters, grads, expAvgs, expAvgSqs, counts, parameters;
  for (Slot &slot : slots_) {
    masters.push_back(slot.master);
    grads.push_back(slot.grad);
    expAvgs.push_back(slot.expAvg);
    expAvgSqs.push_back(slot.expAvgSq);
    counts.push_back(slot.updates);
    parameters.push_back(slot.parameter);
  }
  // The global norm and the first non-finite gradient from per-tensor
  // norms, with one copy to the host for all tensors.
  const torch::Tensor norms = torch::stack(at::_foreach_norm(grads, 2)).to(torch::kDouble).cpu();
  const auto norm = norms.accessor<double, 1>();
  double squares = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const double scaled = gradScale * norm[int64_t(i)];
    if (!std::isfinite(scaled) && result.badTensor.empty())
      result.badTensor = slots_[i].name;
    squares += scaled * scaled;
  }
  result.gradNorm = std::sqrt(squares);
  if (!result.badTensor.empty()) {
    discardGradients();
    return result;
  }
  // As torch.nn.utils.clip_grad_norm_, folded into the gradients' scale.
  const double clip = options_.gradClip > 0 ? options_.gradClip / (result.gradNorm + 1e-6) : 1.0;
  const double factor = gradScale * std::min(clip, 1.0);
  if (factor != 1.0)
    at::_foreach_mul_(buckets_, factor);
  ++updates_;
  at::_foreach_add_(counts, 1.0);
  at::_fused_adamw_(masters, grads, expAvgs, expAvgSqs, /*max_exp_avg_sqs=*/{}, counts, learningRate,
                    options_.beta1, options_.beta2, options_.weightDecay, options_.eps,
                    /*amsgrad=*/false, /*maximize=*/false);
  at::_foreach_copy_(parameters, masters);
  discardGradients();
  result.applied = true;
  return result;
}

void DrafterOptimizer::discardGradients() {
  torch::NoGradGuard noGrad;
  at::_foreach_zero_(buckets_);
}

std::map<std::string, torch::Tensor> DrafterOptimizer::state() const {
  std::map<std::string, torch::Tensor> state;
  for (const Slot &slot : slots_) {
    state["master." + slot.name] = slot.master.cpu();
    state["exp_avg." + slot.name] = slot.expAvg.cpu();
    state["exp_avg_sq." + slot.name] = slot.expAvgSq.cpu();
  }
  state["updates"] = torch::tensor(updates_, torch::kLong);
  return state;
}

void DrafterOptimizer::loadState(const std::map<std::string, torch::Tensor> &state) {
  auto entry = [&](const std::string &name, const torch::Tensor &like) -> const torch::Tensor & {
    auto found = state.find(name);
    if (found == state.end())
      throw FormatError("optimizer state: no entry '" + name + "'");
    if (found->second.sizes() != like.sizes())
      throw FormatError("optimizer state: '" + name + "' has shape " +
                        c10::str(found->second.sizes()) + ", the parameter " +
                        c10::str(like.sizes()));
    return found->second;
  };
  torch::NoGradGuard noGrad;
  for (Slot &slot : slots_) {
    slot.master.copy_(entry("master." + slot.name, slot.master));
    slot.expAvg.copy_(entry("exp_avg." + slot.name, slot.master));
    slot.expAvgSq.copy_(entry("exp_avg_sq." + slot.name, slot.master));
    slot.parameter.copy_(slot.master);
  }
  updates_ = entry("updates", torch::tensor(int64_t(0))).item<int64_t>();
  for (Slot &slot : slots_)
    slot.updates.fill_(double(updates_));
  discardGradients();
}

} // namespace dflex::runtime
