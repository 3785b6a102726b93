//===- CompileRequest.h - Compiling a module for one arch ---------*- C++ -*-===//
//
// The NVRTC request of a bundle module for one arch, the launch constants
// its binary holds, and the shared-memory check of its kernels: one
// definition for dflex-compile and for the runtime's run-time compile, so
// both make the same request and share cache entries.
//
//===----------------------------------------------------------------------===//
#ifndef DFLEX_BUNDLE_COMPILEREQUEST_H
#define DFLEX_BUNDLE_COMPILEREQUEST_H

#include "dflex/Bundle/KernelRoles.h"
#include "dflex/Compile/Nvrtc.h"
#include "dflex/Support/Status.h"

#include <string>
#include <vector>

namespace dflex::bundle {

/// The request for part `part` (KernelRoleInfo::part) of the binary for
/// `arch` of the module `moduleName` (its generated `source` with the
/// embedded kernel templates as headers): the kernels of `kernels` that
/// `arch` builds into that part.
compile::CompileRequest compileRequest(const std::string &moduleName, const std::string &source,
                                       const std::vector<ModuleKernel> &kernels,
                                       const std::string &arch, const std::string &part);

/// The launch constants of `binary` (compiled for its arch from a module of
/// `kernels`, or of a part's kernels), read from its PTX: the arrays of the
/// kernels that arch builds.
Result<LaunchValues> readLaunchValues(const compile::ArchBinary &binary,
                                      const std::vector<ModuleKernel> &kernels);

/// Adds the launch constants of a part to those of the other parts of its
/// binary. The parts compile one source for one arch, so an array two parts
/// read must have the same values in both.
Status mergeLaunchValues(LaunchValues &binary, const LaunchValues &part);

/// Checks static plus dynamic shared memory of each kernel of `binary`
/// (compiled by `request`) against its arch's limit, the dynamic bytes
/// being the launch constants of `launch`.
Status checkSharedMemory(compile::CompileRequest request, const std::vector<ModuleKernel> &kernels,
                         const LaunchValues &launch, compile::ArchBinary &binary);

} // namespace dflex::bundle

#endif // DFLEX_BUNDLE_COMPILEREQUEST_H
