// The CPU backend (engine/backend/backend.h): oneDNN matmuls, OpenMP across rows, heads or channels.
#pragma once
#include <memory>
#include <string>

#include "engine/backend/backend.h"

namespace llmt {

// threads <= 0 means every core OpenMP reports. compute: f32, or bf16 (mixed precision).
std::unique_ptr<Backend> make_cpu_backend(int threads, DType compute = DType::f32);
// "oneDNN 3.0.0 (cpu isa: avx512_core_amx)": the matmul library and the kernels it picks here.
std::string cpu_library_version();

}  // namespace llmt
