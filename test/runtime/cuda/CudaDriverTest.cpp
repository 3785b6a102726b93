#include "dflex/runtime/cuda/CudaDriver.h"

#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <nvrtc.h>
#include <torch/torch.h>

using namespace dflex::runtime;

TEST(CudaDriver, MissingLibraryIsAStatusNotACrash) {
  CudaDriver driver = CudaDriver::load("libdflex-no-such-driver.so.1");
  EXPECT_EQ(driver.status(), CudaDriverStatus::NoDriverLibrary);
  EXPECT_FALSE(driver.ready());
  EXPECT_NE(driver.message().find("no CUDA driver"), std::string::npos);
  EXPECT_NE(driver.message().find("libdflex-no-such-driver.so.1"),
            std::string::npos);
  EXPECT_THROW(driver.api(), CudaError);
}

TEST(CudaDriver, LibraryWithoutDriverEntryPointsIsReported) {
  // Any shared library that is not a CUDA driver.
  CudaDriver driver = CudaDriver::load("libdl.so.2");
  EXPECT_EQ(driver.status(), CudaDriverStatus::MissingEntryPoint);
  EXPECT_NE(driver.message().find("cuGetProcAddress_v2"), std::string::npos);
}

TEST(CudaDriver, ProcessDriverIsConsistent) {
  const CudaDriver &driver = CudaDriver::instance();
  EXPECT_EQ(&driver, &CudaDriver::instance());
  if (!driver.ready()) {
    EXPECT_FALSE(driver.message().empty());
    EXPECT_THROW(driver.api(), CudaError);
    GTEST_SKIP() << driver.message();
  }
  EXPECT_GT(driver.deviceCount(), 0);
  EXPECT_GE(driver.driverVersion(), 12000);
  CudaDeviceInfo info = queryDevice(driver, 0);
  EXPECT_FALSE(info.name.empty());
  EXPECT_GE(info.computeMajor, 7);
  EXPECT_THROW(queryDevice(driver, driver.deviceCount()), CudaError);
}

// Needs a GPU: NVRTC PTX for the device, loaded by the run-time driver into
// LibTorch's context and launched on LibTorch's stream over a LibTorch tensor.
TEST(CudaDriver, ModuleFromNvrtcRunsOnLibTorchStream) {
  const CudaDriver &driver = CudaDriver::instance();
  if (!driver.ready())
    GTEST_SKIP() << driver.message();
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "LibTorch sees no CUDA device";
  CudaDeviceInfo info = queryDevice(driver, 0);
  const char *source = R"(
extern "C" __global__ void affine(float *x, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = a * x[i] + b;
})";
  nvrtcProgram program;
  ASSERT_EQ(nvrtcCreateProgram(&program, source, "affine.cu", 0, nullptr, nullptr),
            NVRTC_SUCCESS);
  std::string arch = "--gpu-architecture=compute_" +
                     std::to_string(info.computeMajor * 10 + info.computeMinor);
  const char *options[] = {arch.c_str()};
  nvrtcResult compiled = nvrtcCompileProgram(program, 1, options);
  size_t logSize = 0;
  nvrtcGetProgramLogSize(program, &logSize);
  std::string log(logSize, '\0');
  nvrtcGetProgramLog(program, log.data());
  ASSERT_EQ(compiled, NVRTC_SUCCESS) << log;
  size_t ptxSize = 0;
  ASSERT_EQ(nvrtcGetPTXSize(program, &ptxSize), NVRTC_SUCCESS);
  std::string ptx(ptxSize, '\0');
  ASSERT_EQ(nvrtcGetPTX(program, ptx.data()), NVRTC_SUCCESS);
  nvrtcDestroyProgram(&program);

  const int n = 1000;
  torch::Tensor x = torch::arange(n, torch::dtype(torch::kFloat).device(torch::kCUDA, 0));
  CudaModule module(driver, 0, ptx, "affine test module");
  CUfunction affine = module.function("affine");
  void *data = x.data_ptr();
  float a = 2.0f, b = 1.0f;
  int count = n;
  void *arguments[] = {&data, &a, &b, &count};
  module.launch(affine, {(n + 255) / 256, 1, 1}, {256, 1, 1}, 0,
                c10::cuda::getCurrentCUDAStream(0).stream(), arguments);
  EXPECT_TRUE(torch::equal(x.cpu(), torch::arange(n, torch::kFloat) * 2 + 1));
  try {
    module.function("missing");
    ADD_FAILURE() << "a missing kernel was found";
  } catch (const CudaError &error) {
    EXPECT_NE(std::string(error.what()).find("affine test module, missing"), std::string::npos)
        << error.what();
  }
}
