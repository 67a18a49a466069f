// cuBLASLt's matmul on the CPU for the emulated build (cublaslt_simt.h says what this is for, the
// semantics it implements and what it cannot show).
#include "kernels/cuda/simt/cublaslt_simt.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "engine/core/tensor.h"

struct cublasLtContext {
  int magic = 0x4c74;
};

struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int bias_type = -1;  // -1: D's type, as cuBLASLt's default
  void* aux = nullptr;
  int64_t aux_ld = 0;
  int aux_type = -1;  // -1: D's type
};

struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
};

struct cublasLtMatmulPreferenceOpaque_t {
  size_t max_workspace = 0;
  uint32_t min_alignment[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's default, full alignment
};

namespace {

// Heuristic queries ask quietly (finding no algorithm is an answer there); other calls say why.
thread_local bool t_quiet = false;

cublasStatus_t refuse(cublasStatus_t st, const char* why) {
  if (!t_quiet) std::fprintf(stderr, "cuBLASLt stand-in: %s\n", why);
  return st;
}

bool known_type(int t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }

// The largest power of two up to 256 dividing the address (nullptr: 256, "full alignment").
int alignment_of(const void* p) {
  const uintptr_t u = (uintptr_t)p;
  int a = 256;
  while (u && a > 1 && u % a) a /= 2;
  return a;
}

float load(const void* p, int type, int64_t i) {
  return type == CUDA_R_32F ? ((const float*)p)[i] : llmt::bf16_to_f32(((const uint16_t*)p)[i]);
}

void store(void* p, int type, int64_t i, float v) {
  if (type == CUDA_R_32F) ((float*)p)[i] = v;
  else ((uint16_t*)p)[i] = llmt::f32_to_bf16(v);
}

// GELU's tanh form and its derivative, as cuBLASLt's GELU epilogues compute it.
constexpr float kSqrt2OverPi = 0.7978845608028654f;
float gelu(float x) { return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x))); }
float gelu_grad(float x) {
  const float t = std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
}

