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

namespace llmt {

// The backend on CUDA device `device` (an index among the visible devices), computing in `compute`
// (f32 or bf16); tf32 lets fp32 matmuls use TF32 tensor cores. Throws llmt::Error, naming the
// device, when it is not usable.
std::unique_ptr<Backend> make_cuda_backend(int device, DType compute, bool tf32);

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

}  // namespace llmt
