// CRC-32C (Castagnoli, as iSCSI and ext4 use it): the checksum of checkpoints (engine/ckpt) and of
// the token cache (data/).
#pragma once
#include <cstddef>
#include <cstdint>

namespace llmt {

// crc32c(0, data, n) for a whole buffer, or continue a running value. SSE 4.2 instructions where the
// CPU has them (several GB/s), else tables.
uint32_t crc32c(uint32_t crc, const void* data, size_t n);
// The CRC of A followed by B, from crc(A), crc(B) and B's length (zlib's crc32_combine for CRC-32C).
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

}  // namespace llmt
