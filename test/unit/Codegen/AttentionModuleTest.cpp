//===- AttentionModuleTest.cpp - generated modules per compiled arch ------===//
//
// A generated attention module, compiled by NVRTC for sm_90a and sm_120,
// instantiates the DefaultAttentionConfigs of the arch it is compiled for:
// the launch constants read back from the PTX of each part of its binary
// are that arch's (sm_120's within its 101,376 B of shared memory per
// block), and the Hopper kernels and their constants exist in the sm_90a
// binary only.
//
//===----------------------------------------------------------------------===//

#include "../Conversion/DFlexToProgram/TestUtil.h"
#include "dflex/Bundle/CompileRequest.h"
#include "dflex/Codegen/AttentionModule.h"
#include "dflex/Compile/Nvrtc.h"
#include "dflex/Compile/PtxConstants.h"

#include <gtest/gtest.h>

#include <algorithm>

using namespace dflex;

namespace {

/// The values of `array` in `ptx`, or the error of reading them.
Result<std::vector<int64_t>> read(const std::string &ptx, bundle::LaunchArray array) {
  const bundle::LaunchArrayInfo &info = bundle::launchArray(array);
  return compile::readPtxIntArray(ptx, info.symbol, info.names.size());
}

/// examples/causal.mlir's spec at head_dim 128, bf16, with these heads.
bundle::AttentionSpec causalSpec(int64_t qHeads, int64_t kvHeads) {
  bundle::AttentionSpec spec;
  spec.name = "causal_attention";
  spec.numQHeads = qHeads;
  spec.numKvHeads = kvHeads;
  spec.qkHeadDim = spec.vHeadDim = 128;
  spec.elementType = "bf16";
  spec.scale = 0.0883883f;
  return spec;
}

TEST(CodegenAttention, EachArchsBinaryHasTheConfigsOfItsComputeCapability) {
  auto loaded = test::LoadedModule::fromFile(DFLEX_EXAMPLES_DIR "/causal.mlir");
  ASSERT_TRUE(loaded.module);
  const bundle::AttentionSpec spec = causalSpec(32, 8);
  Result<codegen::GeneratedModule> module =
      codegen::generateAttention(spec, loaded.program("causal"), nullptr, "causal.mlir");
  ASSERT_TRUE(module.ok()) << module.error();

  // threads, shared bytes, block_m, block_n (backward: and the row kernels' threads and rows per block)
  // of DefaultAttentionConfigs<bf16, 128, 90 / 120> and Sm90AttentionConfigs.
  struct Expected {
    const char *arch;
    std::map<std::string, std::vector<int64_t>> launch; // symbol -> values; absent: not built
  };
  const Expected expected[] = {
      {"sm_90a",
       {{"dflex_forward_launch", {128, 65536, 128, 64}},
        {"dflex_backward_launch", {256, 82432, 64, 64, 256, 8}},
        {"dflex_forward_sm90_launch", {384, 164936, 128, 128}},
        {"dflex_backward_sm90_launch", {384, 231464, 64, 128, 256, 8}}}},
      {"sm_120",
       {{"dflex_forward_launch", {128, 49152, 64, 64}},
        {"dflex_backward_launch", {256, 82432, 64, 64, 256, 8}}}},
  };
  std::map<std::string, std::string> forwardKernel; // arch -> lowered name
  for (const Expected &target : expected) {
    SCOPED_TRACE(target.arch);
    // The binary's parts, each its own program: the constants of each
    // part's kernels come from its own PTX, and no part of sm_120 has the
    // Hopper arrays.
    bundle::LaunchValues launch;
    for (const std::string &part : bundle::partsOf(module.value().kernels, target.arch)) {
      SCOPED_TRACE(part);
      const compile::CompileRequest request = bundle::compileRequest(
          spec.name, module.value().source, module.value().kernels, target.arch, part);
      Result<compile::ArchBinary> binary = compile::compileForArch(request, target.arch);
      ASSERT_TRUE(binary.ok()) << binary.error();
      const std::vector<bundle::ModuleKernel> kernels =
          bundle::partKernels(module.value().kernels, target.arch, part);
      ASSERT_FALSE(kernels.empty());
      for (const bundle::ModuleKernel &kernel : kernels)
        EXPECT_FALSE(binary.value().loweredName(kernel.nameExpression).empty());
      Result<bundle::LaunchValues> values = bundle::readLaunchValues(binary.value(), kernels);
      ASSERT_TRUE(values.ok()) << values.error();
      ASSERT_TRUE(bundle::mergeLaunchValues(launch, values.value()).ok());
      for (bundle::LaunchArray array : {bundle::LaunchArray::ForwardSm90, bundle::LaunchArray::BackwardSm90})
        if (!target.launch.count(bundle::launchArray(array).symbol))
          EXPECT_FALSE(read(binary.value().ptx, array).ok())
              << "a binary without the kernels has their constants";
      if (part == "forward")
        forwardKernel[target.arch] =
            binary.value().loweredName(module.value().kernels.front().nameExpression);
    }
    const std::vector<bundle::LaunchArray> built =
        bundle::launchArraysOf(module.value().kernels, target.arch);
    for (bundle::LaunchArray array :
         {bundle::LaunchArray::Forward, bundle::LaunchArray::Backward,
          bundle::LaunchArray::ForwardSm90, bundle::LaunchArray::BackwardSm90}) {
      const std::string symbol = bundle::launchArray(array).symbol;
      SCOPED_TRACE(symbol);
      auto wanted = target.launch.find(symbol);
      EXPECT_EQ(std::count(built.begin(), built.end(), array) == 1,
                wanted != target.launch.end());
      auto found = launch.find(symbol);
      if (wanted == target.launch.end()) {
        EXPECT_EQ(found, launch.end());
        continue;
      }
      ASSERT_NE(found, launch.end());
      const std::vector<std::string> &names = bundle::launchArray(array).names;
      std::vector<int64_t> values;
      for (const std::string &name : names)
        values.push_back(found->second.at(name));
      EXPECT_EQ(values, wanted->second);
      if (std::string(target.arch) == "sm_120")
        EXPECT_LE(values[1], 101376) << "beyond sm_120's shared memory per block";
    }
  }
  // One name expression, two instantiations: each arch's own config type.
  EXPECT_FALSE(forwardKernel["sm_90a"].empty());
  EXPECT_NE(forwardKernel["sm_90a"], forwardKernel["sm_120"]);
}

TEST(CodegenAttention, PortableConfigsOnlyOfComputeCapabilitiesThatHaveThem) {
  auto loaded = test::LoadedModule::fromFile(DFLEX_EXAMPLES_DIR "/causal.mlir");
  ASSERT_TRUE(loaded.module);
  const bundle::AttentionSpec spec = causalSpec(4, 4);
  EXPECT_TRUE(codegen::hasOwnPortableConfigs(90));
  EXPECT_TRUE(codegen::hasOwnPortableConfigs(120));
  EXPECT_FALSE(codegen::hasOwnPortableConfigs(80));
  Result<codegen::GeneratedModule> sm120 =
      codegen::generateAttention(spec, loaded.program("causal"), nullptr, "causal.mlir", {120});
  ASSERT_TRUE(sm120.ok()) << sm120.error();
  EXPECT_NE(sm120.value().source.find("DefaultAttentionConfigs<__nv_bfloat16, 128, 120>"), std::string::npos);
  Result<codegen::GeneratedModule> sm80 =
      codegen::generateAttention(spec, loaded.program("causal"), nullptr, "causal.mlir", {80});
  ASSERT_FALSE(sm80.ok());
  EXPECT_NE(sm80.error().find("no portable configs of compute capability 80"), std::string::npos) << sm80.error();
}

TEST(CodegenAttention, PortableConfigsChosenOutright) {
  auto loaded = test::LoadedModule::fromFile(DFLEX_EXAMPLES_DIR "/causal.mlir");
  ASSERT_TRUE(loaded.module);
  const bundle::AttentionSpec spec = causalSpec(4, 4);

  Result<codegen::PortableForwardConfig> forward = codegen::parsePortableForwardConfig("128,64,8,early_key");
  ASSERT_TRUE(forward.ok()) << forward.error();
  EXPECT_EQ(forward.value().blockM, 128);
  EXPECT_EQ(forward.value().blockN, 64);
  EXPECT_EQ(forward.value().warps, 8);
  EXPECT_EQ(forward.value().pipeline, "early_key");
  Result<codegen::PortableBackwardConfig> backward = codegen::parsePortableBackwardConfig("64,64,4,32");
  ASSERT_TRUE(backward.ok()) << backward.error();
  EXPECT_EQ(backward.value().gradQChunk, 32);

  codegen::PortableConfigs portable{120, forward.value(), std::nullopt};
  Result<codegen::GeneratedModule> chosen =
      codegen::generateAttention(spec, loaded.program("causal"), nullptr, "causal.mlir", portable);
  ASSERT_TRUE(chosen.ok()) << chosen.error();
  const std::string &source = chosen.value().source;
  EXPECT_NE(source.find("using Forward = ::dflex::kernels::AttentionForwardConfig<__nv_bfloat16, 128, 128, 64, 8, "
                        "::dflex::kernels::ForwardPipeline::kSharedQueryEarlyKey>;"),
            std::string::npos)
      << source;
  EXPECT_NE(source.find("using Backward = ::dflex::kernels::DefaultAttentionConfigs<__nv_bfloat16, 128, 120>::Backward;"),
            std::string::npos)
      << source;

  // The pipeline defaults to the first name; bad text names what is wrong.
  EXPECT_EQ(codegen::parsePortableForwardConfig("64,64,4").value().pipeline, codegen::forwardPipelineNames().front());
  for (const char *bad : {"", "128,64", "128,64,0", "128,x,8", "128,64,8,fast", "-1,64,8"}) {
    Result<codegen::PortableForwardConfig> parsed = codegen::parsePortableForwardConfig(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.error().find(std::string("'") + bad + "'"), std::string::npos) << parsed.error();
  }
  EXPECT_NE(codegen::parsePortableForwardConfig("128,64,8,fast").error().find("unknown pipeline 'fast'"),
            std::string::npos);
  EXPECT_FALSE(codegen::parsePortableBackwardConfig("64,64,4").ok());
  EXPECT_FALSE(codegen::parsePortableBackwardConfig("64,64,4,32,1").ok());
}

} // namespace
