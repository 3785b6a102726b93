#include "dflex/runtime/CudaDriver.h"

#include <gtest/gtest.h>

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
