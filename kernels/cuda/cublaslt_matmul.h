// The CUDA backend's matmul on a GPU: cuBLASLt, with the bias, accumulation and GELU (forward with
// its input kept, or backward) in its epilogue, and one heuristic query per shape (cached). Same
// contract as Backend::matmul (engine/backend/backend.h) on device pointers; the plain kernel
// (cuda_ops.h) is its reference. In the emulated build it calls the cuBLASLt stand-in
// (simt/cublaslt_simt.h), selected there by LLMT_MATMUL=cublaslt.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

#include "engine/core/tensor.h"
#include "kernels/cuda/cuda_kernels.h"

struct cublasLtContext;

namespace llmt {
namespace cuda {

// What cuBLASLt's epilogue does after the product (and the bias, when one is given).
enum class LtEpilogue {
  none,
  gelu_aux,  // aux = the sum (GELU's input), out = gelu(aux): GELU_AUX(_BIAS)
  dgelu,     // out = the product * gelu'(aux), aux read: DGELU
};

class LtMatmul {
 public:
  // tf32: fp32 operands multiply on TF32 tensor cores (fp32 accumulation).
  explicit LtMatmul(bool tf32);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // out[M,N] (= or +=) op(a) op(b) + bias[N]; ab_type is a's and b's (and bias's) dtype, out_type
  // out's (f32 or bf16), both as in Backend::matmul. With accumulate and c != nullptr, what is added
  // is c [M, N] (out_type, not overlapping out) instead of out's own values: out = c + op(a) op(b) + bias.
  // ld_a, ld_out: a's and out's row strides (0: dense), as in Backend::matmul.
  void run(void* out, const void* a, const void* b, const void* bias, int64_t M, int64_t N, int64_t K, bool trans_a,
           bool trans_b, bool accumulate, DType ab_type, DType out_type, Stream stream, const void* c = nullptr,
           int64_t ld_a = 0, int64_t ld_out = 0);

  // The same with a GELU epilogue; aux is [M, N] row-major in out_type. Returns false, having done
  // nothing, when cuBLASLt has no algorithm for the epilogue at this shape (the answer is cached):
  // the caller then runs the product and the activation apart.
  bool run_epilogue(LtEpilogue epilogue, void* out, void* aux, const void* a, const void* b, const void* bias,
                    int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, DType ab_type, DType out_type,
                    Stream stream);

 private:
  struct Plan;  // the descriptors and chosen algorithm of one shape
  // M, N, K, trans_a, trans_b, accumulate, has bias, ab dtype, out dtype, alignment, epilogue, ld_a, ld_out
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, bool, bool, int, int, int, int, int64_t, int64_t>;
  Plan* plan_for(const Key& key);  // nullptr: no algorithm for an epilogue (none: an error)
  void launch(Plan& p, void* out, void* aux, const void* a, const void* b, const void* bias, bool accumulate,
              Stream stream, const void* c = nullptr);

  cublasLtContext* handle_ = nullptr;
  bool tf32_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan*> plans_;
};

}  // namespace cuda
}  // namespace llmt
