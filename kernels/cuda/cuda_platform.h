// CUDA for the project's kernels: the real toolkit under nvcc, the SIMT emulator (simt/simt.h) when
// LLMT_SIMT is defined. Kernels launch only through LLMT_LAUNCH and take dynamic shared memory only
// through LLMT_DYNAMIC_SHARED, so the same source runs on both (docs/design.md, kernel rules).
#pragma once
#ifdef LLMT_SIMT
#include "kernels/cuda/simt/simt.h"
#else
#include <cuda_runtime.h>
// kernel<<<grid, block, shared bytes, stream>>>(args...)
#define LLMT_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)
extern __shared__ __align__(16) unsigned char llmt_dynamic_shared[];
#define LLMT_DYNAMIC_SHARED(type) ((type*)llmt_dynamic_shared)
#endif

// Threads per warp on every NVIDIA GPU llmt targets; kernels use this, never warpSize.
#define WARP_SIZE 32
