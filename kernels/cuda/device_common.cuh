// What the project's .cu files share: element access (fp32 math, bf16 as uint16_t bits rounded
// exactly as llmt::f32_to_bf16), 16-byte vector moves, launch configuration. Included by .cu files
// only (nvcc, or g++ for the SIMT emulator).
#pragma once
#include <atomic>
#include <cstdint>

#include "kernels/cuda/cuda_common.h"

namespace llmt {
namespace cuda {
namespace {

// ---------------------------------------------------------------------------------------------------
// element access

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// Round to nearest even, NaN kept quiet: the device twin of llmt::f32_to_bf16.
__device__ __forceinline__ uint16_t bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

// Two floats rounded to bf16 (nearest even) in one register, `lo` in the low half: one
// cvt.rn.bf16x2.f32 on a GPU. A NaN becomes the canonical 0x7fff there (bf16_bits keeps its payload),
// so this is for values that are never NaN (attention's probabilities and their gradients).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (uint32_t)bf16_bits(lo) | (uint32_t)bf16_bits(hi) << 16;
#endif
}

// 2^x, one MUFU.EX2 on a GPU (ex2.approx.ftz: about 2 ulp, 2^-inf = 0); exp2f under the emulator.
__device__ __forceinline__ float fast_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ uint16_t from_f32<uint16_t>(float x) { return bf16_bits(x); }

template <typename T, int V>
__device__ __forceinline__ Vec<T, V> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, V>*>(p);
}
template <typename T, int V>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, V>& x) {
  *reinterpret_cast<Vec<T, V>*>(p) = x;
}

// ---------------------------------------------------------------------------------------------------
// launch configuration

constexpr int kBlock = 256;

inline bool aligned(const void* p, size_t bytes) { return p == nullptr || ((uintptr_t)p % bytes) == 0; }

inline int sm_count() {
  static std::atomic<int> cached[64];
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  int n = dev < 64 ? cached[dev].load(std::memory_order_relaxed) : 0;
  if (n == 0) {
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    if (dev < 64) cached[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

// Blocks for `work` grid-stride items: enough to cover them, at most a few full waves.
inline unsigned grid_for(int64_t work) {
  int64_t blocks = (work + kBlock - 1) / kBlock;
  int64_t cap = (int64_t)sm_count() * (2048 / kBlock) * 4;
  if (blocks > cap) blocks = cap;
  return (unsigned)(blocks < 1 ? 1 : blocks);
}

inline void check_n(int64_t n, const char* op) { LLMT_CHECK(n >= 0, "cuda %s: negative element count %lld", op, (long long)n); }

}  // namespace
}  // namespace cuda
}  // namespace llmt
