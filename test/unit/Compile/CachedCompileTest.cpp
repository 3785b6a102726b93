#include "TestKernels.h"
#include "TestUtil.h"

#include "dflex/Compile/CachedCompile.h"
#include "dflex/Support/File.h"

#include <gtest/gtest.h>

using namespace dflex;
using namespace dflex::compile;
using dflex::test::TempDir;

namespace {

constexpr std::string_view kTemplateVersion = "test-templates-1";

CompileRequest request(std::vector<std::string> archs) {
  CompileRequest request;
  request.source = dflex::test::kMmaKernelSource;
  request.archs = std::move(archs);
  request.nameExpressions = {"mma_tile<64>"};
  return request;
}

TEST(CachedCompile, MissThenHit) {
  TempDir dir;
  cache::KernelCache cache(cache::CacheConfig{dir.str(), {}});
  auto first = compileCached(request({"sm_90", "sm_120"}), cache,
                             kTemplateVersion);
  ASSERT_TRUE(first.ok()) << first.error();
  for (const ArchBinary &binary : first.value())
    EXPECT_FALSE(binary.fromCache) << binary.arch;

  auto second = compileCached(request({"sm_90", "sm_120"}), cache,
                              kTemplateVersion);
  ASSERT_TRUE(second.ok()) << second.error();
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(second.value()[i].fromCache);
    EXPECT_EQ(second.value()[i].cubin, first.value()[i].cubin);
    EXPECT_EQ(second.value()[i].ptx, first.value()[i].ptx);
    EXPECT_EQ(second.value()[i].kernels, first.value()[i].kernels);
  }
  EXPECT_EQ(cache.list().size(), 2u);

  // A new arch compiles only that arch.
  auto third = compileCached(request({"sm_120", "sm_80"}), cache,
                             kTemplateVersion);
  ASSERT_TRUE(third.ok()) << third.error();
  EXPECT_TRUE(third.value()[0].fromCache);
  EXPECT_FALSE(third.value()[1].fromCache);
  EXPECT_TRUE(cache.warnings().empty());
}

TEST(CachedCompile, KeyCoversEveryInput) {
  CompileRequest base = request({});
  std::string key = archCacheKey(base, "sm_90", kTemplateVersion).value();
  EXPECT_EQ(key, archCacheKey(base, "sm_90", kTemplateVersion).value());
  EXPECT_NE(key, archCacheKey(base, "sm_120", kTemplateVersion).value());
  EXPECT_NE(key, archCacheKey(base, "sm_90", "test-templates-2").value());

  auto changed = [&](auto mutate) {
    CompileRequest copy = base;
    mutate(copy);
    return archCacheKey(copy, "sm_90", kTemplateVersion).value() != key;
  };
  EXPECT_TRUE(changed([](CompileRequest &r) { r.source += " "; }));
  EXPECT_TRUE(changed([](CompileRequest &r) { r.options = {"-lineinfo"}; }));
  EXPECT_TRUE(changed([](CompileRequest &r) { r.programName = "x.cu"; }));
  EXPECT_TRUE(
      changed([](CompileRequest &r) { r.headers = {{"a.cuh", "int a;"}}; }));
  EXPECT_TRUE(
      changed([](CompileRequest &r) { r.nameExpressions.push_back("x"); }));
  // Dynamic shared memory does not change the binary.
  EXPECT_FALSE(changed(
      [](CompileRequest &r) { r.dynamicSharedBytes["scale"] = 1024; }));

  // Header order does not matter; header contents do.
  CompileRequest two = base, swapped = base, edited = base;
  two.headers = {{"a.cuh", "1"}, {"b.cuh", "2"}};
  swapped.headers = {{"b.cuh", "2"}, {"a.cuh", "1"}};
  edited.headers = {{"a.cuh", "1"}, {"b.cuh", "3"}};
  EXPECT_EQ(archCacheKey(two, "sm_90", kTemplateVersion).value(),
            archCacheKey(swapped, "sm_90", kTemplateVersion).value());
  EXPECT_NE(archCacheKey(two, "sm_90", kTemplateVersion).value(),
            archCacheKey(edited, "sm_90", kTemplateVersion).value());
}

TEST(CachedCompile, SharedMemoryIsCheckedOnHits) {
  TempDir dir;
  cache::KernelCache cache(cache::CacheConfig{dir.str(), {}});
  CompileRequest fits = request({"sm_120"});
  ASSERT_TRUE(compileCached(fits, cache, kTemplateVersion).ok());
  CompileRequest tooBig = fits;
  tooBig.dynamicSharedBytes["mma_tile<64>"] = 101376;
  auto refused = compileCached(tooBig, cache, kTemplateVersion);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().find("above the limit of 101376 bytes"),
            std::string::npos)
      << refused.error();
}

TEST(CachedCompile, FailuresAreNotCached) {
  TempDir dir;
  cache::KernelCache cache(cache::CacheConfig{dir.str(), {}});
  CompileRequest broken = request({"sm_90"});
  broken.source += "\nthis does not compile;\n";
  for (int i = 0; i < 2; ++i) {
    auto result = compileCached(broken, cache, kTemplateVersion);
    ASSERT_FALSE(result.ok());
    EXPECT_NE(result.error().find("NVRTC failed"), std::string::npos);
  }
  EXPECT_TRUE(cache.list().empty());
}

TEST(CachedCompile, WorksWithoutACacheDirectory) {
  TempDir dir;
  std::string file = dir.str() + "/file";
  ASSERT_TRUE(writeFileAtomic(file, "not a directory").ok());
  cache::KernelCache cache(cache::CacheConfig{file + "/cache", {}});
  auto result = compileCached(request({"sm_120"}), cache, kTemplateVersion);
  ASSERT_TRUE(result.ok()) << result.error();
  EXPECT_FALSE(result.value()[0].fromCache);
  EXPECT_FALSE(result.value()[0].cubin.empty());
  EXPECT_EQ(cache.warnings().size(), 1u);
}

} // namespace
