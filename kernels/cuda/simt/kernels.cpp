// The project's CUDA kernels, compiled by g++ for the SIMT emulator (LLMT_SIMT): the same source
// nvcc compiles for the GPU.
#include "kernels/cuda/cuda_kernels.cu"
