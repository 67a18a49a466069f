// CRC-32C (crc32c.h): slicing-by-8 tables, or the SSE 4.2 instruction where the CPU has it.
#include "engine/core/crc32c.h"

#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace llmt {

namespace {

const uint32_t kPoly = 0x82F63B78u;  // Castagnoli, reflected

struct Crc32cTables {
  uint32_t t[8][256];
  Crc32cTables() {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
      for (int s = 1; s < 8; s++) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};

// slicing-by-8 (about 1-2 GB/s), for CPUs without the instruction
uint32_t crc32c_sw(uint32_t c, const uint8_t* p, size_t n) {
  static const Crc32cTables tab;
  const auto& t = tab.t;
  while (n && ((uintptr_t)p & 7)) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff], n--;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
        t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
    p += 8, n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return c;
}

// a * b modulo P, polynomials in the reflected bit order (zlib's multmodp)
uint32_t multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, prod = 0;
  for (;;) {
    if (a & m) {
      prod ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = b & 1 ? (b >> 1) ^ kPoly : b >> 1;
  }
  return prod;
}

// x^(n * 2^k) modulo P
uint32_t x2nmodp(uint64_t n, unsigned k) {
  static const auto table = [] {
    std::vector<uint32_t> t(64);
    uint32_t p = 1u << 30;  // x^1
    for (int i = 0; i < 64; i++) t[i] = p, p = multmodp(p, p);
    return t;
  }();
  uint32_t p = 1u << 31;  // x^0
  while (n) {
    if (n & 1) p = multmodp(table[k & 63], p);
    n >>= 1;
    k++;
  }
  return p;
}

#if defined(__x86_64__)
// The SSE 4.2 instruction, 8 bytes at a time, in three interleaved streams over consecutive blocks
// (one stream waits 3 cycles per instruction); each block's register is then shifted past the
// blocks after it (multiplied by x^(8 * bytes) mod P) and the three are added.
__attribute__((target("sse4.2"))) uint32_t crc32c_hw(uint32_t c, const uint8_t* p, size_t n) {
  const size_t kBlock = 8192;
  static const uint32_t shift1 = x2nmodp(kBlock, 3), shift2 = x2nmodp(2 * kBlock, 3);
  uint64_t c0 = c;
  while (n && ((uintptr_t)p & 7)) c0 = _mm_crc32_u8((uint32_t)c0, *p++), n--;
  for (; n >= 3 * kBlock; p += 3 * kBlock, n -= 3 * kBlock) {
    uint64_t c1 = 0, c2 = 0, w0, w1, w2;
    for (size_t i = 0; i < kBlock; i += 8) {
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p + kBlock + i, 8);
      std::memcpy(&w2, p + 2 * kBlock + i, 8);
      c0 = _mm_crc32_u64(c0, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
    c0 = multmodp(shift2, (uint32_t)c0) ^ multmodp(shift1, (uint32_t)c1) ^ (uint32_t)c2;
  }
  for (uint64_t w; n >= 8; p += 8, n -= 8) {
    std::memcpy(&w, p, 8);
    c0 = _mm_crc32_u64(c0, w);
  }
  while (n--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
  return (uint32_t)c0;
}
#endif

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
  uint32_t c = ~crc;
#if defined(__x86_64__)
  static const bool hw = __builtin_cpu_supports("sse4.2");
  if (hw) return ~crc32c_hw(c, (const uint8_t*)data, n);
#endif
  return ~crc32c_sw(c, (const uint8_t*)data, n);
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return multmodp(x2nmodp(len_b, 3), crc_a) ^ crc_b;
}

}  // namespace llmt
