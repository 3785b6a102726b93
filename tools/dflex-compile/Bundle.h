//===- Bundle.h - writing kernel bundles --------------------------*- C++ -*-===//

#ifndef DFLEX_TOOLS_DFLEXCOMPILE_BUNDLE_H
#define DFLEX_TOOLS_DFLEXCOMPILE_BUNDLE_H

#include "dflex/Codegen/Attention.h"
#include "dflex/Compile/Nvrtc.h"
#include "dflex/Support/Json.h"
#include "dflex/Support/Status.h"

#include <map>
#include <string>
#include <vector>

namespace dflex::tools {

/// A generated module with its binaries, ready to be written.
struct CompiledModule {
  codegen::GeneratedModule generated;
  JsonValue spec;                      // the spec's attributes
  std::vector<JsonValue> programs;     // the portable bodies it uses
  std::vector<compile::ArchBinary> binaries;
  std::vector<std::string> cacheKeys;  // per binary
  std::map<std::string, std::map<std::string, int64_t>> launch; // symbol -> name -> value
};

/// Reads the `extern "C" __device__ const int NAME[N]` arrays of `names` from
/// PTX text.
Result<std::vector<int64_t>> readPtxIntArray(const std::string &ptx,
                                             const std::string &symbol,
                                             size_t count);

/// Writes the bundle directory atomically: everything goes to a fresh
/// sibling directory first, which then replaces `directory` by rename.
Status writeBundle(const std::string &directory, const std::string &sourcePath,
                   const std::string &sourceText,
                   const std::vector<std::string> &archs,
                   const std::vector<CompiledModule> &modules);

} // namespace dflex::tools

#endif // DFLEX_TOOLS_DFLEXCOMPILE_BUNDLE_H
