#include "TestKernels.h"
#include "TestUtil.h"

#include "dflex/Compile/Nvrtc.h"

#include <gtest/gtest.h>

#include <cstdlib>

using namespace dflex;
using namespace dflex::compile;
using dflex::test::kMmaKernelSource;

namespace {

bool contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

CompileRequest mmaRequest(std::vector<std::string> archs) {
  CompileRequest request;
  request.source = kMmaKernelSource;
  request.programName = "mma_tile.cu";
  request.archs = std::move(archs);
  request.options = {"-std=c++17"};
  request.nameExpressions = {"mma_tile<64>"};
  return request;
}

TEST(Nvrtc, CompilesBf16MmaForSm90AndSm120) {
  Result<std::vector<ArchBinary>> result =
      compileAllArchs(mmaRequest({"sm_90", "sm_120"}));
  ASSERT_TRUE(result.ok()) << result.error();
  ASSERT_EQ(result.value().size(), 2u);
  for (const ArchBinary &binary : result.value()) {
    SCOPED_TRACE(binary.arch);
    EXPECT_EQ(binary.cubin.substr(0, 4), "\x7f" "ELF");
    EXPECT_GT(binary.cubin.size(), 1000u);
    EXPECT_TRUE(contains(binary.ptx, ".target " + binary.arch));
    EXPECT_TRUE(contains(binary.ptx, "mma.sync.aligned.m16n8k16"));
    EXPECT_GT(binary.compileMilliseconds, 0);

    std::string lowered = binary.loweredName("mma_tile<64>");
    EXPECT_EQ(lowered,
              "_Z8mma_tileILi64EEvPK13__nv_bfloat16S2_Pf");
    EXPECT_TRUE(contains(binary.ptx, ".entry " + lowered));

    ASSERT_EQ(binary.kernels.size(), 2u);
    const KernelResources *mma = binary.findKernel(lowered);
    ASSERT_NE(mma, nullptr);
    EXPECT_GT(mma->registers, 0u);
    EXPECT_EQ(mma->barriers, 1u);
    EXPECT_EQ(mma->staticSharedBytes, 64u * 4);
    EXPECT_EQ(mma->spillStoreBytes, 0u);
    const KernelResources *scale = binary.findKernel("scale");
    ASSERT_NE(scale, nullptr);
    EXPECT_GT(scale->registers, 0u);
    EXPECT_EQ(scale->staticSharedBytes, 0u);
    EXPECT_TRUE(binary.notes.empty());
  }
}

TEST(Nvrtc, ComputeArchGivesPtxOnly) {
  Result<ArchBinary> binary =
      compileForArch(mmaRequest({}), "compute_90");
  ASSERT_TRUE(binary.ok()) << binary.error();
  EXPECT_TRUE(binary.value().cubin.empty());
  EXPECT_TRUE(contains(binary.value().ptx, ".target sm_90"));
  EXPECT_TRUE(binary.value().kernels.empty());
  EXPECT_EQ(binary.value().loweredName("mma_tile<64>"),
            "_Z8mma_tileILi64EEvPK13__nv_bfloat16S2_Pf");
}

TEST(Nvrtc, ArchSpecificTarget) {
  Result<ArchBinary> binary = compileForArch(mmaRequest({}), "sm_90a");
  ASSERT_TRUE(binary.ok()) << binary.error();
  EXPECT_TRUE(contains(binary.value().ptx, ".target sm_90a"));
  EXPECT_FALSE(binary.value().cubin.empty());
}

constexpr const char *kSharedSource = R"(
extern "C" __global__ void staged(float *x) {
  __shared__ float buffer[STAGED_FLOATS];
  extern __shared__ float dynamic[];
  buffer[threadIdx.x] = x[threadIdx.x];
  dynamic[threadIdx.x] = x[threadIdx.x + 1];
  __syncthreads();
  x[threadIdx.x] = buffer[threadIdx.x + 1] + dynamic[threadIdx.x + 2];
}
)";

CompileRequest sharedRequest(int stagedFloats) {
  CompileRequest request;
  request.source = kSharedSource;
  request.programName = "staged.cu";
  request.options = {"-DSTAGED_FLOATS=" + std::to_string(stagedFloats)};
  return request;
}

