#include "dflex/runtime/support/Version.h"

#include <torch/version.h>

namespace dflex::runtime {

std::string versionString() {
  return "dflex-runtime 0.1.0 (LibTorch " TORCH_VERSION ")";
}

} // namespace dflex::runtime
