// The example bundles dflex-compile wrote (the CTest fixture
// dflex-attention-example-bundles, default archs sm_90a and sm_120): they
// open, carry the Hopper kernels where the head dim has them, the runtime
// picks its kernels and tiles from them per device, and compiling a
// bundle's source at run time for an arch it has reproduces its binary
// exactly.
#include "../TestSupport.h"

#include "dflex/runtime/Attention.h"
#include "dflex/runtime/Error.h"
#include "dflex/runtime/KernelBundle.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

using namespace dflex::runtime;

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
    ASSERT_EQ(bundle->attentionSpecs().size(), 1u);
    const AttentionKernelSpec &spec = bundle->attentionSpecs().front();
    EXPECT_EQ(spec.captureNames(), captures);
    EXPECT_EQ(spec.scoreMod.has_value(), name == "relative_bias" || name == "softcap");
    EXPECT_EQ(spec.binaries.count("sm_90a"), 1u);
    EXPECT_EQ(spec.binaries.count("sm_120"), 1u);
  }
}

TEST(ExampleBundles, HopperKernelsAndTheirTilesPerHeadDim) {
  using Choice = AttentionKernelChoice;
  {
    SCOPED_TRACE("head_dim 128: both passes");
    auto bundle = KernelBundle::open((bundles() / "dflash").string());
    const AttentionKernelSpec &spec = bundle->attention("drafter_attention");
    ASSERT_TRUE(spec.forwardSm90 && spec.backwardSm90);
    const AttentionKernelPlan hopper = planAttentionKernels(spec, 90, Choice::Auto);
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
    EXPECT_LE(hopper.backward.launch.sharedBytes, 232448);
    // Portable on request, and on sm_120: the default configs' tiles.
    for (const AttentionKernelPlan &portable :
         {planAttentionKernels(spec, 90, Choice::Portable),
          planAttentionKernels(spec, 120, Choice::Auto)}) {
      EXPECT_FALSE(portable.forward.sm90 || portable.backward.sm90);
      EXPECT_EQ(portable.forward.launch.blockM, 128);
      EXPECT_EQ(portable.forward.launch.blockN, 64);
      EXPECT_EQ(portable.backward.launch.blockM, 64);
      EXPECT_EQ(portable.backward.launch.blockN, 64);
    }
    EXPECT_EQ(planAttentionKernels(spec, 120, Choice::Auto).arch, "sm_120");
  }
  {
    SCOPED_TRACE("head_dim 64: a Hopper forward, the portable backward");
    auto bundle = KernelBundle::open((bundles() / "prefix_lm").string());
    const AttentionKernelSpec &spec = bundle->attentionSpecs().front();
    EXPECT_TRUE(spec.forwardSm90.has_value());
    EXPECT_FALSE(spec.backwardSm90.has_value());
    const AttentionKernelPlan plan = planAttentionKernels(spec, 90, Choice::Sm90);
    EXPECT_TRUE(plan.forward.sm90);
    EXPECT_FALSE(plan.backward.sm90);
    EXPECT_EQ(plan.backward.launch.blockN, spec.backward.blockN);
  }
  {
    SCOPED_TRACE("head_dim 256: portable only");
    auto bundle = KernelBundle::open((bundles() / "softcap").string());
    const AttentionKernelSpec &spec = bundle->attentionSpecs().front();
    EXPECT_FALSE(spec.forwardSm90 || spec.backwardSm90);
    EXPECT_FALSE(planAttentionKernels(spec, 90, Choice::Auto).forward.sm90);
    test::expectError<FormatError>([&] { planAttentionKernels(spec, 90, Choice::Sm90); },
                                   {"head_dim 256 has none"});
  }
}

/// Removes `arch`'s binary from a copy of the spec, compiles its source for
/// `arch` at run time through a fresh cache, and expects the bundle's cubin
/// and lowered names.
void expectRunTimeCompileReproduces(const KernelBundle &bundle, const AttentionKernelSpec &spec,
                                    const std::string &arch) {
  SCOPED_TRACE(arch);
  test::TempDir cache;
  ASSERT_EQ(setenv("DFLEX_CACHE_DIR", cache.path().c_str(), 1), 0);
  const KernelImage shipped = bundle.kernelImage(spec, arch);
  EXPECT_FALSE(shipped.compiled);

  AttentionKernelSpec withoutBinary = spec;
  withoutBinary.binaries.erase(arch);
  const KernelImage compiled = bundle.kernelImage(withoutBinary, arch);
  unsetenv("DFLEX_CACHE_DIR");
  EXPECT_TRUE(compiled.compiled);
  EXPECT_EQ(compiled.loweredNames, shipped.loweredNames);
  EXPECT_TRUE(compiled.image == shipped.image) << "the run-time compile differs from the bundle's cubin";
  EXPECT_FALSE(std::filesystem::is_empty(cache.path())) << "nothing went through the cache";
}

TEST(ExampleBundles, RunTimeCompileReproducesTheBundlesBinary) {
  auto bundle = KernelBundle::open((bundles() / "dflash").string());
  const AttentionKernelSpec &spec = bundle->attention("drafter_attention");
  // sm_120 asks NVRTC for the portable kernels only, sm_90a for the Hopper
  // ones too: the same requests as dflex-compile's.
  expectRunTimeCompileReproduces(*bundle, spec, "sm_120");
  expectRunTimeCompileReproduces(*bundle, spec, "sm_90a");
  const KernelImage hopper = bundle->kernelImage(spec, "sm_90a");
  EXPECT_EQ(hopper.loweredNames.size(), 9u);
  EXPECT_EQ(hopper.loweredNames.count("attention_backward_grad_q_sm90"), 1u);
  EXPECT_EQ(bundle->kernelImage(spec, "sm_120").loweredNames.count("attention_forward_sm90"), 0u);
}

TEST(ExampleBundles, CompileFailureIsExplained) {
  auto bundle = KernelBundle::open((bundles() / "causal").string());
  AttentionKernelSpec spec = bundle->attention("causal_attention");
  spec.binaries.clear();
  test::expectError<FormatError>([&] { bundle->kernelImage(spec, "sm_1"); },
                                 {"has no binary for sm_1", "causal_attention.cu"});
}

} // namespace