TEST(Nvrtc, RefusesTooMuchStaticSharedMemory) {
  Result<ArchBinary> binary = compileForArch(sharedRequest(16384), "sm_120");
  ASSERT_FALSE(binary.ok());
  EXPECT_TRUE(contains(
      binary.error(),
      "NVRTC failed to compile 'staged.cu' for sm_120 "
      "(NVRTC_ERROR_COMPILATION): kernel 'staged' uses 65536 bytes of static "
      "shared memory; static shared memory is limited to 49152 bytes per "
      "block (use dynamic shared memory beyond that)\n"))
      << binary.error();
  EXPECT_TRUE(contains(binary.error(), "ptxas info")) << binary.error();
}

TEST(Nvrtc, RefusesStaticPlusDynamicAboveTheArchLimit) {
  CompileRequest request = sharedRequest(10000); // 40,000 bytes static
  request.dynamicSharedBytes["staged"] = 64 * 1024;
  Result<ArchBinary> sm120 = compileForArch(request, "sm_120");
  ASSERT_FALSE(sm120.ok());
  EXPECT_EQ(sm120.error(),
            "kernel 'staged' needs 40000 bytes of static + 65536 bytes of "
            "dynamic shared memory = 105536 bytes on sm_120, above the limit "
            "of 101376 bytes per block");
  // sm_90 allows 232,448 bytes per block.
  Result<ArchBinary> sm90 = compileForArch(request, "sm_90");
  ASSERT_TRUE(sm90.ok()) << sm90.error();
  EXPECT_EQ(sm90.value().findKernel("staged")->staticSharedBytes, 40000u);
  // The same limit applies to PTX-only targets for the dynamic part.
  request.dynamicSharedBytes["staged"] = 101377;
  Result<ArchBinary> ptxOnly = compileForArch(request, "compute_120");
  ASSERT_FALSE(ptxOnly.ok());
  EXPECT_TRUE(contains(ptxOnly.error(), "above the limit of 101376 bytes"));
}

TEST(Nvrtc, SharedMemoryRequestsNameRealKernels) {
  CompileRequest request = mmaRequest({});
  request.dynamicSharedBytes["mma_tile<64>"] = 1024;
  request.dynamicSharedBytes["scale"] = 0;
  EXPECT_TRUE(compileForArch(request, "sm_120").ok());

  request.dynamicSharedBytes["mma_tile<64>"] = 101376;
  Result<ArchBinary> tooMuch = compileForArch(request, "sm_120");
  ASSERT_FALSE(tooMuch.ok());
  EXPECT_EQ(tooMuch.error(),
            "kernel 'mma_tile<64>' (_Z8mma_tileILi64EEvPK13__nv_bfloat16S2_Pf) "
            "needs 256 bytes of static + 101376 bytes of dynamic shared "
            "memory = 101632 bytes on sm_120, above the limit of 101376 bytes "
            "per block");

  request.dynamicSharedBytes = {{"no_such_kernel", 16}};
  Result<ArchBinary> unknown = compileForArch(request, "sm_120");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error(),
            "dynamic shared memory is given for kernel 'no_such_kernel', which "
            "is not among the kernels compiled for sm_120 "
            "(_Z8mma_tileILi64EEvPK13__nv_bfloat16S2_Pf, scale)");
}

// NVRTC's own program cache (12.9 and later) would answer the second
// compile without running ptxas, so without its resource lines.
TEST(Nvrtc, RepeatedCompilesReportResources) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    Result<ArchBinary> binary = compileForArch(mmaRequest({}), "sm_120");
    ASSERT_TRUE(binary.ok()) << binary.error();
    EXPECT_NE(binary.value().findKernel(binary.value().loweredName("mma_tile<64>")), nullptr)
        << "attempt " << attempt << ", log:\n" << binary.value().log;
  }
}

TEST(Nvrtc, UnknownLimitIsNoted) {
  Result<ArchBinary> binary = compileForArch(sharedRequest(16), "sm_88");
  ASSERT_TRUE(binary.ok()) << binary.error();
  ASSERT_EQ(binary.value().notes.size(), 1u);
  EXPECT_EQ(binary.value().notes[0],
            "no shared-memory limit is known for sm_88; only the 49152-byte "
            "static limit was checked");
}

