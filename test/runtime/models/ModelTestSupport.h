// Helpers of the model tests: errors against a reference, the gated delta
// recurrence token by token, and the kernel bundles the tests run the
// dflex ops on.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace dflex::runtime::test {

/// max |actual - expected| / max |expected|, in float64 on the CPU.
inline double relativeError(const torch::Tensor &actual, const torch::Tensor &expected) {
  const torch::Tensor a = actual.detach().cpu().to(torch::kDouble);
  const torch::Tensor e = expected.detach().cpu().to(torch::kDouble);
  return (a - e).abs().max().item<double>() / std::max(e.abs().max().item<double>(), 1e-30);
}

/// The gated delta recurrence one token at a time, in float64 (with
/// autograd): q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g, beta [B, T, Hv].
inline torch::Tensor sequentialGatedDelta(const torch::Tensor &q, const torch::Tensor &k,
                                          const torch::Tensor &v, const torch::Tensor &g,
                                          const torch::Tensor &beta) {
  const int64_t batch = q.size(0), length = q.size(1), heads = v.size(2);
  const int64_t groups = heads / q.size(2);
  auto l2 = [](const torch::Tensor &x) {
    return x * torch::rsqrt(x.pow(2).sum(-1, true) + 1e-6);
  };
  const torch::Tensor query = l2(q.to(torch::kDouble)).repeat_interleave(groups, 2) /
                              std::sqrt(double(q.size(3)));
  const torch::Tensor key = l2(k.to(torch::kDouble)).repeat_interleave(groups, 2);
  const torch::Tensor value = v.to(torch::kDouble);
  torch::Tensor state = torch::zeros({batch, heads, q.size(3), v.size(3)}, torch::kDouble);
  std::vector<torch::Tensor> out;
  for (int64_t t = 0; t < length; ++t) {
    const torch::Tensor kt = key.select(1, t), vt = value.select(1, t), qt = query.select(1, t);
    state = state * g.select(1, t).to(torch::kDouble).exp().unsqueeze(-1).unsqueeze(-1);
    const torch::Tensor predicted = (state * kt.unsqueeze(-1)).sum(-2);
    const torch::Tensor delta =
        (vt - predicted) * beta.select(1, t).to(torch::kDouble).unsqueeze(-1);
    state = state + kt.unsqueeze(-1) * delta.unsqueeze(-2);
    out.push_back((state * qt.unsqueeze(-1)).sum(-2));
  }
  return torch::stack(out, 1);
}

/// Inputs of the gated delta rule: q, k [B, T, 2, 8], v [B, T, 6, 12], g in
/// (-2, 0] and beta in [0, 1) [B, T, 6], drawn from a fixed seed.
struct RuleInputs {
  torch::Tensor q, k, v, g, beta;
};

inline RuleInputs randomGatedDelta(int64_t batch, int64_t length) {
  torch::manual_seed(7);
  const int64_t keyHeads = 2, valueHeads = 6, keyDim = 8, valueDim = 12;
  RuleInputs in;
  in.q = torch::randn({batch, length, keyHeads, keyDim}, torch::kDouble);
  in.k = torch::randn({batch, length, keyHeads, keyDim}, torch::kDouble);
  in.v = torch::randn({batch, length, valueHeads, valueDim}, torch::kDouble);
  in.g = -torch::rand({batch, length, valueHeads}, torch::kDouble) * 2;
  in.beta = torch::rand({batch, length, valueHeads}, torch::kDouble);
  return in;
}

/// `folder`/`name` when it holds a bundle, else empty.
inline std::string bundleIn(const std::string &folder, const std::string &name) {
  if (folder.empty())
    return {};
  const std::string bundle = folder + "/" + name;
  return std::filesystem::exists(bundle + "/manifest.json") ? bundle : std::string();
}

/// The environment variable `variable`, else `built` (the folder this build's
/// CTest fixtures fill; empty in a build without dflex-compile).
inline std::string bundleFolder(const char *variable, const char *built) {
  const char *fromEnvironment = std::getenv(variable);
  return fromEnvironment && *fromEnvironment ? fromEnvironment : built;
}

#ifdef DFLEX_ATTENTION_BUNDLES
inline constexpr const char *kBuiltAttentionBundles = DFLEX_ATTENTION_BUNDLES;
#else
inline constexpr const char *kBuiltAttentionBundles = "";
#endif
#ifdef DFLEX_MODEL_BUNDLES
inline constexpr const char *kBuiltModelBundles = DFLEX_MODEL_BUNDLES;
#else
inline constexpr const char *kBuiltModelBundles = "";
#endif

/// An example's bundle (examples/<name>.mlir) from $DFLEX_ATTENTION_BUNDLES
/// or this build, else empty.
inline std::string exampleBundle(const std::string &name) {
  return bundleIn(bundleFolder("DFLEX_ATTENTION_BUNDLES", kBuiltAttentionBundles), name);
}

/// The bundle of model_specs.mlir from $DFLEX_MODEL_BUNDLES or this
/// build, else empty.
inline std::string modelSpecsBundle() {
  return bundleIn(bundleFolder("DFLEX_MODEL_BUNDLES", kBuiltModelBundles), "model_specs");
}

} // namespace dflex::runtime::test
