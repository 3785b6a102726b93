// Manifest parts every kind of bundle module shares (attention, gated delta).
#pragma once

#include "dflex/Support/JsonObject.h"

#include "dflex/runtime/bundle/KernelBundle.h"

#include <map>
#include <string>
#include <vector>

namespace dflex::runtime::detail {

/// The "binaries" of a bundle module, checked against its kernels: every
/// kernel an arch builds has a lowered name for it, and no other does.
std::map<std::string, BundleBinary> parseBundleBinaries(const JsonObject &module,
                                                        const std::vector<BundleKernel> &kernels);

} // namespace dflex::runtime::detail
