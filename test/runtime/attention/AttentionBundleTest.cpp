// The example bundles dflex-compile wrote (the CTest fixture
// dflex-attention-example-bundles): they open, and compiling a bundle's
// source at run time for an arch it has reproduces its binary exactly.
#include "../TestSupport.h"

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
    EXPECT_EQ(spec.binaries.count("sm_90"), 1u);
  }
}

TEST(ExampleBundles, RunTimeCompileReproducesTheBundlesBinary) {
  test::TempDir cache;
  ASSERT_EQ(setenv("DFLEX_CACHE_DIR", cache.path().c_str(), 1), 0);
  auto bundle = KernelBundle::open((bundles() / "dflash").string());
  const AttentionKernelSpec &spec = bundle->attention("drafter_attention");
  const KernelImage shipped = bundle->kernelImage(spec, "sm_90");
  EXPECT_FALSE(shipped.compiled);

  AttentionKernelSpec withoutBinary = spec;
  withoutBinary.binaries.erase("sm_90");
  const KernelImage compiled = bundle->kernelImage(withoutBinary, "sm_90");
  unsetenv("DFLEX_CACHE_DIR");
  EXPECT_TRUE(compiled.compiled);
  EXPECT_EQ(compiled.loweredNames, shipped.loweredNames);
  EXPECT_TRUE(compiled.image == shipped.image) << "the run-time compile differs from the bundle's cubin";
  EXPECT_FALSE(std::filesystem::is_empty(cache.path())) << "nothing went through the cache";
}

TEST(ExampleBundles, CompileFailureIsExplained) {
  auto bundle = KernelBundle::open((bundles() / "causal").string());
  AttentionKernelSpec spec = bundle->attention("causal_attention");
  spec.binaries.clear();
  test::expectError<FormatError>([&] { bundle->kernelImage(spec, "sm_1"); },
                                 {"has no binary for sm_1", "causal_attention.cu"});
}

} // namespace
