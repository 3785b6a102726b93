// The drafter's optimizer against LibTorch's AdamW and clip_grad_norm_, its
// float32 master weights for bf16 parameters, non-finite gradients, the
// learning-rate schedule, and its state round trip.
#include "TestSupport.h"

#include "dflex/Support/Error.h"
#include "dflex/runtime/train/Optimizer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

using namespace dflex::runtime;
using dflex::FormatError;
using dflex::runtime::test::expectError;

namespace {

std::vector<std::pair<std::string, torch::Tensor>> named(const std::vector<torch::Tensor> &tensors) {
  std::vector<std::pair<std::string, torch::Tensor>> result;
  for (size_t i = 0; i < tensors.size(); ++i)
    result.emplace_back("p" + std::to_string(i), tensors[i]);
  return result;
}

/// Random parameters of odd sizes, and a gradient for each.
std::vector<torch::Tensor> parameters(torch::ScalarType dtype) {
  torch::manual_seed(5);
  return {torch::randn({7, 13}).to(dtype).requires_grad_(),
          torch::randn({29}).to(dtype).requires_grad_()};
}

void setGrads(const std::vector<torch::Tensor> &params, int step, double scale = 1.0) {
  torch::manual_seed(100 + step);
  for (const torch::Tensor &p : params)
    p.mutable_grad() = (torch::randn(p.sizes()) * scale).to(p.scalar_type());
}

TEST(DrafterOptimizer, EqualsLibTorchAdamWWithClipping) {
  const AdamWOptions options{0.9, 0.95, 1e-8, 0.1, 0.5};
  std::vector<torch::Tensor> ours = parameters(torch::kFloat);
  std::vector<torch::Tensor> theirs;
  for (const torch::Tensor &p : ours)
    theirs.push_back(p.detach().clone().requires_grad_());
  DrafterOptimizer optimizer(named(ours), options);
  torch::optim::AdamW reference(theirs, torch::optim::AdamWOptions(1e-3)
                                            .betas({options.beta1, options.beta2})
                                            .eps(options.eps)
                                            .weight_decay(options.weightDecay));
  for (int step = 0; step < 5; ++step) {
    const double lr = 1e-3 * (step + 1);
    setGrads(ours, step, 3.0);
    setGrads(theirs, step, 3.0);
    optimizer.accumulate();
    const DrafterOptimizer::StepResult result = optimizer.step(lr);
    const double norm = torch::nn::utils::clip_grad_norm_(theirs, options.gradClip);
    static_cast<torch::optim::AdamWOptions &>(reference.param_groups()[0].options()).lr(lr);
    reference.step();
    EXPECT_TRUE(result.applied);
    EXPECT_NEAR(result.gradNorm, norm, 1e-5 * norm);
    for (size_t i = 0; i < ours.size(); ++i)
      EXPECT_TRUE(torch::allclose(ours[i], theirs[i], 1e-6, 1e-7)) << "step " << step << " p" << i;
  }
  EXPECT_EQ(optimizer.updates(), 5);
}

TEST(DrafterOptimizer, Bf16ParametersUpdateFromFloat32Masters) {
  std::vector<torch::Tensor> bf16 = parameters(torch::kBFloat16);
  std::vector<torch::Tensor> fp32;
  for (const torch::Tensor &p : bf16)
    fp32.push_back(p.detach().to(torch::kFloat).requires_grad_());
  const AdamWOptions options{0.9, 0.999, 1e-8, 0.0, 0.0};
  DrafterOptimizer low(named(bf16), options), high(named(fp32), options);
  // Steps far below bf16's resolution still move the float32 masters.
  for (int step = 0; step < 20; ++step) {
    setGrads(bf16, step);
    setGrads(fp32, step);
    for (size_t i = 0; i < fp32.size(); ++i)
      fp32[i].mutable_grad() = bf16[i].grad().to(torch::kFloat);
    low.accumulate();
    high.accumulate();
    low.step(1e-5);
    high.step(1e-5);
  }
  const auto lowState = low.state(), highState = high.state();
  for (const char *name : {"master.p0", "master.p1"})
    EXPECT_TRUE(torch::equal(lowState.at(name), highState.at(name))) << name;
  for (size_t i = 0; i < bf16.size(); ++i) {
    EXPECT_EQ(bf16[i].scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(bf16[i], fp32[i].to(torch::kBFloat16)));
  }
}

TEST(DrafterOptimizer, AccumulatesMicroStepsInFloat32) {
  std::vector<torch::Tensor> once = parameters(torch::kFloat), twice = parameters(torch::kFloat);
  const AdamWOptions options{0.9, 0.999, 1e-8, 0.01, 1.0};
  DrafterOptimizer a(named(once), options), b(named(twice), options);
  setGrads(once, 0, 2.0);
  a.accumulate();
  // Two halves of the same gradient, averaged by the scale.
  for (int half = 0; half < 2; ++half) {
    setGrads(twice, 0, 2.0);
    b.accumulate();
  }
  const auto ra = a.step(1e-3), rb = b.step(1e-3, 0.5);
  EXPECT_NEAR(ra.gradNorm, rb.gradNorm, 1e-5 * ra.gradNorm);
  for (size_t i = 0; i < once.size(); ++i)
    EXPECT_TRUE(torch::allclose(once[i], twice[i], 1e-6, 1e-7));
}

TEST(DrafterOptimizer, StreamedGradientsEqualAccumulatedOnesAndBucketsComeInOrder) {
  // Buckets of one parameter each (the cap is below either's size).
  AdamWOptions options;
  options.bucketBytes = 64;
  std::vector<torch::Tensor> plain = parameters(torch::kFloat), streamed = parameters(torch::kFloat);
  DrafterOptimizer a(named(plain), options), b(named(streamed), options);
  ASSERT_EQ(b.gradientBuckets().size(), 2u);
  auto lossOf = [](const std::vector<torch::Tensor> &p) {
    return (p[0].pow(2).sum() * 0.5) + (p[1] * p[1].detach().cos()).sum();
  };
  lossOf(plain).backward();
  a.accumulate();
  std::vector<const void *> handedOver;
  b.streamGradients([&](const torch::Tensor &bucket) { handedOver.push_back(bucket.data_ptr()); });
  lossOf(streamed).backward();
  // The backward produced both; the hooks handed both over, in bucket order.
  ASSERT_EQ(handedOver.size(), 2u);
  b.finishStreaming();
  EXPECT_EQ(handedOver.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(handedOver[i], b.gradientBuckets()[i].data_ptr());
    EXPECT_TRUE(torch::equal(a.gradientBuckets()[i], b.gradientBuckets()[i]));
    EXPECT_FALSE(streamed[i].grad().defined()); // taken, not left to accumulate twice
  }
  // Buckets run from the last parameter back: bucket 0 holds p1. A backward
  // that reaches p1 only completes bucket 0; p0's bucket is handed over by
  // finishStreaming.
  handedOver.clear();
  b.streamGradients([&](const torch::Tensor &bucket) { handedOver.push_back(bucket.data_ptr()); });
  (streamed[1].sum() * 3).backward();
  EXPECT_EQ(handedOver, std::vector<const void *>{b.gradientBuckets()[0].data_ptr()});
  b.finishStreaming();
  EXPECT_EQ(handedOver.size(), 2u);
}

TEST(DrafterOptimizer, ChecksumsSeeASingleBit) {
  std::vector<torch::Tensor> same = parameters(torch::kFloat), flipped = parameters(torch::kFloat);
  {
    torch::NoGradGuard noGrad;
    flipped[1].view(torch::kInt)[17].bitwise_xor_(1); // the lowest mantissa bit of one weight
  }
  const DrafterOptimizer a(named(parameters(torch::kFloat)), {}), b(named(same), {}), c(named(flipped), {});
  EXPECT_EQ(a.checksum(), b.checksum());
  EXPECT_NE(a.checksum(), c.checksum());
}

TEST(DrafterOptimizer, NonFiniteGradientsSkipTheUpdateAndNameTheTensor) {
  std::vector<torch::Tensor> params = parameters(torch::kFloat);
  const std::vector<torch::Tensor> before = {params[0].detach().clone(), params[1].detach().clone()};
  DrafterOptimizer optimizer(named(params), AdamWOptions{});
  setGrads(params, 0);
  params[1].mutable_grad()[3].fill_(std::nan(""));
  optimizer.accumulate();
  const DrafterOptimizer::StepResult result = optimizer.step(1e-3);
  EXPECT_FALSE(result.applied);
  EXPECT_EQ(result.badTensor, "p1");
  EXPECT_EQ(optimizer.updates(), 0);
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(torch::equal(params[i], before[i]));
  // The bad gradient is gone: the next step starts clean.
  setGrads(params, 1);
  optimizer.accumulate();
  EXPECT_TRUE(optimizer.step(1e-3).applied);
}

TEST(DrafterOptimizer, StateRoundTripContinuesExactly) {
  std::vector<torch::Tensor> a = parameters(torch::kBFloat16), b = parameters(torch::kBFloat16);
  DrafterOptimizer first(named(a), AdamWOptions{}), second(named(b), AdamWOptions{});
  for (int step = 0; step < 3; ++step) {
    setGrads(a, step);
    first.accumulate();
    first.step(1e-3);
  }
  second.loadState(first.state());
  EXPECT_EQ(second.updates(), 3);
  for (int step = 3; step < 6; ++step) {
    setGrads(a, step);
    setGrads(b, step);
    first.accumulate();
    second.accumulate();
    first.step(1e-3);
    second.step(1e-3);
  }
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::equal(a[i], b[i]));
  auto state = first.state();
  state.erase("exp_avg.p1");
  expectError<FormatError>([&] { second.loadState(state); }, {"'exp_avg.p1'"});
  state = first.state();
  state["master.p0"] = torch::zeros({3});
  expectError<FormatError>([&] { second.loadState(state); }, {"'master.p0'", "shape"});
}

TEST(LearningRateSchedule, WarmsUpLinearlyThenDecaysAsACosine) {
  const LearningRateSchedule schedule = LearningRateSchedule::warmupCosine(6e-4, 0.04, 100);
  EXPECT_EQ(schedule.warmupSteps, 4);
  EXPECT_DOUBLE_EQ(schedule.at(0), 6e-4 / 4);
  EXPECT_DOUBLE_EQ(schedule.at(3), 6e-4);
  EXPECT_DOUBLE_EQ(schedule.at(4), 6e-4);
  EXPECT_NEAR(schedule.at(52), 3e-4, 1e-12); // half way through the decay
  EXPECT_NEAR(schedule.at(100), 0.0, 1e-18);
  for (int64_t step = 5; step < 100; ++step)
    EXPECT_LT(schedule.at(step), schedule.at(step - 1));
}

} // namespace
