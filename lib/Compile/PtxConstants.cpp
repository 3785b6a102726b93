//===- PtxConstants.cpp - integer constants read back from PTX ------------===//

#include "dflex/Compile/PtxConstants.h"

#include <cctype>
#include <cstdlib>

namespace dflex::compile {

Result<std::vector<int64_t>> readPtxIntArray(const std::string &ptx, const std::string &symbol,
                                             size_t count) {
  // e.g. ".visible .global .align 4 .b8 name[16] = {128, 0, 0, 0, ...};"
  //   or ".visible .const .align 4 .u32 name[4] = {128, 65536, 128, 64};"
  // Scanned by hand: std::regex recurses per character and overflows the
  // stack on PTX of a megabyte.
  std::string type, size, list;
  const std::string declared = " " + symbol + "[";
  for (size_t at = ptx.find(declared); at != std::string::npos && type.empty();
       at = ptx.find(declared, at + 1)) {
    const size_t typeStart = ptx.rfind('.', at);
    if (typeStart == std::string::npos)
      continue;
    const std::string candidate = ptx.substr(typeStart + 1, at - typeStart - 1);
    if (candidate != "b8" && candidate != "u32" && candidate != "s32" && candidate != "b32")
      continue;
    size_t cursor = at + declared.size();
    const size_t digits = cursor;
    while (cursor < ptx.size() && std::isdigit(static_cast<unsigned char>(ptx[cursor])))
      ++cursor;
    const std::string opening = "] = {";
    if (cursor == digits || ptx.compare(cursor, opening.size(), opening) != 0)
      continue;
    const size_t listStart = cursor + opening.size();
    const size_t listEnd = ptx.find('}', listStart);
    if (listEnd == std::string::npos)
      continue;
    type = candidate;
    size = ptx.substr(digits, cursor - digits);
    list = ptx.substr(listStart, listEnd - listStart);
  }
  if (type.empty())
    return Status::failure("launch constants '" + symbol + "' not found in the PTX");
  std::vector<int64_t> raw;
  for (size_t start = 0; start < list.size();) {
    size_t end = list.find(',', start);
    if (end == std::string::npos)
      end = list.size();
    raw.push_back(std::strtoll(list.c_str() + start, nullptr, 10));
    start = end + 1;
  }
  std::vector<int64_t> values;
  // PTX leaves trailing zeros out of initializers.
  if (type == "b8") { // little-endian bytes of 32-bit ints
    if (raw.size() > 4 * count || std::strtoul(size.c_str(), nullptr, 10) != 4 * count)
      return Status::failure("launch constants '" + symbol + "' have the wrong size");
    raw.resize(4 * count, 0);
    for (size_t i = 0; i < count; ++i)
      values.push_back(static_cast<int32_t>(raw[4 * i] | raw[4 * i + 1] << 8 |
                                            raw[4 * i + 2] << 16 | raw[4 * i + 3] << 24));
  } else {
    if (raw.size() > count || std::strtoul(size.c_str(), nullptr, 10) != count)
      return Status::failure("launch constants '" + symbol + "' have the wrong size");
    raw.resize(count, 0);
    values = raw;
  }
  return values;
}

} // namespace dflex::compile
