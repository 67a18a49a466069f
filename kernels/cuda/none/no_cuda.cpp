// make_cuda_backend for a build without nvcc: --device cuda is a clear error, never a fallback.
#include "engine/core/error.h"
#include "kernels/cuda/cuda_backend.h"

namespace llmt {

std::unique_ptr<Backend> make_cuda_backend(int, DType, bool) {
  fail("--device cuda: this llmt was built without CUDA (no nvcc found when it was configured); install the CUDA "
       "toolkit and rebuild with scripts/setup.sh, or use --device cpu");
}
std::unique_ptr<DataComm> make_nccl_data_comm(ControlComm&, Backend&, double) {
  fail("--ddp_backend nccl: this llmt was built without CUDA; use --device cpu");
}
bool nccl_available() { return false; }
std::string nccl_build_version() { return "none (llmt was built without CUDA)"; }
const char* cuda_build_kind() { return "none"; }
int cuda_device_count() { return 0; }
double cuda_peak_tflops(int, DType, bool) { return 0.0; }
double cuda_peak_bandwidth_gbs(int) { return 0.0; }
std::string cuda_attention_kernels(DType, int, bool, bool, bool) { return "none (llmt was built without CUDA)"; }
std::string cuda_matmul_kernels() { return "none (llmt was built without CUDA)"; }
std::string cuda_device_description(int device) {
  return strformat("cuda:%d not available (llmt was built without CUDA)", device);
}

}  // namespace llmt
