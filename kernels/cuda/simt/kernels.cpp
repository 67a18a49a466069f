// The project's CUDA kernels and backend, compiled by g++ for the SIMT emulator (LLMT_SIMT): the
// same sources nvcc compiles for the GPU.
#include "kernels/cuda/cuda_kernels.cu"
#include "kernels/cuda/cuda_ops.cu"
#include "kernels/cuda/cuda_backend.cu"
#include "kernels/cuda/nccl_comm.cu"
#include "kernels/cuda/mma_probe.cu"
#include "kernels/cuda/flash_attention.cu"
#include "kernels/cuda/cublaslt_matmul.cu"
#include "kernels/cuda/cudnn_attention.cpp"