TEST(Nvrtc, SyntaxErrorReturnsTheLogWithLineDirectives) {
  CompileRequest request;
  request.programName = "generated.cu";
  request.source = "#line 7 \"mask.mlir\"\n"
                   "__device__ bool visible(int q, int kv) { return q >= ; }\n";
  Result<ArchBinary> binary = compileForArch(request, "sm_120");
  ASSERT_FALSE(binary.ok());
  EXPECT_TRUE(contains(binary.error(), "NVRTC failed to compile "
                                       "'generated.cu' for sm_120 "
                                       "(NVRTC_ERROR_COMPILATION)\n"))
      << binary.error();
  EXPECT_TRUE(contains(binary.error(), "mask.mlir(7): error: expected an "
                                       "expression"))
      << binary.error();
}

TEST(Nvrtc, InMemoryHeaders) {
  CompileRequest request;
  request.source = "#include \"mask.cuh\"\n"
                   "extern \"C\" __global__ void k(int *x) { x[0] = "
                   "kBlockSize; }\n";
  request.headers = {{"mask.cuh", "constexpr int kBlockSize = 16;\n"}};
  Result<ArchBinary> binary = compileForArch(request, "sm_90");
  ASSERT_TRUE(binary.ok()) << binary.error();
  EXPECT_NE(binary.value().findKernel("k"), nullptr);
}

TEST(Nvrtc, RequestErrors) {
  CompileRequest request = mmaRequest({});
  EXPECT_EQ(compileAllArchs(request).error(), "no architecture requested");

  Result<ArchBinary> old = compileForArch(request, "sm_50");
  ASSERT_FALSE(old.ok());
  EXPECT_TRUE(contains(old.error(), "sm_50 is not supported by NVRTC "))
      << old.error();
  EXPECT_TRUE(contains(old.error(), "sm_90 ")) << old.error();

  request.options.push_back("--gpu-architecture=sm_80");
  EXPECT_EQ(compileForArch(request, "sm_90").error(),
            "option '--gpu-architecture=sm_80' sets the architecture; list "
            "architectures in the request's archs instead");

  request = mmaRequest({});
  request.options.push_back("--no-such-option");
  Result<ArchBinary> badOption = compileForArch(request, "sm_90");
  ASSERT_FALSE(badOption.ok());
  EXPECT_TRUE(contains(badOption.error(), "NVRTC_ERROR_INVALID_OPTION"))
      << badOption.error();
  EXPECT_TRUE(contains(badOption.error(), "--no-such-option"))
      << badOption.error();

  request = mmaRequest({});
  request.nameExpressions = {"not_a_kernel<1>"};
  Result<ArchBinary> badName = compileForArch(request, "sm_90");
  ASSERT_FALSE(badName.ok());
  EXPECT_TRUE(contains(badName.error(), "not_a_kernel<1>")) << badName.error();
}

TEST(Nvrtc, PtxasLogParsing) {
  const char *log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'spill' for 'sm_90'\n"
      "ptxas info    : Function properties for helper\n"
      "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes "
      "spill loads\n"
      "ptxas info    : Function properties for spill\n"
      "ptxas         .     6224 bytes stack frame, 8040 bytes spill stores, "
      "8908 bytes spill loads\n"
      "ptxas info    : Used 32 registers, used 0 barriers, 6224 bytes "
      "cumulative stack size\n"
      "ptxas info    : Compile time = 359.552 ms\n"
      "ptxas info    : Compiling entry function '_Z4kernILi64EEvPf' for "
      "'sm_90'\n"
      "ptxas info    : Function properties for _Z4kernILi64EEvPf\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes "
      "spill loads\n"
      "ptxas info    : Used 16 registers, used 1 barriers, 256 bytes smem, "
      "360 bytes cmem[0]\n";
  std::vector<KernelResources> kernels = parsePtxasLog(log);
  ASSERT_EQ(kernels.size(), 2u);
  EXPECT_EQ(kernels[0], (KernelResources{"spill", 32, 0, 0, 6224, 8040, 8908}));
  EXPECT_EQ(kernels[1],
            (KernelResources{"_Z4kernILi64EEvPf", 16, 1, 256, 0, 0, 0}));
  EXPECT_TRUE(parsePtxasLog("").empty());
}

