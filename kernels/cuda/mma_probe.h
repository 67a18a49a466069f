// Probes of the tensor-core primitives (kernels/cuda/mma.cuh): one warp each, device pointers in
// and out, for tests/cuda/cuda_ops_test.cpp to compare with plain products on the host. The same
// test runs under the emulator (ctest) and on a GPU (the self-test's first test step), so a layout
// the emulator got wrong shows as a difference on silicon. A plain C++ header.
#pragma once
#include <cstdint>

namespace llmt {
namespace cuda {

// d[16 x 8] = a[16 x 16] @ b[16 x 8] + c[16 x 8] (row-major; a, b bf16 bits, c, d f32) by one
// mma.m16n8k16, each lane's fragments built from global memory by the documented layout formulas.
void mma_probe_fragments(float* d, const uint16_t* a, const uint16_t* b, const float* c);
// The same product with the fragments loaded by ldmatrix from shared memory: A by one x4, B (stored
// k-major) by one x2.trans.
void mma_probe_ldmatrix(float* d, const uint16_t* a, const uint16_t* b, const float* c);
// ldmatrix.x{n}[.trans] of the n 8 x 8 matrices m[n][8][8] (bf16 bits, row-major), each copied to
// shared memory with rows 16 bytes apart; out[lane * 4 + j] = lane's register j (n in 1, 2, 4).
void ldmatrix_probe(uint32_t* out, const uint16_t* m, int n, bool trans);

}  // namespace cuda
}  // namespace llmt
