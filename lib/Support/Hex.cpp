//===- Hex.cpp ---------------------------------------------------------------===//
#include "dflex/Support/Hex.h"

namespace dflex {

namespace {
constexpr char kDigits[] = "0123456789abcdef";

int hexValue(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}
} // namespace

std::string toHex(std::string_view bytes) {
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (unsigned char byte : bytes) {
    hex.push_back(kDigits[byte >> 4]);
    hex.push_back(kDigits[byte & 15]);
  }
  return hex;
}

Result<std::string> fromHex(std::string_view hex) {
  if (hex.size() % 2 != 0)
    return Result<std::string>::failure("hex string has odd length " +
                                        std::to_string(hex.size()));
  std::string bytes;
  bytes.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    int high = hexValue(hex[i]), low = hexValue(hex[i + 1]);
    if (high < 0 || low < 0) {
      size_t bad = high < 0 ? i : i + 1;
      return Result<std::string>::failure(
          "invalid hex digit '" + std::string(1, hex[bad]) + "' at offset " +
          std::to_string(bad));
    }
    bytes.push_back(static_cast<char>(high << 4 | low));
  }
  return bytes;
}

bool isLowerHex(std::string_view text, size_t digits) {
  if (text.size() != digits)
    return false;
  for (char c : text)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
      return false;
  return true;
}

} // namespace dflex
