//===- Hex.h - Lowercase hexadecimal encoding of byte strings --------------===//
#ifndef DFLEX_SUPPORT_HEX_H
#define DFLEX_SUPPORT_HEX_H

#include "dflex/Support/Status.h"

#include <string>
#include <string_view>

namespace dflex {

/// Encodes bytes as lowercase hexadecimal, two digits per byte.
std::string toHex(std::string_view bytes);

/// Decodes hexadecimal (either case); fails on odd length or a non-hex digit.
Result<std::string> fromHex(std::string_view hex);

/// True if `text` is exactly `digits` lowercase hexadecimal digits.
bool isLowerHex(std::string_view text, size_t digits);

} // namespace dflex

#endif // DFLEX_SUPPORT_HEX_H
