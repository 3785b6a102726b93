//===- BundleWriter.h - Writing kernel bundles --------------------*- C++ -*-===//
//
// A bundle directory: manifest.json (docs/bundle.md), the generated source
// and PTX + cubin per arch of each module.
//
//===----------------------------------------------------------------------===//
#ifndef DFLEX_BUNDLE_BUNDLEWRITER_H
#define DFLEX_BUNDLE_BUNDLEWRITER_H

#include "dflex/Bundle/KernelRoles.h"
#include "dflex/Compile/Nvrtc.h"
#include "dflex/Support/Json.h"
#include "dflex/Support/Status.h"

#include <string>
#include <vector>

namespace dflex::bundle {

/// A generated module with its binaries, ready to be written.
struct CompiledModule {
  std::string name;     // the spec's symbol
  std::string kind;     // "attention" or "gated_delta"
  std::string fileStem; // of its files in the bundle
  std::string source;   // the generated CUDA source
  JsonValue spec;       // toJson of its spec (Specs.h)
  JsonValue variant;    // the layout of its variant's captures
  std::vector<JsonValue> programs; // the portable bodies it uses
  std::vector<ModuleKernel> kernels;
  std::vector<compile::ArchBinary> binaries;
  std::vector<std::string> cacheKeys; // per binary
  /// Per binary, its launch constants read from its own PTX: the constants
  /// follow the configs each arch is compiled with.
  std::vector<LaunchValues> launch;
};

/// Writes the bundle directory atomically: everything goes to a fresh
/// sibling directory first, which then replaces `directory` by rename.
Status writeBundle(const std::string &directory, const std::string &sourcePath,
                   const std::string &sourceText, const std::vector<std::string> &archs,
                   const std::vector<CompiledModule> &modules);

} // namespace dflex::bundle

#endif // DFLEX_BUNDLE_BUNDLEWRITER_H
