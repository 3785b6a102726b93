//===- GpuArch.cpp -----------------------------------------------------------===//
#include "dflex/Compile/GpuArch.h"

namespace dflex::compile {

Result<GpuArch> parseGpuArch(std::string_view name) {
  GpuArch arch;
  arch.name = std::string(name);
  std::string_view rest;
  if (name.rfind("sm_", 0) == 0) {
    arch.producesCubin = true;
    rest = name.substr(3);
  } else if (name.rfind("compute_", 0) == 0) {
    rest = name.substr(8);
  } else {
    return Result<GpuArch>::failure(
        "invalid GPU architecture '" + std::string(name) +
        "': expected sm_XX or compute_XX (e.g. sm_90, sm_120, sm_90a)");
  }
  if (!rest.empty() && (rest.back() == 'a' || rest.back() == 'f'))
    rest.remove_suffix(1);
  bool digitsOnly = !rest.empty() && rest.size() <= 3;
  for (char c : rest)
    digitsOnly = digitsOnly && c >= '0' && c <= '9';
  if (!digitsOnly || rest[0] == '0')
    return Result<GpuArch>::failure(
        "invalid GPU architecture '" + std::string(name) +
        "': expected sm_XX or compute_XX (e.g. sm_90, sm_120, sm_90a)");
  arch.computeCapability = std::stoi(std::string(rest));
  return arch;
}

std::optional<uint64_t> maxSharedBytesPerBlock(int computeCapability) {
  // The CUDA programming guide's "maximum shared memory per thread block"
  // for each compute capability.
  switch (computeCapability) {
  case 75:
    return 65536;
  case 80:
  case 87:
    return 166912;
  case 86:
  case 89:
  case 120:
  case 121:
    return 101376;
  case 90:
  case 100:
  case 103:
  case 110:
    return 232448;
  default:
    return std::nullopt;
  }
}

} // namespace dflex::compile
