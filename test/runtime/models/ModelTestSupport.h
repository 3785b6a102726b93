// Helpers of the model tests: errors against a reference, and the kernel
// bundles the tests run the dflex ops on.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace dflex::runtime::test {

/// max |actual - expected| / max |expected|, in float64 on the CPU.
inline double relativeError(const torch::Tensor &actual, const torch::Tensor &expected) {
  const torch::Tensor a = actual.detach().cpu().to(torch::kDouble);
  const torch::Tensor e = expected.detach().cpu().to(torch::kDouble);
  return (a - e).abs().max().item<double>() / std::max(e.abs().max().item<double>(), 1e-30);
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

/// The bundle of target_model_specs.mlir from $DFLEX_MODEL_BUNDLES or this
/// build, else empty.
inline std::string targetSpecsBundle() {
  return bundleIn(bundleFolder("DFLEX_MODEL_BUNDLES", kBuiltModelBundles), "target_model_specs");
}

} // namespace dflex::runtime::test
