//===- GpuArch.h - GPU architecture names and per-arch limits --------------===//
#ifndef DFLEX_COMPILE_GPUARCH_H
#define DFLEX_COMPILE_GPUARCH_H

#include "dflex/Support/Status.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dflex::compile {

/// A compilation target as NVRTC names it: "sm_XX" (PTX and cubin),
/// "compute_XX" (PTX only), each optionally with an "a" (arch-specific, e.g.
/// sm_90a for wgmma) or "f" (family) suffix.
struct GpuArch {
  std::string name;
  /// major * 10 + minor, e.g. 90 or 120.
  int computeCapability = 0;
  /// sm_XX gives a cubin; compute_XX gives PTX only.
  bool producesCubin = false;
};

/// Parses an architecture name; errors say what form is expected.
Result<GpuArch> parseGpuArch(std::string_view name);

/// Static (__shared__) memory per block is limited to 48 KiB on every
/// architecture; more needs dynamic shared memory.
constexpr uint64_t kMaxStaticSharedBytes = 48 * 1024;

/// The most shared memory (static + dynamic, with the opt-in launch
/// attribute) one block may use on a compute capability, or nullopt if dflex
/// does not know it. sm_120: 101,376 B; sm_90: 232,448 B.
std::optional<uint64_t> maxSharedBytesPerBlock(int computeCapability);

} // namespace dflex::compile

#endif // DFLEX_COMPILE_GPUARCH_H
