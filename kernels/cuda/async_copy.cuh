// Asynchronous copies from global to shared memory (cp.async, sm_80 and later), behind device
// functions of our own as the tensor-core operations are (mma.cuh): one PTX instruction each under
// nvcc; under the SIMT emulator the copy is recorded when issued, its destination holds the block's
// poison until a wait covers its group, and it lands then (simt/simt.h), so a read that comes before
// the wait and the barrier after it sees poison in a test.
//
//   cp_async_16(dst, src, valid)   16 bytes, src and dst 16-byte aligned; zeros instead when !valid
//                                  (src must still point into the allocation: it is not read)
//   cp_async_commit()              a group of the copies this thread issued since the last commit
//   cp_async_wait<N>()             until at most the N most recent groups are in flight; then a
//                                  __syncthreads shows the data to the block's other threads
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_platform.h"

namespace llmt {
namespace cuda {

#ifdef LLMT_SIMT

__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  ::llmt::simt::cp_async(dst, src, 16, valid ? 16 : 0);
}
__device__ __forceinline__ void cp_async_commit() { ::llmt::simt::cp_async_commit(); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  ::llmt::simt::cp_async_wait(N);
}

#else

__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(dst);
  const int src_bytes = valid ? 16 : 0;  // PTX's src-size: the rest of the 16 bytes are zeros
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif

}  // namespace cuda
}  // namespace llmt
