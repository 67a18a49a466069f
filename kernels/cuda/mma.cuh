// The warp-level tensor-core operations llmt's kernels use, behind device functions of our own: on a
// GPU (nvcc, sm_80 and later) each is one PTX instruction; under the SIMT emulator each is a
// warp-collective operation (simt/simt.cpp) that gathers the lanes' fragment registers in exactly
// the layout the PTX ISA documents ("Matrix Fragments for mma.m16n8k16", "Warp-level matrix load
// instruction: ldmatrix") and hands each lane its part of the result. tests/cuda/cuda_ops_test.cpp
// checks every function against plain products, under the emulator in ctest and on silicon in the
// GPU self-test, so the emulator's layouts are themselves checked by the hardware.
//
// Every lane of the warp calls each function together (the .sync.aligned forms): no divergence.
//
// Fragments of mma.m16n8k16 (bf16 inputs, f32 accumulators), per lane, with
// g = lane / 4 (groupID) and t = lane % 4 (threadID_in_group); a b32 register holds two bf16, the
// lower-indexed element in its low 16 bits:
//   A (16 x 16, row-major): a[0] = A[g][2t..2t+1]      a[1] = A[g+8][2t..2t+1]
//                           a[2] = A[g][2t+8..2t+9]    a[3] = A[g+8][2t+8..2t+9]
//   B (16 x 8, k by n):     b[0] = B[2t..2t+1][g]      b[1] = B[2t+8..2t+9][g]
//   C, D (16 x 8, f32):     c[0..1] = C[g][2t..2t+1]   c[2..3] = C[g+8][2t..2t+1]
// ldmatrix.m8n8 (b16): lanes 8j..8j+7 give the addresses of rows 0..7 of matrix j (j < 1, 2 or 4;
// 16-byte rows in shared memory); lane l receives in r[j] row l/4, columns 2(l%4) and 2(l%4)+1 of
// matrix j, or with .trans the transpose's: M_j[2(l%4)][l/4] and M_j[2(l%4)+1][l/4]. So A's fragment
// is one x4 load of its four 8 x 8 quarters (row blocks first), and B's, stored k-major, one x2.trans.
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_platform.h"

namespace llmt {
namespace cuda {

#ifdef LLMT_SIMT

__device__ __forceinline__ void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2],
                                                  const float c[4]) {
  ::llmt::simt::mma_m16n8k16_bf16(d, a, b, c);
}
template <int N, bool Trans>
__device__ __forceinline__ void ldmatrix(uint32_t r[N], const void* row) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
  ::llmt::simt::ldmatrix(r, N, Trans, row);
}

#else

__device__ __forceinline__ void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2],
                                                  const float c[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
}

template <int N, bool Trans>
__device__ __forceinline__ void ldmatrix(uint32_t r[N], const void* row) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(row);
  if constexpr (N == 1 && !Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(s));
  else if constexpr (N == 1 && Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(s));
  else if constexpr (N == 2 && !Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
  else if constexpr (N == 2 && Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(s));
  else if constexpr (!Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

#endif

}  // namespace cuda
}  // namespace llmt
