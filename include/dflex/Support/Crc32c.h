//===- Crc32c.h - CRC-32C (Castagnoli), computed by ISA-L -------------------===//
#ifndef DFLEX_SUPPORT_CRC32C_H
#define DFLEX_SUPPORT_CRC32C_H

#include <cstddef>
#include <cstdint>

namespace dflex {

/// The CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected; initial value
/// and final xor 0xFFFFFFFF, as in iSCSI) of `size` bytes at `data`;
/// crc32c("123456789", 9) == 0xE3069283. `crc` continues an earlier result:
/// crc32c(b, nb, crc32c(a, na)) is the CRC of a followed by b, and the
/// default 0 starts a new one. Computed by Intel's ISA-L (crc32_iscsi), which
/// picks the fastest code the CPU runs (SSE4.2 / PCLMULQDQ / AVX-512).
uint32_t crc32c(const void *data, size_t size, uint32_t crc = 0);

} // namespace dflex

#endif // DFLEX_SUPPORT_CRC32C_H
