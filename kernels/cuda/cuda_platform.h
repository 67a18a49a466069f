// CUDA for the project's kernels: the real toolkit under nvcc, the SIMT emulator (simt/simt.h) when
// LLMT_SIMT is defined. Kernels launch only through LLMT_LAUNCH, declare static shared memory only
// through LLMT_SHARED(type, name, dims) (`LLMT_SHARED(float, tile, [64][65]);`, `LLMT_SHARED(int,
// count, );` for a scalar) and take dynamic shared memory only through LLMT_DYNAMIC_SHARED (over 48 KiB
// allowed first by LLMT_MAX_DYNAMIC_SHARED(kernel, bytes), the kernel spelled as in its LLMT_LAUNCH;
// a cudaError_t), so the same source runs on both (docs/design.md, kernel rules).
#pragma once
#ifdef LLMT_SIMT
#include "kernels/cuda/simt/simt.h"
// The block's own instance, 16-byte aligned, poisoned when first handed out (simt/simt.h).
#define LLMT_SHARED(type, name, dims)                                                                    \
  std::add_lvalue_reference_t<type dims> name = *reinterpret_cast<std::add_pointer_t<type dims>>(        \
      ::llmt::simt::static_shared(                                                                      \
      [] {                                                                                              \
        static const char declaration = 0;                                                              \
        return &declaration;                                                                            \
      }(),                                                                                              \
      sizeof(type dims)))
#define LLMT_MAX_DYNAMIC_SHARED(kernel, bytes) ::llmt::simt::set_max_dynamic_shared(#kernel, (int)(bytes))
#else
#include <cuda_runtime.h>
// kernel<<<grid, block, shared bytes, stream>>>(args...)
#define LLMT_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)
extern __shared__ __align__(16) unsigned char llmt_dynamic_shared[];
#define LLMT_DYNAMIC_SHARED(type) ((type*)llmt_dynamic_shared)
#define LLMT_SHARED(type, name, dims) __shared__ __align__(16) type name dims
#define LLMT_MAX_DYNAMIC_SHARED(kernel, bytes) \
  cudaFuncSetAttribute((kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(bytes))
#endif

// Threads per warp on every NVIDIA GPU llmt targets; kernels use this, never warpSize.
#define WARP_SIZE 32
