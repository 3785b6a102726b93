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
  /// Per binary, its launch constants read from its own PTX: the constants
  /// follow the configs each arch is compiled with.
  using LaunchValues = std::map<std::string, std::map<std::string, int64_t>>; // symbol -> name -> value
  std::vector<LaunchValues> launch;
};

/// Writes the bundle directory atomically: everything goes to a fresh
/// sibling directory first, which then replaces `directory` by rename.
Status writeBundle(const std::string &directory, const std::string &sourcePath,
                   const std::string &sourceText,
                   const std::vector<std::string> &archs,
                   const std::vector<CompiledModule> &modules);

} // namespace dflex::tools

#endif // DFLEX_TOOLS_DFLEXCOMPILE_BUNDLE_H
