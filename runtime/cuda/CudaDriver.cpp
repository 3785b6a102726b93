#include "dflex/runtime/cuda/CudaDriver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <utility>

namespace dflex::runtime {

const char *toString(CudaDriverStatus status) {
  switch (status) {
  case CudaDriverStatus::Ready:
    return "ready";
  case CudaDriverStatus::NoDriverLibrary:
    return "no CUDA driver";
  case CudaDriverStatus::MissingEntryPoint:
    return "CUDA driver lacks an entry point";
  case CudaDriverStatus::InitFailed:
    return "CUDA driver initialisation failed";
  case CudaDriverStatus::NoDevice:
    return "no CUDA device";
  }
  return "unknown";
}

namespace {

std::string describe(const CudaDriverApi &api, CUresult result) {
  const char *name = nullptr;
  const char *text = nullptr;
  if (api.cuGetErrorName)
    api.cuGetErrorName(result, &name);
  if (api.cuGetErrorString)
    api.cuGetErrorString(result, &text);
  std::string out = name ? name : "CUDA error " + std::to_string(result);
  if (text)
    out += std::string(" (") + text + ")";
  return out;
}

} // namespace

CudaDriver CudaDriver::load(const std::string &library) {
  CudaDriver driver;
  dlerror();
  void *handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *why = dlerror();
    driver.status_ = CudaDriverStatus::NoDriverLibrary;
    driver.message_ = "no CUDA driver: cannot open " + library + ": " +
                      (why ? why : "unknown dlopen error");
    return driver;
  }
  driver.library_.reset(handle, [](void *h) { dlclose(h); });

  // cuGetProcAddress_v2 exists in every driver since CUDA 12.0; every other
  // entry point comes through it so that the ABI version matches cuda.h.
  auto getProcAddress =
      reinterpret_cast<decltype(&::cuGetProcAddress)>(
          dlsym(handle, "cuGetProcAddress_v2"));
  if (!getProcAddress) {
    driver.status_ = CudaDriverStatus::MissingEntryPoint;
    driver.message_ = "CUDA driver " + library +
                      " has no cuGetProcAddress_v2 (driver older than 12.0)";
    return driver;
  }

  std::vector<std::string> missing;
  auto resolve = [&](const char *symbol, void **slot) {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult result = getProcAddress(symbol, slot, CUDA_VERSION,
                                     CU_GET_PROC_ADDRESS_DEFAULT, &found);
    if (result != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS ||
        !*slot) {
      *slot = nullptr;
      missing.push_back(symbol);
    }
  };
#define DFLEX_CUDA_DRIVER_ENTRY(name)                                          \
  resolve(#name, reinterpret_cast<void **>(&driver.api_.name));
#include "dflex/runtime/cuda/CudaDriverEntries.def"
#undef DFLEX_CUDA_DRIVER_ENTRY
  if (!missing.empty()) {
    std::string list;
    for (const std::string &name : missing)
      list += (list.empty() ? "" : ", ") + name;
    driver.status_ = CudaDriverStatus::MissingEntryPoint;
    driver.message_ = "CUDA driver " + library +
                      " does not provide (for CUDA " +
                      std::to_string(CUDA_VERSION) + "): " + list;
    return driver;
  }

  const CudaDriverApi &api = driver.api_;
  if (CUresult result = api.cuInit(0); result != CUDA_SUCCESS) {
    // No device at all is reported by cuInit itself.
    driver.status_ = result == CUDA_ERROR_NO_DEVICE
                         ? CudaDriverStatus::NoDevice
                         : CudaDriverStatus::InitFailed;
    driver.message_ = "cuInit failed: " + describe(api, result);
    return driver;
  }
  if (CUresult result = api.cuDriverGetVersion(&driver.driverVersion_);
      result != CUDA_SUCCESS) {
    driver.status_ = CudaDriverStatus::InitFailed;
    driver.message_ = "cuDriverGetVersion failed: " + describe(api, result);
    return driver;
  }
  if (CUresult result = api.cuDeviceGetCount(&driver.deviceCount_);
      result != CUDA_SUCCESS) {
    driver.status_ = CudaDriverStatus::InitFailed;
    driver.message_ = "cuDeviceGetCount failed: " + describe(api, result);
    return driver;
  }
  if (driver.deviceCount_ == 0) {
    driver.status_ = CudaDriverStatus::NoDevice;
    driver.message_ = "CUDA driver " + std::to_string(driver.driverVersion_) +
                      " reports no device";
    return driver;
  }
  driver.status_ = CudaDriverStatus::Ready;
  driver.message_ = "CUDA driver " + std::to_string(driver.driverVersion_) +
                    ", " + std::to_string(driver.deviceCount_) + " device(s)";
  return driver;
}

const CudaDriver &CudaDriver::instance() {
  static const CudaDriver driver = [] {
    const char *override = std::getenv("DFLEX_LIBCUDA");
    return load(override && *override ? override : "libcuda.so.1");
  }();
  return driver;
}

const CudaDriverApi &CudaDriver::api() const {
  if (!ready())
    throw CudaError(message_);
  return api_;
}

void CudaDriver::check(CUresult result, const char *what) const {
  if (result != CUDA_SUCCESS)
    throw CudaError(std::string(what) + ": " + describe(api_, result));
}

CudaDeviceInfo queryDevice(const CudaDriver &driver, int ordinal) {
  const CudaDriverApi &api = driver.api();
  if (ordinal < 0 || ordinal >= driver.deviceCount())
    throw CudaError("CUDA device " + std::to_string(ordinal) +
                    " does not exist (" + std::to_string(driver.deviceCount()) +
                    " device(s))");
  CUdevice device = 0;
  driver.check(api.cuDeviceGet(&device, ordinal), "cuDeviceGet");
  CudaDeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {};
  driver.check(api.cuDeviceGetName(name, sizeof(name) - 1, device),
               "cuDeviceGetName");
  info.name = name;
  auto attribute = [&](CUdevice_attribute which, int *out, const char *what) {
    driver.check(api.cuDeviceGetAttribute(out, which, device), what);
  };
  attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &info.computeMajor,
            "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)");
  attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &info.computeMinor,
            "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)");
  attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &info.multiprocessors,
            "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)");
  attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            &info.maxSharedMemoryPerBlockOptin,
            "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)");
  return info;
}