TEST(Nvrtc, SpillsAreReported) {
  CompileRequest request;
  request.source = R"(
extern "C" __global__ void heavy(float *x) {
  float a[48];
#pragma unroll
  for (int i = 0; i < 48; ++i) a[i] = x[i * threadIdx.x];
  float s = 0;
#pragma unroll
  for (int i = 0; i < 48; ++i)
    for (int j = 0; j < 48; ++j) s += a[i] * a[j] * x[j];
  x[1] = s;
})";
  request.options = {"--maxrregcount=32"};
  Result<ArchBinary> binary = compileForArch(request, "sm_90");
  ASSERT_TRUE(binary.ok()) << binary.error();
  const KernelResources *heavy = binary.value().findKernel("heavy");
  ASSERT_NE(heavy, nullptr);
  EXPECT_EQ(heavy->registers, 32u);
  EXPECT_GT(heavy->spillStoreBytes, 0u);
  EXPECT_GT(heavy->spillLoadBytes, 0u);
  EXPECT_GE(heavy->stackFrameBytes, heavy->spillStoreBytes / 2);
}

TEST(Nvrtc, SerializationRoundTrip) {
  Result<ArchBinary> compiled = compileForArch(mmaRequest({}), "sm_120");
  ASSERT_TRUE(compiled.ok()) << compiled.error();
  const ArchBinary &binary = compiled.value();
  std::string bytes = serializeArchBinary(binary);
  Result<ArchBinary> back = deserializeArchBinary(bytes);
  ASSERT_TRUE(back.ok()) << back.error();
  EXPECT_EQ(back.value().arch, binary.arch);
  EXPECT_EQ(back.value().ptx, binary.ptx);
  EXPECT_EQ(back.value().cubin, binary.cubin);
  EXPECT_EQ(back.value().log, binary.log);
  EXPECT_EQ(back.value().kernels, binary.kernels);
  ASSERT_EQ(back.value().loweredNames.size(), 1u);
  EXPECT_EQ(back.value().loweredName("mma_tile<64>"),
            binary.loweredName("mma_tile<64>"));
  EXPECT_NEAR(back.value().compileMilliseconds, binary.compileMilliseconds,
              0.001);

  EXPECT_EQ(deserializeArchBinary(bytes.substr(0, bytes.size() - 3)).error(),
            "invalid compiled binary: truncated data: kernel resources needs "
            "8 bytes at offset " +
                std::to_string(bytes.size() - 8) + " but only 5 remain");
  EXPECT_EQ(deserializeArchBinary(bytes + "x").error(),
            "invalid compiled binary: 1 trailing bytes");
  EXPECT_EQ(deserializeArchBinary("XXXXXXXX").error(),
            "invalid compiled binary: bad magic");
}

TEST(Nvrtc, Version) {
  Result<std::string> version = nvrtcVersion();
  ASSERT_TRUE(version.ok());
  int major = std::stoi(version.value());
  EXPECT_GE(major, 12);
  EXPECT_NE(version.value().find('.'), std::string::npos);
  Result<std::vector<std::string>> archs = nvrtcSupportedArchs();
  ASSERT_TRUE(archs.ok());
  EXPECT_NE(std::find(archs.value().begin(), archs.value().end(), "sm_120"),
            archs.value().end());
}

TEST(Nvrtc, CudaIncludeOverride) {
  Result<std::string> found = cudaIncludeDirectory();
  ASSERT_TRUE(found.ok()) << found.error();
  std::string real = found.value();
  dflex::test::TempDir empty;
  std::string report = dflex::test::runInChild([&]() -> std::string {
    ::setenv("DFLEX_CUDA_INCLUDE", empty.str().c_str(), 1);
    Result<ArchBinary> binary = compileForArch(mmaRequest({}), "sm_90");
    std::string expected = "DFLEX_CUDA_INCLUDE='" + empty.str() +
                           "' does not contain cuda_bf16.h; point it at the "
                           "CUDA include directory";
    if (binary.ok() || binary.error() != expected)
      return "bad override accepted or wrong message: " + binary.error();
    ::setenv("DFLEX_CUDA_INCLUDE", real.c_str(), 1);
    if (!compileForArch(mmaRequest({}), "sm_90").ok())
      return "good override refused";
    ::unsetenv("DFLEX_CUDA_INCLUDE");
    ::setenv("CUDA_HOME", empty.str().c_str(), 1);
    ::setenv("CUDA_PATH", empty.str().c_str(), 1);
    // CUDA_HOME without headers falls back to the build-time toolkit.
    Result<std::string> fallback = cudaIncludeDirectory();
    if (!fallback.ok())
      return "no fallback: " + fallback.error();
    return "";
  });
  EXPECT_EQ(report, "");
}

} // namespace