// BIAS, GELU_BIAS and GELU_AUX_BIAS carry BIAS's bit; no other epilogue the stand-in takes does
bool has_bias(cublasLtEpilogue_t e) { return (e & CUBLASLT_EPILOGUE_BIAS) != 0; }
bool writes_aux(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool applies_gelu(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS || writes_aux(e);
}

// Whether the descriptor and layouts describe a product the documentation allows; m, n, k out.
cublasStatus_t check(const cublasLtMatmulDescOpaque_t* desc, const cublasLtMatrixLayoutOpaque_t* a,
                     const cublasLtMatrixLayoutOpaque_t* b, const cublasLtMatrixLayoutOpaque_t* c,
                     const cublasLtMatrixLayoutOpaque_t* d, uint64_t* m, uint64_t* n, uint64_t* k) {
  if (!desc || !a || !b || !c || !d) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "a descriptor or layout is null");
  const bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;
  *m = ta ? a->cols : a->rows;
  *k = ta ? a->rows : a->cols;
  const uint64_t kb = tb ? b->cols : b->rows;
  *n = tb ? b->rows : b->cols;
  if (kb != *k) return refuse(CUBLAS_STATUS_INVALID_VALUE, "op(A)'s columns differ from op(B)'s rows");
  if (c->rows != *m || c->cols != *n || d->rows != *m || d->cols != *n)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "C or D is not op(A)'s rows x op(B)'s columns");
  if (c->type != d->type || c->ld != d->ld) return refuse(CUBLAS_STATUS_INVALID_VALUE, "C and D differ in type or ld");
  if (a->type != b->type) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "A and B differ in type");
  for (const auto* l : {a, b, c})
    if (l->ld < (int64_t)l->rows || l->ld < 1) return refuse(CUBLAS_STATUS_INVALID_VALUE, "a leading dimension is below its rows");
  const cublasLtEpilogue_t e = desc->epilogue;
  if (e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_BIAS && e != CUBLASLT_EPILOGUE_GELU &&
      e != CUBLASLT_EPILOGUE_GELU_BIAS && e != CUBLASLT_EPILOGUE_GELU_AUX && e != CUBLASLT_EPILOGUE_GELU_AUX_BIAS &&
      e != CUBLASLT_EPILOGUE_DGELU)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "an epilogue the stand-in does not implement");
  if (writes_aux(e) || e == CUBLASLT_EPILOGUE_DGELU) {
    if (desc->aux_ld % 8 != 0 || desc->aux_ld < (int64_t)*m)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "EPILOGUE_AUX_LD must be a multiple of 8 and at least D's rows");
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an unsupported value or parameter was passed to the function";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
  }
  return "unknown status";
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
  if (scale != CUDA_R_32F) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "the scale type must be CUDA_R_32F");
  *desc = new cublasLtMatmulDescOpaque_t;
  (*desc)->compute = compute;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t bytes) {
  if (!desc || !buf) return refuse(CUBLAS_STATUS_INVALID_VALUE, "SetAttribute: a null descriptor or buffer");
  auto take = [&](void* field, size_t size) {
    if (bytes != size) return refuse(CUBLAS_STATUS_INVALID_VALUE, "SetAttribute: the size does not match the attribute");
    std::memcpy(field, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  };
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return take(&desc->trans_a, sizeof(desc->trans_a));
    case CUBLASLT_MATMUL_DESC_TRANSB: return take(&desc->trans_b, sizeof(desc->trans_b));
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return take(&desc->epilogue, sizeof(desc->epilogue));
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return take(&desc->bias, sizeof(desc->bias));
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return take(&desc->bias_type, sizeof(desc->bias_type));
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return take(&desc->aux, sizeof(desc->aux));
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return take(&desc->aux_ld, sizeof(desc->aux_ld));
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return take(&desc->aux_type, sizeof(desc->aux_type));
  }
  return refuse(CUBLAS_STATUS_INVALID_VALUE, "SetAttribute: an attribute the stand-in does not know");
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (!known_type(type)) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "a matrix type other than f32 and bf16");
  *layout = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = new cublasLtMatmulPreferenceOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t bytes) {
  if (!pref || !buf) return refuse(CUBLAS_STATUS_INVALID_VALUE, "PreferenceSetAttribute: a null preference or buffer");
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
    if (bytes != sizeof(uint64_t)) return refuse(CUBLAS_STATUS_INVALID_VALUE, "MAX_WORKSPACE_BYTES is a uint64_t");
    std::memcpy(&pref->max_workspace, buf, bytes);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (bytes != sizeof(uint32_t)) return refuse(CUBLAS_STATUS_INVALID_VALUE, "an alignment is a uint32_t");
  const int which = attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES   ? 0
                    : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES ? 1
                    : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES ? 2
                    : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES ? 3
                                                                         : -1;
  if (which < 0) return refuse(CUBLAS_STATUS_INVALID_VALUE, "PreferenceSetAttribute: an attribute the stand-in lacks");
  std::memcpy(&pref->min_alignment[which], buf, bytes);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  if (!handle || !pref || requested < 1 || !results || !returned)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "AlgoGetHeuristic: bad arguments");
  *returned = 0;
  uint64_t m, n, k;
  t_quiet = true;
  const cublasStatus_t st = check(desc, a, b, c, d, &m, &n, &k);
  t_quiet = false;
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  std::memset(&results[0], 0, sizeof(results[0]));
  // The algorithm assumes the alignments it was asked for: A-D from the preference, the bias and aux
  // buffers from their pointers' values in the descriptor (cublasLt.h: the search reads those
  // pointers for their alignment; unset, full alignment). A kernel needs at most 16 bytes of it.
  for (int i = 0; i < 4; i++) results[0].algo.data[i] = std::min<uint32_t>(pref->min_alignment[i], 16);
  results[0].algo.data[4] = std::min(alignment_of(desc->bias), 16);
  results[0].algo.data[5] = std::min(alignment_of(desc->aux), 16);
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta,
                              const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                              cudaStream_t) {
  (void)workspace;
  (void)workspace_bytes;
  if (!handle || !alpha || !beta || !A || !B || !D || !algo) return refuse(CUBLAS_STATUS_INVALID_VALUE, "Matmul: a null argument");
  uint64_t m, n, k;
  const cublasStatus_t st = check(desc, a, b, c, d, &m, &n, &k);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const float al = *(const float*)alpha, be = *(const float*)beta;
  if (be != 0.0f && !C) return refuse(CUBLAS_STATUS_INVALID_VALUE, "Matmul: beta != 0 with no C");
  const cublasLtEpilogue_t e = desc->epilogue;
  const bool bias = has_bias(e), aux_out = writes_aux(e), gelu_out = applies_gelu(e), dgelu = e == CUBLASLT_EPILOGUE_DGELU;
  if (bias && !desc->bias) return refuse(CUBLAS_STATUS_INVALID_VALUE, "Matmul: a bias epilogue with no BIAS_POINTER");
  if ((aux_out || dgelu) && !desc->aux) return refuse(CUBLAS_STATUS_INVALID_VALUE, "Matmul: a GELU aux epilogue with no AUX_POINTER");
  // the pointers must be as aligned as the algorithm assumed (cuBLASLt's kernels use vector loads):
  // on a GPU a misaligned one fails the launch rather than falling back to a slower algorithm
  const void* given[6] = {A, B, C ? C : D, D, bias ? desc->bias : nullptr, aux_out || dgelu ? desc->aux : nullptr};
  const char* names[6] = {"A", "B", "C", "D", "the bias", "the GELU aux buffer"};
  for (int i = 0; i < 6; i++)
    if (given[i] && (uint64_t)alignment_of(given[i]) < algo->data[i]) {
      char why[200];
      std::snprintf(why, sizeof(why), "Matmul: %s at %p is %d-byte aligned; the algorithm was chosen for %d (set its "
                    "pointer or alignment before the heuristic)", names[i], given[i], alignment_of(given[i]),
                    (int)algo->data[i]);
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, why);
    }
  const int bias_type = desc->bias_type >= 0 ? desc->bias_type : d->type;
  const int aux_type = desc->aux_type >= 0 ? desc->aux_type : d->type;
  if (!known_type(bias_type) || !known_type(aux_type)) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "Matmul: a bias or aux type other than f32 and bf16");
  const bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;
  const int64_t lda = a->ld, ldb = b->ld, ldd = d->ld;

  llmt::simt::HostAccess open;
#pragma omp parallel
  {
  llmt::simt::HostAccess open_here;  // each thread's own, under protection keys (simt.h)
#pragma omp for schedule(static)
  for (int64_t j = 0; j < (int64_t)n; j++) {
    for (int64_t i = 0; i < (int64_t)m; i++) {
      float acc = 0.0f;
      for (int64_t l = 0; l < (int64_t)k; l++) {
        const float x = load(A, a->type, ta ? l + i * lda : i + l * lda);  // op(A)[i, l]
        const float y = load(B, b->type, tb ? j + l * ldb : l + j * ldb);  // op(B)[l, j]
        acc += x * y;
      }
      const int64_t at = i + j * ldd;
      float v = al * acc;
      if (be != 0.0f) v += be * load(C, c->type, at);
      if (bias) v += load(desc->bias, bias_type, i);
      if (aux_out) store(desc->aux, aux_type, i + j * desc->aux_ld, v);
      if (gelu_out) v = gelu(v);
      if (dgelu) v *= gelu_grad(load(desc->aux, aux_type, i + j * desc->aux_ld));
      store(D, d->type, at, v);
    }
  }
  }
  return CUBLAS_STATUS_SUCCESS;
}
