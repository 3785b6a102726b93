// Launch constants read back from PTX: the forms NVRTC writes initialised
// int arrays in, and a real compile for two archs whose arrays differ.
#include "dflex/Compile/Nvrtc.h"
#include "dflex/Compile/PtxConstants.h"

#include <gtest/gtest.h>

using namespace dflex;
using namespace dflex::compile;

namespace {

TEST(PtxConstants, ReadsByteAndWordArrays) {
  // Little-endian bytes, trailing zeros left out of the initializer.
  const std::string bytes =
      ".visible .global .align 4 .b8 dflex_forward_launch[16] = {128, 0, 0, 0, 0, 0, 1, 0, 128};\n";
  Result<std::vector<int64_t>> values = readPtxIntArray(bytes, "dflex_forward_launch", 4);
  ASSERT_TRUE(values.ok()) << values.error();
  EXPECT_EQ(values.value(), (std::vector<int64_t>{128, 65536, 128, 0}));

  const std::string words = ".visible .const .align 4 .u32 dflex_backward_launch[5] = {256, 82432, 64};\n";
  values = readPtxIntArray(words, "dflex_backward_launch", 5);
  ASSERT_TRUE(values.ok()) << values.error();
  EXPECT_EQ(values.value(), (std::vector<int64_t>{256, 82432, 64, 0, 0}));
}

TEST(PtxConstants, FindsTheInitialisedArrayInAMegabyteOfPtx) {
  // Real kernel PTX runs to about a megabyte; a declaration without an
  // initializer and other arrays come first.
  std::string ptx(1 << 20, ' ');
  for (size_t i = 0; i + 1 < ptx.size(); i += 64)
    ptx[i] = '\n';
  ptx += ".extern .global .align 4 .b8 dflex_forward_launch[16];\n"
         ".visible .global .align 4 .u32 other_launch[2] = {7, 8};\n"
         ".visible .global .align 4 .u32 dflex_forward_launch[4] = {64, 1, 2, 3};\n";
  Result<std::vector<int64_t>> values = readPtxIntArray(ptx, "dflex_forward_launch", 4);
  ASSERT_TRUE(values.ok()) << values.error();
  EXPECT_EQ(values.value(), (std::vector<int64_t>{64, 1, 2, 3}));
}

TEST(PtxConstants, MissingOrMisshapenArraysAreNamed) {
  const std::string ptx =
      ".visible .global .align 4 .b8 dflex_forward_sm90_launch[16] = {128, 1};\n";
  // Another symbol that merely ends like the one asked for is not it.
  Result<std::vector<int64_t>> missing = readPtxIntArray(ptx, "sm90_launch", 4);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().find("'sm90_launch' not found"), std::string::npos) << missing.error();
  Result<std::vector<int64_t>> size = readPtxIntArray(ptx, "dflex_forward_sm90_launch", 5);
  ASSERT_FALSE(size.ok());
  EXPECT_NE(size.error().find("'dflex_forward_sm90_launch' have the wrong size"), std::string::npos)
      << size.error();
}

TEST(PtxConstants, EachArchsBinaryHasItsOwnValues) {
  CompileRequest request;
  request.source = "extern \"C\" __device__ const int probe_launch[5] = {\n"
                   "    __CUDA_ARCH__ / 10, 101376, -3};\n"
                   "__global__ void touch(int *out) { out[0] = probe_launch[threadIdx.x % 5]; }\n";
  request.programName = "probe.cu";
  request.options = {"-std=c++17"};
  for (const auto &[arch, computeCapability] :
       {std::pair<std::string, int64_t>{"sm_90a", 90}, {"sm_120", 120}}) {
    SCOPED_TRACE(arch);
    Result<ArchBinary> binary = compileForArch(request, arch);
    ASSERT_TRUE(binary.ok()) << binary.error();
    Result<std::vector<int64_t>> values = readPtxIntArray(binary.value().ptx, "probe_launch", 5);
    ASSERT_TRUE(values.ok()) << values.error() << "\n" << binary.value().ptx;
    EXPECT_EQ(values.value(), (std::vector<int64_t>{computeCapability, 101376, -3, 0, 0}));
  }
}

} // namespace
