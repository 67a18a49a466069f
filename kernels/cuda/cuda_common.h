// Error checks for CUDA runtime and cuBLAS(Lt) calls, for use inside kernels/cuda only (it includes
// the CUDA headers, or the SIMT emulator's; code outside kernels/cuda includes cuda_kernels.h).
//
//   CUDA_CHECK(cudaMalloc(&p, bytes));
//   CUBLAS_CHECK(cublasLtMatmul(...));
//
// A failure throws llmt::Error naming the call, file:line, and the CUDA error name and string.
#pragma once
#include <atomic>
#include <cstdint>

#include "engine/core/error.h"
#include "kernels/cuda/cuda_platform.h"
#ifdef LLMT_SIMT
#include "kernels/cuda/simt/cublaslt_simt.h"
#else
#include <cublasLt.h>
#endif

namespace llmt {
namespace cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  throw Error(strformat("CUDA error %s (%d) at %s:%d in %s: %s", cudaGetErrorName(err), (int)err, file, line, call,
                        cudaGetErrorString(err)));
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line) {
  throw Error(strformat("cuBLAS error %s (%d) at %s:%d in %s: %s", cublasLtGetStatusName(st), (int)st, file, line,
                        call, cublasLtGetStatusString(st)));
}

// Kernel launches in this process so far: CUDA_CHECK_LAUNCH counts one after every launch, a
// cuBLASLt matmul or a cuDNN graph counts one (the CUDA backend's launches counter, llmt bench).
inline std::atomic<int64_t>& launch_count() {
  static std::atomic<int64_t> n{0};
  return n;
}

}  // namespace cuda
}  // namespace llmt

#define CUDA_CHECK(call)                                                                  \
  do {                                                                                    \
    cudaError_t llmt_cuda_err_ = (call);                                                  \
    if (llmt_cuda_err_ != cudaSuccess) {                                                  \
      (void)cudaGetLastError(); /* clear a non-sticky error so later calls start clean */ \
      ::llmt::cuda::throw_cuda_error(llmt_cuda_err_, #call, __FILE__, __LINE__);          \
    }                                                                                     \
  } while (0)

#define CUBLAS_CHECK(call)                                                        \
  do {                                                                            \
    cublasStatus_t llmt_cublas_st_ = (call);                                      \
    if (llmt_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                 \
      ::llmt::cuda::throw_cublas_error(llmt_cublas_st_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: counts it, and catches bad launch configurations (not asynchronous faults
// inside the kernel).
#define CUDA_CHECK_LAUNCH()                                               \
  do {                                                                    \
    ::llmt::cuda::launch_count().fetch_add(1, std::memory_order_relaxed); \
    CUDA_CHECK(cudaGetLastError());                                       \
  } while (0)
