// The probes of mma_probe.h: single-warp kernels that run the tensor-core primitives on known data.
#include "kernels/cuda/mma_probe.h"

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/mma.cuh"

namespace llmt {
namespace cuda {
namespace {

__device__ uint32_t pack2(uint16_t lo, uint16_t hi) { return (uint32_t)lo | (uint32_t)hi << 16; }

// d (16 x 8, global) = the mma of the lane's A and B fragments onto C's fragment read from global.
__device__ void mma_with_c_from_global(float* d, const uint32_t fa[4], const uint32_t fb[2], const float* c, int g,
                                       int t) {
  const float fc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
  float fd[4];
  mma_m16n8k16_bf16(fd, fa, fb, fc);
  d[g * 8 + 2 * t] = fd[0];
  d[g * 8 + 2 * t + 1] = fd[1];
  d[(g + 8) * 8 + 2 * t] = fd[2];
  d[(g + 8) * 8 + 2 * t + 1] = fd[3];
}

// The fragments straight from global memory, by the PTX ISA's formulas (mma.cuh).
__global__ void mma_fragments_kernel(float* d, const uint16_t* a, const uint16_t* b, const float* c) {
  const int l = (int)threadIdx.x, g = l / 4, t = l % 4;
  const uint32_t fa[4] = {pack2(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]),
                          pack2(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]),
                          pack2(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]),
                          pack2(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9])};
  const uint32_t fb[2] = {pack2(b[(2 * t) * 8 + g], b[(2 * t + 1) * 8 + g]),
                          pack2(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g])};
  mma_with_c_from_global(d, fa, fb, c, g, t);
}

__global__ void mma_ldmatrix_kernel(float* d, const uint16_t* a, const uint16_t* b, const float* c) {
  LLMT_SHARED(uint16_t, sa, [16 * 16]);
  LLMT_SHARED(uint16_t, sb, [16 * 8]);
  const int l = (int)threadIdx.x, g = l / 4, t = l % 4;
  for (int i = l; i < 16 * 16; i += WARP_SIZE) sa[i] = a[i];
  for (int i = l; i < 16 * 8; i += WARP_SIZE) sb[i] = b[i];
  __syncwarp();
  // A's quarters in fragment order: rows 0-7 | 8-15 of columns 0-7, then of columns 8-15
  const int q = l / 8, r = l % 8;
  uint32_t fa[4], fb[2];
  ldmatrix<4, false>(fa, &sa[((q % 2) * 8 + r) * 16 + (q / 2) * 8]);
  // B is k-major (16 rows of 8): rows k 0-7, then 8-15, each transposed into the n-major fragment
  ldmatrix<2, true>(fb, &sb[((l / 8) % 2 * 8 + r) * 8]);
  mma_with_c_from_global(d, fa, fb, c, g, t);
}

template <int N, bool Trans>
__device__ void ldmatrix_to(uint32_t* out, const uint16_t* sm, int l) {
  // lanes 8j..8j+7 name the rows of matrix j; the others' addresses are ignored (x1, x2) but valid
  const int j = (l / 8) % N;
  uint32_t r[N];
  ldmatrix<N, Trans>(r, &sm[j * 64 + (l % 8) * 8]);
  for (int k = 0; k < 4; k++) out[l * 4 + k] = k < N ? r[k] : 0u;
}

__global__ void ldmatrix_kernel(uint32_t* out, const uint16_t* m, int n, bool trans) {
  LLMT_SHARED(uint16_t, sm, [4 * 64]);
  const int l = (int)threadIdx.x;
  for (int i = l; i < n * 64; i += WARP_SIZE) sm[i] = m[i];
  __syncwarp();
  if (n == 1) trans ? ldmatrix_to<1, true>(out, sm, l) : ldmatrix_to<1, false>(out, sm, l);
  if (n == 2) trans ? ldmatrix_to<2, true>(out, sm, l) : ldmatrix_to<2, false>(out, sm, l);
  if (n == 4) trans ? ldmatrix_to<4, true>(out, sm, l) : ldmatrix_to<4, false>(out, sm, l);
}

}  // namespace

void mma_probe_fragments(float* d, const uint16_t* a, const uint16_t* b, const float* c) {
  LLMT_LAUNCH(mma_fragments_kernel, 1, WARP_SIZE, 0, nullptr, d, a, b, c);
  CUDA_CHECK_LAUNCH();
}

void mma_probe_ldmatrix(float* d, const uint16_t* a, const uint16_t* b, const float* c) {
  LLMT_LAUNCH(mma_ldmatrix_kernel, 1, WARP_SIZE, 0, nullptr, d, a, b, c);
  CUDA_CHECK_LAUNCH();
}

void ldmatrix_probe(uint32_t* out, const uint16_t* m, int n, bool trans) {
  LLMT_CHECK(n == 1 || n == 2 || n == 4, "ldmatrix_probe: n = %d, expected 1, 2 or 4", n);
  LLMT_LAUNCH(ldmatrix_kernel, 1, WARP_SIZE, 0, nullptr, out, m, n, trans);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cuda
}  // namespace llmt
