//===- PtxConstants.h - integer constants read back from PTX ----*- C++ -*-===//
//
// Generated modules compile their launch constants (threads, shared memory,
// tile sizes) into `extern "C" __device__ const int NAME[N]` arrays, so that
// whoever launches the kernels reads exactly what a binary was compiled with:
// dflex-compile for each arch of a bundle, the runtime for an arch it
// compiles itself.
//
//===----------------------------------------------------------------------===//
#ifndef DFLEX_COMPILE_PTXCONSTANTS_H
#define DFLEX_COMPILE_PTXCONSTANTS_H

#include "dflex/Support/Status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dflex::compile {

/// The `count` values of the `extern "C" __device__ const int symbol[count]`
/// array defined in `ptx`. Fails, naming the symbol, when the PTX has no
/// such array or it has another size.
Result<std::vector<int64_t>> readPtxIntArray(const std::string &ptx, const std::string &symbol,
                                             size_t count);

} // namespace dflex::compile

#endif // DFLEX_COMPILE_PTXCONSTANTS_H
