//===- BundleWriter.h - Writing kernel bundles --------------------*- C++ -*-===//
//
// A bundle directory: manifest.json (docs/bundle.md), the generated source
// and PTX + cubin per arch and part of each module.
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

/// One part of a module's binary for an arch (KernelRoleInfo::part): the
/// NVRTC program of some of its kernels.
struct BinaryPart {
  std::string name;
  compile::ArchBinary binary;
  std::string cacheKey;
};

/// A module's binary for one arch: its parts, and the launch constants read
/// from their PTX (they follow the configs each arch is compiled with).
struct ModuleBinary {
  std::string arch;
  std::vector<BinaryPart> parts;
  LaunchValues launch;
  /// The part holding the kernel of `expression`, or null.
  const BinaryPart *partOf(const std::string &expression) const;
};

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
  std::vector<ModuleBinary> binaries; // per arch
};

/// Writes the bundle directory atomically: everything goes to a fresh
/// sibling directory first, which then replaces `directory` by rename.
Status writeBundle(const std::string &directory, const std::string &sourcePath,
                   const std::string &sourceText, const std::vector<std::string> &archs,
                   const std::vector<CompiledModule> &modules);

} // namespace dflex::bundle

#endif // DFLEX_BUNDLE_BUNDLEWRITER_H
