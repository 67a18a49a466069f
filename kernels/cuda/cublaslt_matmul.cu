// cuBLASLt for the CUDA backend's matmul (cublaslt_matmul.h).
//
// cuBLASLt is column-major; llmt's tensors are row-major. A row-major [R, C] matrix is a column-major
// [C, R] one with the same memory, so out = op(a) op(b) (row-major [M, N]) is computed as the
// column-major product out^T [N, M] = op(b)^T [N, K] x op(a)^T [K, M], whose operands are b and a as
// stored, transposed or not as trans_b and trans_a say. The bias runs along out^T's rows (N), which
// is what CUBLASLT_EPILOGUE_BIAS adds; accumulate is beta = 1 on C = D = out, or on C = a residual
// and D = out (matmul_residual: one pass instead of a copy and an accumulation). A GELU epilogue's aux
// matrix has out's shape, so its leading dimension is N too.
//
// In the emulated build the same code calls the cuBLASLt stand-in (simt/cublaslt_simt.h).
#include "kernels/cuda/cublaslt_matmul.h"

#ifdef LLMT_SIMT
#include "kernels/cuda/simt/cublaslt_simt.h"
#else
#include <cublasLt.h>
#endif

#include <algorithm>
#include <memory>

#include "engine/core/error.h"
#include "kernels/cuda/cuda_common.h"

namespace llmt {
namespace cuda {

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLASLt's recommendation for Hopper

cudaDataType_t cuda_type(DType t) {
  LLMT_CHECK(t == DType::f32 || t == DType::bf16, "cublasLt matmul: %s operands are not supported", dtype_name(t));
  return t == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
}

// The largest power of two up to 16 that divides the address (nullptr: 16).
int alignment(const void* p) {
  const uintptr_t u = (uintptr_t)p;
  int a = 16;
  while (a > 1 && u % a) a /= 2;
  return a;
}

}  // namespace

struct LtMatmul::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // a: op(b)^T's storage, b: op(a)^T's
  cublasLtMatmulAlgo_t algo;
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

LtMatmul::LtMatmul(bool tf32) : tf32_(tf32) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
  workspace_ = device_alloc(kWorkspaceBytes);
  workspace_bytes_ = kWorkspaceBytes;
}

LtMatmul::~LtMatmul() {
  for (auto& [key, plan] : plans_) delete plan;
  device_free(workspace_);
  cublasLtDestroy(handle_);
}

LtMatmul::Plan* LtMatmul::plan_for(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  const auto [M, N, K, trans_a, trans_b, accumulate, has_bias, ab, out, align, epilogue, ld_a, ld_out] = key;
  (void)accumulate;
  const cudaDataType_t ab_t = cuda_type((DType)ab), out_t = cuda_type((DType)out);
  auto plan = std::make_unique<Plan>();
  const cublasComputeType_t compute =
      (DType)ab == DType::f32 && tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F));
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  cublasLtEpilogue_t epi = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if ((LtEpilogue)epilogue == LtEpilogue::gelu_aux) epi = has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  if ((LtEpilogue)epilogue == LtEpilogue::dgelu) epi = CUBLASLT_EPILOGUE_DGELU;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (has_bias)
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ab_t, sizeof(ab_t)));
  if ((LtEpilogue)epilogue != LtEpilogue::none) {  // aux: out's shape and type, row-major [M, N]
    const int64_t aux_ld = N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                sizeof(aux_ld)));
  }
  // stored shapes, column-major: b is [N, K] (or [K, N] transposed), a is [K, M] (or [M, K])
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, ab_t, trans_b ? K : N, trans_b ? N : K, trans_b ? K : N));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, ab_t, trans_a ? M : K, trans_a ? K : M, ld_a));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, out_t, N, M, ld_out));

  // The search reads the bias and aux pointers for their alignment (cublasLt.h), and one left unset
  // counts as fully aligned: the algorithm it then picks fails at launch on a misaligned buffer. Every
  // call through this plan has each pointer at least `align`-aligned (the key), so the search is shown
  // addresses of exactly that alignment; launch() sets the real ones.
  const void* at_align = reinterpret_cast<const void*>((uintptr_t)align);
  if (has_bias)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &at_align,
                                                sizeof(at_align)));
  if ((LtEpilogue)epilogue != LtEpilogue::none)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &at_align,
                                                sizeof(at_align)));
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint32_t al = (uint32_t)align;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                    sizeof(workspace_bytes_)));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al)));
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->c, plan->c, pref, 1,
                                                     &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if ((LtEpilogue)epilogue != LtEpilogue::none && (st != CUBLAS_STATUS_SUCCESS || found == 0)) {
    plans_.emplace(key, nullptr);  // the caller runs the product and the activation apart
    return nullptr;
  }
  LLMT_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0,
             "cublasLt matmul: no algorithm for %lld x %lld x %lld (%s x %s -> %s, trans %d %d, alignment %d): %s",
             (long long)M, (long long)N, (long long)K, dtype_name((DType)ab), dtype_name((DType)ab),
             dtype_name((DType)out), (int)trans_a, (int)trans_b, align, cublasLtGetStatusString(st));
  plan->algo = result.algo;
  Plan* p = plan.release();
  plans_.emplace(key, p);
  return p;
}

void LtMatmul::run(void* out, const void* a, const void* b, const void* bias, int64_t M, int64_t N, int64_t K,
                   bool trans_a, bool trans_b, bool accumulate, DType ab_type, DType out_type, Stream stream,
                   const void* c, int64_t ld_a, int64_t ld_out) {
  const int align = std::min({alignment(a), alignment(b), alignment(out), alignment(bias), alignment(c)});
  Key key{M, N, K, trans_a, trans_b, accumulate, bias != nullptr, (int)ab_type, (int)out_type, align,
          (int)LtEpilogue::none, ld_a ? ld_a : (trans_a ? M : K), ld_out ? ld_out : N};
  launch(*plan_for(key), out, nullptr, a, b, bias, accumulate, stream, c);
}

bool LtMatmul::run_epilogue(LtEpilogue epilogue, void* out, void* aux, const void* a, const void* b, const void* bias,
                            int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, DType ab_type,
                            DType out_type, Stream stream) {
  const int align = std::min({alignment(a), alignment(b), alignment(out), alignment(bias), alignment(aux)});
  Key key{M, N, K, trans_a, trans_b, false, bias != nullptr, (int)ab_type, (int)out_type, align, (int)epilogue,
          trans_a ? M : K, N};
  Plan* p = plan_for(key);
  if (!p) return false;
  launch(*p, out, aux, a, b, bias, false, stream);
  return true;
}

void LtMatmul::launch(Plan& p, void* out, void* aux, const void* a, const void* b, const void* bias, bool accumulate,
                      Stream stream, const void* c) {
  if (bias)  // the pointers are per call
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  if (aux)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  launch_count().fetch_add(1, std::memory_order_relaxed);  // one launch, whatever cuBLASLt runs inside
  CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, b, p.a, a, p.b, &beta, c ? c : out, p.c, out, p.c, &p.algo,
                              workspace_, workspace_bytes_, stream));
}

}  // namespace cuda
}  // namespace llmt
