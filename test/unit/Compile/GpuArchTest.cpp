#include "dflex/Compile/GpuArch.h"

#include <gtest/gtest.h>

using namespace dflex::compile;

namespace {

TEST(GpuArch, ParsesNames) {
  auto sm120 = parseGpuArch("sm_120");
  ASSERT_TRUE(sm120.ok());
  EXPECT_EQ(sm120.value().computeCapability, 120);
  EXPECT_TRUE(sm120.value().producesCubin);

  auto sm90a = parseGpuArch("sm_90a");
  ASSERT_TRUE(sm90a.ok());
  EXPECT_EQ(sm90a.value().computeCapability, 90);
  EXPECT_EQ(sm90a.value().name, "sm_90a");

  auto compute = parseGpuArch("compute_90");
  ASSERT_TRUE(compute.ok());
  EXPECT_EQ(compute.value().computeCapability, 90);
  EXPECT_FALSE(compute.value().producesCubin);

  EXPECT_TRUE(parseGpuArch("sm_120f").ok());
}

TEST(GpuArch, RejectsMalformedNames) {
  for (const char *bad :
       {"sm90", "sm_", "sm_9x", "gfx90a", "", "sm_0", "sm_1200", "sm_90b",
        "compute_"}) {
    auto parsed = parseGpuArch(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.error(),
              "invalid GPU architecture '" + std::string(bad) +
                  "': expected sm_XX or compute_XX (e.g. sm_90, sm_120, "
                  "sm_90a)");
  }
}

TEST(GpuArch, SharedMemoryLimits) {
  EXPECT_EQ(maxSharedBytesPerBlock(120), 101376u);
  EXPECT_EQ(maxSharedBytesPerBlock(121), 101376u);
  EXPECT_EQ(maxSharedBytesPerBlock(90), 232448u);
  EXPECT_EQ(maxSharedBytesPerBlock(80), 166912u);
  EXPECT_EQ(maxSharedBytesPerBlock(89), 101376u);
  EXPECT_EQ(maxSharedBytesPerBlock(86), 101376u);
  EXPECT_EQ(maxSharedBytesPerBlock(88), std::nullopt);
  EXPECT_EQ(kMaxStaticSharedBytes, 49152u);
}

} // namespace
