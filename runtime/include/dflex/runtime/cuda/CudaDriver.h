// CUDA Driver API, resolved at run time.
//
// Nothing links against libcuda: the library is opened with dlopen on first
// use and every entry point is fetched through cuGetProcAddress. A machine
// without a driver (or without a device) gets a clear status instead of a
// loader failure, so every binary and every CPU test starts everywhere.
#pragma once

#include <cuda.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace dflex::runtime {

/// A failed CUDA call, or use of the driver where it is not available.
class CudaError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Typed pointers to the resolved entry points (see CudaDriverEntries.def).
struct CudaDriverApi {
#define DFLEX_CUDA_DRIVER_ENTRY(name) decltype(&::name) name = nullptr;
#include "dflex/runtime/cuda/CudaDriverEntries.def"
#undef DFLEX_CUDA_DRIVER_ENTRY
};

enum class CudaDriverStatus {
  Ready,             ///< Driver loaded, initialised, at least one device.
  NoDriverLibrary,   ///< libcuda could not be opened (CPU-only machine).
  MissingEntryPoint, ///< The driver lacks an entry point the runtime needs.
  InitFailed,        ///< cuInit or a device query failed.
  NoDevice,          ///< Driver works but reports zero devices.
};

const char *toString(CudaDriverStatus status);

/// One loaded copy of the Driver API. Loading never throws: the outcome is in
/// status() and message(); api() throws CudaError unless the status is Ready.
class CudaDriver {
public:
  /// The process-wide driver: opens $DFLEX_LIBCUDA if set, else libcuda.so.1.
  /// Loaded once, on first call; thread-safe.
  static const CudaDriver &instance();

  /// Opens the given library (a file name for the dynamic loader or a path).
  static CudaDriver load(const std::string &library);

  CudaDriverStatus status() const { return status_; }
  bool ready() const { return status_ == CudaDriverStatus::Ready; }
  /// Why the driver is not ready, or a one-line summary when it is.
  const std::string &message() const { return message_; }
  /// As reported by cuDriverGetVersion, e.g. 13000; 0 when not loaded.
  int driverVersion() const { return driverVersion_; }
  int deviceCount() const { return deviceCount_; }

  const CudaDriverApi &api() const;

  /// Throws CudaError "<what>: CUDA_ERROR_X (description)" unless result is
  /// CUDA_SUCCESS.
  void check(CUresult result, const char *what) const;

private:
  CudaDriver() = default;

  std::shared_ptr<void> library_; // dlclose on last copy
  CudaDriverApi api_;
  CudaDriverStatus status_ = CudaDriverStatus::NoDriverLibrary;
  std::string message_;
  int driverVersion_ = 0;
  int deviceCount_ = 0;
};

/// Device facts the kernel runtime needs to pick a binary and a launch shape.
struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;
  int computeMajor = 0;
  int computeMinor = 0;
  int multiprocessors = 0;
  int maxSharedMemoryPerBlockOptin = 0;
};

CudaDeviceInfo queryDevice(const CudaDriver &driver, int ordinal);

/// Makes the primary context of a device current on this thread for the
/// lifetime of the guard (the same context the CUDA runtime and LibTorch use),
/// restoring the previous one afterwards.
class CudaPrimaryContextGuard {
public:
  CudaPrimaryContextGuard(const CudaDriver &driver, int ordinal);
  ~CudaPrimaryContextGuard();
  CudaPrimaryContextGuard(const CudaPrimaryContextGuard &) = delete;
  CudaPrimaryContextGuard &operator=(const CudaPrimaryContextGuard &) = delete;

  CUcontext context() const { return context_; }

private:
  const CudaDriver &driver_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
};

/// Grid or block extent of a kernel launch.
struct LaunchExtent {
  unsigned x = 1, y = 1, z = 1;
};

/// A loaded module (cubin or PTX image) in a device's primary context. The
/// driver must outlive it (CudaDriver::instance() lives for the process).
class CudaModule {
public:
  /// `image` is a cubin, fatbin or NUL-terminated PTX; `label` names it in
  /// errors (e.g. the kernel bundle entry it came from).
  CudaModule(const CudaDriver &driver, int ordinal, const std::string &image,
             std::string label);
  ~CudaModule();
  CudaModule(const CudaModule &) = delete;
  CudaModule &operator=(const CudaModule &) = delete;

  /// Looks up a kernel by its (lowered) name; throws naming module and kernel.
  CUfunction function(const std::string &name) const;

  /// Launches on `stream` (a CUstream, e.g. LibTorch's current stream).
  void launch(CUfunction function, LaunchExtent grid, LaunchExtent block,
              unsigned sharedMemoryBytes, CUstream stream,
              void **arguments) const;

private:
  const CudaDriver &driver_;
  int ordinal_;
  std::string label_;
  CUmodule module_ = nullptr;
};

/// A kernel and the module it was looked up in (a binary in several parts
/// loads one module per part).
struct CudaKernel {
  const CudaModule *module = nullptr;
  CUfunction function = nullptr;

  void launch(LaunchExtent grid, LaunchExtent block, unsigned sharedMemoryBytes, CUstream stream,
              void **arguments) const {
    module->launch(function, grid, block, sharedMemoryBytes, stream, arguments);
  }
};

} // namespace dflex::runtime
