// The dflex.gated_delta specs of a kernel bundle (docs/runtime-gated-delta.md):
// the spec's options, launch constants, kernels and binaries, read from the
// manifest's gated_delta modules. No LibTorch here.
#pragma once

#include "dflex/runtime/bundle/KernelBundle.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dflex::runtime {

/// The launch constants of the gated-delta kernels (dflex_gated_delta_launch,
/// read back from a compiled module).
struct GatedDeltaLaunch {
  int64_t threads = 0;              // prepare, state and output kernels
  int64_t chunkBackwardThreads = 0; // backward chunk kernel
  int64_t stateThreads = 0;         // forward and backward state kernels
  int64_t chunkTableThreads = 0;    // varlen chunk table
  int64_t finalizeThreads = 0;      // grouped-head finalize, gate parameters
  int64_t chunk = 0;                // tokens per chunk
  int64_t valueBlock = 0;           // value columns per block of the state kernels
  /// Dynamic shared memory by kernel role (the roles whose
  /// bundle::KernelRoleInfo names a shared-bytes constant); the other
  /// kernels have static shared memory only.
  std::map<bundle::KernelRole, int64_t> sharedBytes;
};

/// A dflex.gated_delta spec of a bundle (its compile-time options) and
/// everything needed to run it.
struct GatedDeltaKernelSpec : bundle::GatedDeltaSpec {
  std::vector<BundleKernel> kernels;
  std::map<std::string, BundleBinary> binaries; // arch -> files
  /// arch -> the launch constants of the bundle's binary for it (read from
  /// that binary's PTX by dflex-compile).
  std::map<std::string, GatedDeltaLaunch> launches;
  std::string sourceFile, sourceSha256;

  /// Throws FormatError naming the spec when it has no such kernel.
  const BundleKernel &kernel(bundle::KernelRole role) const;
};

/// The gated-delta specs of a kernel bundle. KernelBundle opens the bundle
/// (format and template versions); this reads the manifest's gated_delta
/// modules, checks every field the runtime uses, and verifies the sha256 of
/// every file they list.
class GatedDeltaBundle : public std::enable_shared_from_this<GatedDeltaBundle> {
public:
  /// Through KernelBundle::openCached: opened again when the manifest
  /// changes. Throws IoError / FormatError naming the file and the field.
  static std::shared_ptr<const GatedDeltaBundle> openCached(const std::string &directory);

  const KernelBundle &files() const { return *files_; }
  const std::string &directory() const { return files_->directory(); }
  /// The spec `name`; throws FormatError listing the gated-delta specs there.
  const GatedDeltaKernelSpec &spec(const std::string &name) const;
  const std::vector<GatedDeltaKernelSpec> &specs() const { return specs_; }

  /// The cubin of `spec` for `arch` ("sm_90"), or for its arch-specific
  /// variant ("sm_90a"); KernelImage::arch says which (its launch constants
  /// are spec.launches.at(arch)). Throws FormatError when the bundle has
  /// neither (compile the spec with --arch for the device).
  KernelImage kernelImage(const GatedDeltaKernelSpec &spec, const std::string &arch) const;

private:
  std::shared_ptr<const KernelBundle> files_;
  std::vector<GatedDeltaKernelSpec> specs_;
};

} // namespace dflex::runtime
