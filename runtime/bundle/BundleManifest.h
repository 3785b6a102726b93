// Manifest parts every kind of bundle module shares (attention, gated delta).
#pragma once

#include "dflex/Support/JsonObject.h"

#include "dflex/Support/Error.h"
#include "dflex/runtime/bundle/KernelBundle.h"

#include <map>
#include <string>
#include <vector>

namespace dflex::runtime::detail {

/// The kernels of a bundle module ("kernels"), each of a known role whose
/// required target the manifest states.
std::vector<BundleKernel> parseBundleKernels(const JsonObject &module);

/// The "binaries" of a bundle module, checked against its kernels: every
/// kernel an arch builds has a lowered name for it, and no other does.
std::map<std::string, BundleBinary> parseBundleBinaries(const JsonObject &module,
                                                        const std::vector<BundleKernel> &kernels);

/// The member `key` of `object`, which must be an object.
const JsonValue &member(const JsonObject &object, const char *key);

/// A manifest's spec (Specs.h), or its error as a FormatError.
template <typename Spec> Spec specOrThrow(Result<Spec> spec) {
  if (!spec.ok())
    throw FormatError(spec.error());
  return std::move(spec).value();
}

} // namespace dflex::runtime::detail
