#pragma once

#include <string>

namespace dflex::runtime {

/// "dflex-runtime <version> (LibTorch <version it was built against>)".
std::string versionString();

} // namespace dflex::runtime
