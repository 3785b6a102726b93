// The example bundles dflex-compile wrote (the CTest fixture
// dflex-attention-example-bundles, default archs sm_90a and sm_120): they
// open, carry the Hopper kernels where the head dim has them, each arch's
// binary carries its own configs' launch constants, the runtime picks its
// kernels and tiles from them per device, and compiling a bundle's source at
// run time for an arch it has reproduces its binary and constants exactly.
#include "TestSupport.h"

#include "dflex/runtime/attention/AttentionOp.h"
#include "dflex/Support/Error.h"
#include "dflex/runtime/bundle/KernelBundle.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <tuple>

using namespace dflex::runtime;
namespace bundle = dflex::bundle;
using dflex::FormatError;
using dflex::IoError;

namespace {

std::filesystem::path bundles() { return DFLEX_ATTENTION_BUNDLES; }

TEST(ExampleBundles, AllOpenWithTheirCaptures) {
  const std::map<std::string, std::vector<std::string>> expected = {
      {"causal", {}},
      {"dflash", {"anchors", "context_start", "ctx_len"}},
      {"dflash_sliding_window", {"anchors", "context_start", "ctx_len", "window"}},
      {"document_mask", {"document_ids"}},
      {"relative_bias", {"bias_table"}},
      {"softcap", {}},
  };
  for (const auto &[name, captures] : expected) {
    SCOPED_TRACE(name);
    auto bundle = KernelBundle::open((bundles() / name).string());
    // dflash also holds the embedded default's drafter (other heads, one mask).
    ASSERT_EQ(bundle->attentionSpecs().size(), name == "dflash" ? 2u : 1u);
    for (const AttentionKernelSpec &spec : bundle->attentionSpecs()) {
      SCOPED_TRACE(spec.name);
      EXPECT_EQ(spec.captureNames(), captures);
      EXPECT_EQ(spec.scoreMod.has_value(), name == "relative_bias" || name == "softcap");
      EXPECT_EQ(spec.binaries.count("sm_90a"), 1u);
      EXPECT_EQ(spec.binaries.count("sm_120"), 1u);
    }
  }
}

TEST(ExampleBundles, HopperKernelsAndTheirTilesPerHeadDim) {
  using Choice = AttentionKernelChoice;
  {
    SCOPED_TRACE("head_dim 128: both passes");
    auto bundle = KernelBundle::open((bundles() / "dflash").string());
    const AttentionKernelSpec &spec = bundle->attention("drafter_attention");
    const AttentionLaunches &sm90a = spec.launches.at("sm_90a");
    ASSERT_TRUE(sm90a.forwardSm90 && sm90a.backwardSm90);
    const AttentionKernelPlan hopper = planAttentionKernels(*bundle, spec, 90, Choice::Auto);
    EXPECT_EQ(hopper.arch, "sm_90a");
    EXPECT_FALSE(hopper.compiled);
    EXPECT_TRUE(hopper.forward.sm90 && hopper.backward.sm90);
    // kernels/attention/sm90/config.cuh: 3 warpgroups, forward 128 x 128,
    // backward 64 x 128.
    EXPECT_EQ(hopper.forward.launch.threads, 384);
    EXPECT_EQ(hopper.forward.launch.blockM, 128);
    EXPECT_EQ(hopper.forward.launch.blockN, 128);
    EXPECT_EQ(hopper.backward.launch.threads, 384);
    EXPECT_EQ(hopper.backward.launch.blockM, 64);
    EXPECT_EQ(hopper.backward.launch.blockN, 128);
    EXPECT_EQ(hopper.backward.launch.rowKernelThreads, 256);
    EXPECT_EQ(hopper.backward.launch.rowKernelRows, 8);
    EXPECT_LE(hopper.backward.launch.sharedBytes, 232448);
    // The portable kernels on request: sm_90's default configs (4 warps of
    // 32 query rows); on sm_120, sm_120's (16 rows per warp), each within
    // 101,376 B of shared memory.
    const AttentionKernelPlan portable = planAttentionKernels(*bundle, spec, 90, Choice::Portable);
    EXPECT_EQ(portable.forward.launch.blockM, 128);
    EXPECT_EQ(portable.forward.launch.blockN, 64);
    EXPECT_EQ(portable.forward.launch.sharedBytes, 65536);
    const AttentionKernelPlan sm120 = planAttentionKernels(*bundle, spec, 120, Choice::Auto);
    EXPECT_EQ(sm120.arch, "sm_120");
    EXPECT_EQ(sm120.forward.launch.blockM, 64);
    EXPECT_EQ(sm120.forward.launch.blockN, 64);
    EXPECT_EQ(sm120.forward.launch.sharedBytes, 49152);
    for (const AttentionKernelPlan &plan : {portable, sm120}) {
      EXPECT_FALSE(plan.forward.sm90 || plan.backward.sm90);
      EXPECT_EQ(plan.backward.launch.blockM, 64);
      EXPECT_EQ(plan.backward.launch.blockN, 64);
      EXPECT_EQ(plan.backward.launch.sharedBytes, 82432);
    }
  }
  {
    SCOPED_TRACE("head_dim 64: both Hopper passes, 64 x 128 backward tiles");
    auto bundle = KernelBundle::open((bundles() / "prefix_lm").string());
    AttentionKernelSpec spec = bundle->attentionSpecs().front();
    ASSERT_TRUE(spec.launches.at("sm_90a").forwardSm90 && spec.launches.at("sm_90a").backwardSm90);
    const AttentionKernelPlan plan = planAttentionKernels(*bundle, spec, 90, Choice::Auto);
    EXPECT_TRUE(plan.forward.sm90 && plan.backward.sm90);
    EXPECT_EQ(plan.backward.launch, *spec.launches.at("sm_90a").backwardSm90);
    EXPECT_EQ(plan.backward.launch.blockM, 64);
    EXPECT_EQ(plan.backward.launch.blockN, 128);

    SCOPED_TRACE("a bundle with a Hopper forward only (compiled before the head_dim 64 backward)");
    spec.kernels.erase(std::remove_if(spec.kernels.begin(), spec.kernels.end(),
                                      [](const BundleKernel &kernel) {
                                        return kernel.role == bundle::KernelRole::AttentionBackwardPreprocessSm90 ||
                                               kernel.role == bundle::KernelRole::AttentionBackwardSm90 ||
                                               kernel.role == bundle::KernelRole::AttentionBackwardGradQSm90;
                                      }),
                       spec.kernels.end());
    spec.launches.at("sm_90a").backwardSm90.reset();
    const AttentionKernelPlan older = planAttentionKernels(*bundle, spec, 90, Choice::Sm90);
    EXPECT_TRUE(older.forward.sm90);
    EXPECT_FALSE(older.backward.sm90);
    EXPECT_EQ(older.backward.launch, spec.launches.at("sm_90a").backward);
  }
  {
    SCOPED_TRACE("head_dim 256: a Hopper forward of 128 x 64 tiles, the portable backward");
    auto bundle = KernelBundle::open((bundles() / "softcap").string());
    AttentionKernelSpec spec = bundle->attentionSpecs().front();
    const AttentionLaunches &sm90a = spec.launches.at("sm_90a");
    ASSERT_TRUE(sm90a.forwardSm90);
    EXPECT_FALSE(sm90a.backwardSm90);
    EXPECT_FALSE(spec.launches.at("sm_120").forwardSm90 || spec.launches.at("sm_120").backwardSm90);
    const AttentionKernelPlan plan = planAttentionKernels(*bundle, spec, 90, Choice::Sm90);
    EXPECT_TRUE(plan.forward.sm90);
    EXPECT_FALSE(plan.backward.sm90);
    EXPECT_EQ(plan.forward.launch.threads, 384);
    EXPECT_EQ(plan.forward.launch.blockM, 128);
    EXPECT_EQ(plan.forward.launch.blockN, 64);
    EXPECT_LE(plan.forward.launch.sharedBytes, 232448);
    EXPECT_EQ(plan.backward.launch, sm90a.backward);
    EXPECT_FALSE(planAttentionKernels(*bundle, spec, 120, Choice::Auto).forward.sm90);

    SCOPED_TRACE("a head_dim 256 bundle compiled before its Hopper forward existed");
    spec.kernels.erase(std::remove_if(spec.kernels.begin(), spec.kernels.end(),
                                      [](const BundleKernel &kernel) {
                                        return kernel.role == bundle::KernelRole::AttentionForwardSm90;
                                      }),
                       spec.kernels.end());
    spec.launches.at("sm_90a").forwardSm90.reset();
    EXPECT_FALSE(planAttentionKernels(*bundle, spec, 90, Choice::Auto).forward.sm90);
    test::expectError<FormatError>([&] { planAttentionKernels(*bundle, spec, 90, Choice::Sm90); },
                                   {"sm_90a binary was compiled before head_dim 256 had them",
                                    "compile the bundle again"});
  }
}

TEST(ExampleBundles, EachArchRunsTheConfigsOfItsOwnBinary) {
  using Choice = AttentionKernelChoice;
  // head_dim 64 (with a prefix length per batch), 128 and 256.
  const std::vector<std::pair<std::string, std::vector<torch::Tensor>>> cases = {
      {"prefix_lm", {torch::tensor({100}, torch::kInt)}}, {"causal", {}}, {"softcap", {}}};
  for (const auto &[name, captures] : cases) {
    auto bundle = KernelBundle::open((bundles() / name).string());
    const AttentionKernelSpec &spec = bundle->attentionSpecs().front();
    // dflex_compile_bundles.py checks each binary's constants against the
    // configs of its compute capability; sm_120's forward has other tiles.
    const AttentionLaunches &sm90a = spec.launches.at("sm_90a"), &sm120 = spec.launches.at("sm_120");
    EXPECT_NE(sm90a.forward, sm120.forward) << name;
    for (const auto &[computeCapability, choice, arch] :
         {std::tuple<int, Choice, std::string>{90, Choice::Portable, "sm_90a"},
          {120, Choice::Auto, "sm_120"}}) {
      SCOPED_TRACE(name + " on " + arch);
      const AttentionLaunches &own = spec.launches.at(arch);
      const AttentionKernelPlan plan = planAttentionKernels(*bundle, spec, computeCapability, choice);
      ASSERT_EQ(plan.arch, arch);
      ASSERT_FALSE(plan.forward.sm90 || plan.backward.sm90);
      EXPECT_EQ(plan.forward.launch, own.forward);
      EXPECT_EQ(plan.backward.launch, own.backward);
      EXPECT_LE(plan.forward.launch.sharedBytes, 101376);
      EXPECT_LE(plan.backward.launch.sharedBytes, 101376);
      // The tile lists are built at that binary's tiles.
      const dflex::analysis::AttentionTileLists lists =
          attentionTileLists(spec, plan, captures, 1, 300, 300);
      ASSERT_TRUE(lists.ok()) << lists.error;
      EXPECT_EQ(lists.forward.queryTile, own.forward.blockM);
      EXPECT_EQ(lists.forward.keyTile, own.forward.blockN);
      EXPECT_EQ(lists.backward.queryTile, own.backward.blockM);
      EXPECT_EQ(lists.backward.keyTile, own.backward.blockN);
    }
  }
}

/// Removes `arch`'s binary from a copy of the spec, compiles its source for
/// `arch` at run time through a fresh cache, and expects the bundle's cubin,
/// lowered names and launch constants.
void expectRunTimeCompileReproduces(const std::string &directory, const std::string &arch) {
  SCOPED_TRACE(arch);
  auto bundle = KernelBundle::open(directory);
  const AttentionKernelSpec &spec = bundle->attention("drafter_attention");
  test::TempDir cache;
  ASSERT_EQ(setenv("DFLEX_CACHE_DIR", cache.path().c_str(), 1), 0);
  const KernelImage shipped = bundle->kernelImage(spec, arch);
  EXPECT_FALSE(shipped.compiled);
  EXPECT_EQ(shipped.arch, arch);

  AttentionKernelSpec withoutBinary = spec;
  withoutBinary.binaries.erase(arch);
  const KernelImage compiled = bundle->kernelImage(withoutBinary, arch);
  unsetenv("DFLEX_CACHE_DIR");
  EXPECT_TRUE(compiled.compiled);
  EXPECT_EQ(compiled.arch, arch);
  EXPECT_EQ(compiled.loweredNames, shipped.loweredNames);
  // Part by part, the same cubins.
  auto cubinOfRole = [](const KernelImage &image) {
    std::map<bundle::KernelRole, std::string> cubins;
    for (const KernelImage::Part &part : image.parts)
      for (bundle::KernelRole role : part.roles)
        cubins[role] = part.image;
    return cubins;
  };
  EXPECT_EQ(compiled.parts.size(), shipped.parts.size());
  EXPECT_EQ(cubinOfRole(compiled).size(), shipped.loweredNames.size());
  EXPECT_TRUE(cubinOfRole(compiled) == cubinOfRole(shipped))
      << "the run-time compile differs from the bundle's cubins";
  EXPECT_FALSE(std::filesystem::is_empty(cache.path())) << "nothing went through the cache";

  // Without the manifest's constants for the arch, those of the compile's
  // PTX: the same, and the plan runs with them.
  withoutBinary.launches.erase(arch);
  EXPECT_EQ(bundle->attentionLaunches(withoutBinary, arch), spec.launches.at(arch));
  const int computeCapability = arch == "sm_120" ? 120 : 90;
  const AttentionKernelPlan plan = planAttentionKernels(*bundle, withoutBinary, computeCapability,
                                                        AttentionKernelChoice::Auto);
  EXPECT_TRUE(plan.compiled);
  EXPECT_EQ(plan.arch, arch);
  EXPECT_EQ(plan.forward.launch, planAttentionKernels(*bundle, spec, computeCapability,
                                                      AttentionKernelChoice::Auto)
                                     .forward.launch);
}

TEST(ExampleBundles, RunTimeCompileReproducesTheBundlesBinary) {
  // sm_120 asks NVRTC for the portable kernels only, sm_90a for the Hopper
  // ones too: the same requests as dflex-compile's.
  expectRunTimeCompileReproduces((bundles() / "dflash").string(), "sm_120");
  expectRunTimeCompileReproduces((bundles() / "dflash").string(), "sm_90a");
  auto bundle = KernelBundle::open((bundles() / "dflash").string());
  const AttentionKernelSpec &spec = bundle->attention("drafter_attention");
  const KernelImage hopper = bundle->kernelImage(spec, "sm_90a");
  EXPECT_EQ(hopper.loweredNames.size(), 9u);
  EXPECT_EQ(hopper.loweredNames.count(bundle::KernelRole::AttentionBackwardGradQSm90), 1u);
  EXPECT_EQ(bundle->kernelImage(spec, "sm_120").loweredNames.count(bundle::KernelRole::AttentionForwardSm90), 0u);
}

TEST(ExampleBundles, RunTimeCompileRefusesOtherLaunchConstantsThanTheManifests) {
  auto bundle = KernelBundle::open((bundles() / "causal").string());
  AttentionKernelSpec spec = bundle->attention("causal_attention");
  spec.binaries.erase("sm_120");
  // A manifest whose sm_120 constants are another arch's.
  spec.launches.at("sm_120") = spec.launches.at("sm_90a");
  spec.launches.at("sm_120").forwardSm90.reset();
  spec.launches.at("sm_120").backwardSm90.reset();
  test::TempDir cache;
  ASSERT_EQ(setenv("DFLEX_CACHE_DIR", cache.path().c_str(), 1), 0);
  test::expectError<FormatError>([&] { bundle->kernelImage(spec, "sm_120"); },
                                 {"causal_attention.cu (compiled for sm_120)",
                                  "launch constants differ", "binaries: sm_120: launch"});
  unsetenv("DFLEX_CACHE_DIR");
}

TEST(ExampleBundles, CompileFailureIsExplained) {
  auto bundle = KernelBundle::open((bundles() / "causal").string());
  AttentionKernelSpec spec = bundle->attention("causal_attention");
  spec.binaries.clear();
  test::expectError<FormatError>([&] { bundle->kernelImage(spec, "sm_1"); },
                                 {"has no binary for sm_1", "causal_attention.cu"});
}

} // namespace
