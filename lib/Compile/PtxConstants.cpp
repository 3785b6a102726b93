//===- PtxConstants.cpp - integer constants read back from PTX ------------===//

#include "dflex/Compile/PtxConstants.h"

#include <cstdlib>
#include <regex>

namespace dflex::compile {

Result<std::vector<int64_t>> readPtxIntArray(const std::string &ptx, const std::string &symbol,
                                             size_t count) {
  // e.g. ".visible .global .align 4 .b8 name[16] = {128, 0, 0, 0, ...};"
  //   or ".visible .const .align 4 .u32 name[4] = {128, 65536, 128, 64};"
  std::regex pattern("\\.(b8|u32|s32|b32) " + symbol + "\\[(\\d+)\\] = \\{([^}]*)\\}");
  std::smatch match;
  if (!std::regex_search(ptx, match, pattern))
    return Status::failure("launch constants '" + symbol + "' not found in the PTX");
  std::vector<int64_t> raw;
  std::string list = match[3];
  for (size_t start = 0; start < list.size();) {
    size_t end = list.find(',', start);
    if (end == std::string::npos)
      end = list.size();
    raw.push_back(std::strtoll(list.c_str() + start, nullptr, 10));
    start = end + 1;
  }
  std::vector<int64_t> values;
  // PTX leaves trailing zeros out of initializers.
  if (match[1] == "b8") { // little-endian bytes of 32-bit ints
    if (raw.size() > 4 * count || std::strtoul(match[2].str().c_str(), nullptr, 10) != 4 * count)
      return Status::failure("launch constants '" + symbol + "' have the wrong size");
    raw.resize(4 * count, 0);
    for (size_t i = 0; i < count; ++i)
      values.push_back(static_cast<int32_t>(raw[4 * i] | raw[4 * i + 1] << 8 |
                                            raw[4 * i + 2] << 16 | raw[4 * i + 3] << 24));
  } else {
    if (raw.size() > count || std::strtoul(match[2].str().c_str(), nullptr, 10) != count)
      return Status::failure("launch constants '" + symbol + "' have the wrong size");
    raw.resize(count, 0);
    values = raw;
  }
  return values;
}

} // namespace dflex::compile
