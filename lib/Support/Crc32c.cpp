//===- Crc32c.cpp - CRC-32C through ISA-L -----------------------------------===//
#include "dflex/Support/Crc32c.h"

#include <isa-l/crc.h>

namespace dflex {

uint32_t crc32c(const void *data, size_t size, uint32_t crc) {
  // crc32_iscsi neither inverts its initial value nor its result, takes an
  // int length and a pointer to non-const bytes that it only reads.
  auto *bytes = static_cast<unsigned char *>(const_cast<void *>(data));
  constexpr size_t kMaxChunk = size_t(1) << 30;
  crc = ~crc;
  while (size > 0) {
    size_t chunk = size < kMaxChunk ? size : kMaxChunk;
    crc = crc32_iscsi(bytes, int(chunk), crc);
    bytes += chunk;
    size -= chunk;
  }
  return ~crc;
}

} // namespace dflex