CudaPrimaryContextGuard::CudaPrimaryContextGuard(const CudaDriver &driver,
                                                 int ordinal)
    : driver_(driver) {
  const CudaDriverApi &api = driver.api();
  driver.check(api.cuDeviceGet(&device_, ordinal), "cuDeviceGet");
  driver.check(api.cuDevicePrimaryCtxRetain(&context_, device_),
               "cuDevicePrimaryCtxRetain");
  if (CUresult result = api.cuCtxPushCurrent(context_);
      result != CUDA_SUCCESS) {
    api.cuDevicePrimaryCtxRelease(device_);
    driver.check(result, "cuCtxPushCurrent");
  }
}

CudaPrimaryContextGuard::~CudaPrimaryContextGuard() {
  // Destructors cannot report; both calls only fail on a corrupted context
  // stack, which the next checked call surfaces.
  const CudaDriverApi &api = driver_.api();
  CUcontext popped = nullptr;
  api.cuCtxPopCurrent(&popped);
  api.cuDevicePrimaryCtxRelease(device_);
}

CudaModule::CudaModule(const CudaDriver &driver, int ordinal,
                       const std::string &image, std::string label)
    : driver_(driver), ordinal_(ordinal), label_(std::move(label)) {
  CudaPrimaryContextGuard context(driver_, ordinal_);
  driver_.check(driver_.api().cuModuleLoadData(&module_, image.c_str()),
                ("cuModuleLoadData(" + label_ + ")").c_str());
}

CudaModule::~CudaModule() {
  // A destructor cannot report: a failure to unload leaks the module only.
  try {
    CudaPrimaryContextGuard context(driver_, ordinal_);
    driver_.api().cuModuleUnload(module_);
  } catch (const CudaError &) {
  }
}

CUfunction CudaModule::function(const std::string &name) const {
  CUfunction function = nullptr;
  driver_.check(
      driver_.api().cuModuleGetFunction(&function, module_, name.c_str()),
      ("cuModuleGetFunction(" + label_ + ", " + name + ")").c_str());
  return function;
}

void CudaModule::launch(CUfunction function, LaunchExtent grid,
                        LaunchExtent block, unsigned sharedMemoryBytes,
                        CUstream stream, void **arguments) const {
  CudaPrimaryContextGuard context(driver_, ordinal_);
  driver_.check(driver_.api().cuLaunchKernel(
                    function, grid.x, grid.y, grid.z, block.x, block.y,
                    block.z, sharedMemoryBytes, stream, arguments, nullptr),
                ("cuLaunchKernel(" + label_ + ")").c_str());
}

} // namespace dflex::runtime
