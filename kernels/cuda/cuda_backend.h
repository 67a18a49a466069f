// The CUDA backend: the Backend interface (engine/backend/backend.h) on one GPU. A plain C++ header,
// the one file of kernels/cuda that code outside it includes (train/ makes the backend for
// --device cuda).
//
// Which implementation a program gets is decided when it is linked: llmt_cuda (nvcc, a real GPU),
// llmt_cuda_simt (the same sources on the SIMT emulator, for tests), or llmt_cuda_none (a build
// without nvcc, where make_cuda_backend is a clear error).
#pragma once
#include <memory>
#include <string>

#include "engine/backend/backend.h"
#include "engine/dist/communicator.h"

namespace llmt {

// The backend on CUDA device `device` (an index among the visible devices), computing in `compute`
// (f32 or bf16); tf32 lets fp32 matmuls use TF32 tensor cores. Throws llmt::Error, naming the
// device, when it is not usable.
std::unique_ptr<Backend> make_cuda_backend(int device, DType compute, bool tf32);

// A DataComm over NCCL on `be`'s device (be: made by make_cuda_backend): the unique id from rank 0
// of `world`, broadcast over it (MPI); a nonblocking init polled within timeout_s (--ddp_timeout);
// collectives on a communication stream ordered after be's compute stream by events; every
// collective and the communicator's asynchronous errors watched by the watchdog
// (engine/dist/watchdog.h). Collective over `world`. In the emulated build NCCL is a CPU stand-in
// over MPI (simt/nccl_simt.h); a build without NCCL throws, naming --ddp_backend mpi.
std::unique_ptr<DataComm> make_nccl_data_comm(ControlComm& world, Backend& be, double timeout_s);
bool nccl_available();  // false: make_nccl_data_comm throws (a build without NCCL)
// The NCCL this program runs with: "2.28.9", "(the emulated build's stand-in over MPI)", or "none (...)".
std::string nccl_build_version();

// What --device cuda runs on in this program: "gpu", "simt" (the emulator) or "none".
const char* cuda_build_kind();

// The number of CUDA devices this program can use (0 without a driver, a device, or CUDA in the
// build) and one line about device `device` for the layout and netcheck. Never throw.
int cuda_device_count();
std::string cuda_device_description(int device = 0);

// Device `device`'s peak dense matmul throughput in TFLOP/s for `compute` (bf16: tensor cores with
// fp32 accumulation; f32: the CUDA cores, or TF32 tensor cores with tf32), for MFU: the published
// figure for the GPUs llmt targets, found by name, else SMs x clock x the architecture's rate per SM
// per clock. 0 when unknown (an unlisted architecture, the emulator, no device). Never throws.
double cuda_peak_tflops(int device, DType compute, bool tf32);
double cuda_peak_bandwidth_gbs(int device);  // the datasheet's memory bandwidth, GB/s; 0 where unknown

// Which attention kernels the CUDA backend runs for `compute`, head size `head_size`, with or without
// attention dropout, packed documents and an attention soft cap, for the layout line and llmt bench:
// "cuDNN 9.19.0 (frontend 1.32.0), deterministic backward", "flash (tensor cores, forward and
// backward)" or "plain", and in
// parentheses what was not used and why (LLMT_ATTENTION, kernels/cuda/flash_attention.h). Throws for a
// bad LLMT_ATTENTION.
std::string cuda_attention_kernels(DType compute, int head_size, bool dropout = false, bool packed = false,
                                   bool softcap = false);

// The tensor-core attention backward (kernels/cuda/flash_attention.cu) splits each kv head's key
// tiles of 64 over `splits` blocks, each adding its part of dQ into f32 partial sums of its own that
// a second kernel then adds in split order: ceil(256 / (B * kv heads)) splits, at most the tiles. A
// function of the shape alone, so the order of additions, and the result, is the same on every GPU.
inline int cuda_flash_backward_splits(int B, int T, int NKV) {
  const int tiles = (T + 63) / 64, per = B * NKV;
  const int s = per > 0 ? (256 + per - 1) / per : 1;
  return s < 1 ? 1 : s > tiles ? tiles : s;
}
// Device scratch the CUDA backend's attention backward holds for a micro-batch, bytes: D = rowsum(dO
// O) (f32, B T NH), and in bf16 at head size 64 or 128 the tensor-core kernel's partial sums of dQ
// (f32, splits x B T NH hs). `llmt plan` counts it for a GPU.
inline size_t cuda_attention_scratch_bytes(int B, int T, int NH, int NKV, int hs, DType compute) {
  size_t bytes = (size_t)B * T * NH * sizeof(float);
  if (compute == DType::bf16 && (hs == 64 || hs == 128))
    bytes += (size_t)cuda_flash_backward_splits(B, T, NKV) * B * T * NH * hs * sizeof(float);
  return bytes;
}
// Which matmul the CUDA backend runs (LLMT_MATMUL), for the layout line: cuBLASLt with the bias and
// GPT-2's GELU in its epilogues, its CPU stand-in under the emulator, or the plain kernel. Throws for
// a bad LLMT_MATMUL.
std::string cuda_matmul_kernels();

}  // namespace llmt
