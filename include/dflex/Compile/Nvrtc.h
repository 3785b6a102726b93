//===- Nvrtc.h - CUDA C++ to PTX and cubin through NVRTC -------------------===//
//
// Used by dflex-compile (ahead of time) and by the runtime (for an arch a
// bundle lacks). Needs NVRTC and the CUDA headers, not a GPU.
//
//===----------------------------------------------------------------------===//
#ifndef DFLEX_COMPILE_NVRTC_H
#define DFLEX_COMPILE_NVRTC_H

#include "dflex/Support/Status.h"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dflex::compile {

/// A header the source may #include by `name`, supplied in memory.
struct HeaderFile {
  std::string name;
  std::string contents;
};

struct CompileRequest {
  std::string source;
  /// Appears in diagnostics that have no #line directive to point elsewhere.
  std::string programName = "dflex_kernels.cu";
  /// "sm_90", "sm_120", "sm_90a", "compute_90", ...
  std::vector<std::string> archs;
  /// Extra NVRTC options, e.g. "-std=c++17", "--use_fast_math". The
  /// architecture, the CUDA include path and ptxas verbosity are added by
  /// the driver; do not pass --gpu-architecture here.
  std::vector<std::string> options;
  std::vector<HeaderFile> headers;
  /// Kernel instantiations to get lowered (mangled) names for, e.g.
  /// "attn_fwd<128, true>".
  std::vector<std::string> nameExpressions;
  /// Dynamic shared memory each kernel will be launched with, keyed by
  /// mangled name, extern "C" name or name expression. Static plus dynamic
  /// shared memory must fit the architecture's per-block limit.
  std::map<std::string, uint64_t> dynamicSharedBytes;
};

/// What ptxas reported for one kernel (entry function).
struct KernelResources {
  /// Mangled name (or the plain name of an extern "C" kernel).
  std::string name;
  uint64_t registers = 0;
  uint64_t barriers = 0;
  uint64_t staticSharedBytes = 0;
  /// Per-thread local memory for the stack frame (local arrays, spills).
  uint64_t stackFrameBytes = 0;
  uint64_t spillStoreBytes = 0;
  uint64_t spillLoadBytes = 0;

  bool operator==(const KernelResources &other) const;
};

struct LoweredName {
  std::string expression;
  std::string loweredName;
};

/// The result of compiling a request for one architecture.
struct ArchBinary {
  std::string arch;
  std::string ptx;
  /// ELF bytes; empty for compute_XX.
  std::string cubin;
  std::vector<LoweredName> loweredNames;
  /// One per entry function, from the ptxas log; empty for compute_XX.
  std::vector<KernelResources> kernels;
  /// NVRTC's log (includes ptxas' resource report).
  std::string log;
  double compileMilliseconds = 0;
  /// Set by the cache-aware compile; not serialized.
  bool fromCache = false;
  /// Remarks of the shared-memory check (e.g. an unknown limit); not
  /// serialized.
  std::vector<std::string> notes;

  /// The kernel with this mangled name, or null.
  const KernelResources *findKernel(std::string_view name) const;
  /// The lowered name of a name expression, or empty.
  std::string loweredName(std::string_view expression) const;
};

/// Compiles `request` for one architecture and checks shared memory. A
/// failure message names the program and arch and carries NVRTC's log
/// unchanged (so #line directives keep pointing at the DSL file).
Result<ArchBinary> compileForArch(const CompileRequest &request,
                                  std::string_view arch);

/// compileForArch for every arch of the request, in order; stops at the
/// first failure.
Result<std::vector<ArchBinary>> compileAllArchs(const CompileRequest &request);

/// Checks that every kernel's static shared memory plus the dynamic shared
/// memory requested for it fits the per-block limit of `binary.arch`, and
/// that every kernel named in request.dynamicSharedBytes exists. Adds a note
/// when the arch's limit is unknown. (Static shared memory above 48 KiB is
/// already refused by ptxas; compileForArch explains that failure.)
Status checkSharedMemory(const CompileRequest &request, ArchBinary &binary);

/// Extracts per-kernel resources from a log of `--ptxas-options=-v`.
std::vector<KernelResources> parsePtxasLog(std::string_view log);

/// NVRTC's version as "major.minor", e.g. "13.0".
Result<std::string> nvrtcVersion();

/// Architectures this NVRTC accepts, as "sm_XX".
Result<std::vector<std::string>> nvrtcSupportedArchs();

/// The directory holding the CUDA headers (cuda_bf16.h): $DFLEX_CUDA_INCLUDE
/// if set (it must contain cuda_bf16.h), else $CUDA_HOME/include or
/// $CUDA_PATH/include if they contain it, else the toolkit found when dflex
/// was built.
Result<std::string> cudaIncludeDirectory();

/// Byte encoding of an ArchBinary for the kernel cache (all fields but
/// fromCache and notes).
std::string serializeArchBinary(const ArchBinary &binary);
Result<ArchBinary> deserializeArchBinary(std::string_view bytes);

} // namespace dflex::compile

#endif // DFLEX_COMPILE_NVRTC_H
