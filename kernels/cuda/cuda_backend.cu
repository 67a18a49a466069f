// The CUDA backend (cuda_backend.h): every Backend op on the device, in order on one compute stream.
// The ops are the plain kernels of cuda_kernels.cu and cuda_ops.cu; on a GPU, matmuls go through
// cuBLASLt (LLMT_MATMUL=native keeps the plain kernel). The emulator runs the plain kernel unless
// LLMT_MATMUL=cublaslt selects cuBLASLt's CPU stand-in.
//
// Bad input that only a kernel sees (a token id or target outside the vocabulary) is written to an
// error word on the device; the backend reads it whenever it waits for the stream (synchronize,
// copy_to_host) and throws there, naming the op, the value and its position.
#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <tuple>
#include <type_traits>

#include "engine/core/error.h"
#include "engine/core/log.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cublaslt_matmul.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/flash_attention.h"

namespace llmt {
namespace {

using cuda::Stream;

// LLMT_MATMUL: cublaslt (the default on a GPU; the CPU stand-in under the emulator) or native (the
// plain kernel, the emulator's default).
bool uses_cublaslt() {
  const std::string mm = std::getenv("LLMT_MATMUL") ? std::getenv("LLMT_MATMUL") : "";
  LLMT_CHECK(mm.empty() || mm == "cublaslt" || mm == "native", "LLMT_MATMUL=%s: expected cublaslt or native",
             mm.c_str());
#ifdef LLMT_SIMT
  return mm == "cublaslt";
#else
  return mm != "native";
#endif
}

// Which kernels run an attention call. LLMT_ATTENTION (`asked`) names the first choice; a kernel that
// does not take the call passes it to the next (cudnn -> flash -> plain), and `why` says what it did
// not take. Unset, a GPU build takes cuDNN where the library loads; the emulator takes flash (its
// cuDNN is a stand-in, run under LLMT_ATTENTION=cudnn).
enum class AttnKernel { cudnn, flash, plain };
AttnKernel pick_attention(cuda::AttentionImpl asked, DType dt, int hs, bool dropout, bool softcap,
                          std::string* why = nullptr) {
  using cuda::AttentionImpl;
  auto no = [&](const char* kernel, const char* reason) {
    if (why) *why += std::string(why->empty() ? "" : "; ") + kernel + " not used: " + reason;
  };
  if (dt != DType::bf16 || asked == AttentionImpl::plain) return AttnKernel::plain;
  static const bool gpu = std::string(cuda_build_kind()) == "gpu";
  if (asked == AttentionImpl::cudnn || (asked == AttentionImpl::automatic && gpu)) {
    const std::string& missing = cuda::cudnn_attention_unavailable();
    if (!missing.empty()) no("cuDNN", missing.c_str());
    else if (dropout) no("cuDNN", "attention dropout (llmt's masks are not cuDNN's)");
    else if (softcap) no("cuDNN", "the attention soft cap (llmt does not build cuDNN's score modifier)");
    else if (cuda::cudnn_attention_fits(hs)) return AttnKernel::cudnn;
    else if (why) no("cuDNN", strformat("head size %d", hs).c_str());
  }
  if (cuda::flash_attention_fits(hs)) return AttnKernel::flash;
  if (why) no("flash", strformat("head size %d (it takes 64 or 128)", hs).c_str());
  return AttnKernel::plain;
}

// Calls f with a value of the element type that stores `t` (float for f32, uint16_t for bf16).
template <class F>
void by_dtype(DType t, const char* op, F&& f) {
  if (t == DType::f32) f(float{});
  else if (t == DType::bf16) f(uint16_t{});
  else fail("cuda %s: %s tensors are not supported", op, dtype_name(t));
}

class CudaEvent : public Event {
 public:
  explicit CudaEvent(int64_t& host_syncs) : host_syncs_(host_syncs) { CUDA_CHECK(cudaEventCreate(&e_)); }
  ~CudaEvent() override { (void)cudaEventDestroy(e_); }
  void synchronize() override {
    host_syncs_++;
    CUDA_CHECK(cudaEventSynchronize(e_));
  }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
  int64_t& host_syncs_;  // the backend's counter
};

// A device scratch buffer that grows on demand (after the stream has finished with the old one).
struct Scratch {
  void* p = nullptr;
  size_t bytes = 0;
};

class CudaBackend : public Backend {
 public:
  CudaBackend(int device, DType compute, bool tf32) : compute_(compute), device_(device) {
    LLMT_CHECK(compute == DType::f32 || compute == DType::bf16, "cuda backend: compute dtype must be f32 or bf16, got %s",
               dtype_name(compute));
    const int n = cuda_device_count();
    LLMT_CHECK(n > 0, "--device cuda: no usable CUDA device (%s)", cuda_device_description(device).c_str());
    LLMT_CHECK(device >= 0 && device < n, "--device cuda: device %d does not exist (%d visible: check CUDA_VISIBLE_DEVICES)",
               device, n);
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaStreamCreate(&stream_));
    err_ = (int*)cuda::device_alloc(cuda::kErrWords * sizeof(int));
    // The native kernel accumulates in fp32 whatever tf32 says.
    if (uses_cublaslt()) lt_ = std::make_unique<cuda::LtMatmul>(tf32);
    attention_ = cuda::attention_impl();
    const std::string& no_cudnn = cuda::cudnn_attention_unavailable();
    if (attention_ == cuda::AttentionImpl::cudnn && !no_cudnn.empty()) fail("LLMT_ATTENTION=cudnn: %s", no_cudnn.c_str());
  }
  ~CudaBackend() override {
    (void)cudaStreamSynchronize(stream_);
    lt_.reset();
    dnn_.reset();
    for (Scratch* s : {&row_losses_, &attn_d_, &attn_dq_, &partials_, &columns_}) (void)cudaFree(s->p);
    (void)cudaFree(err_);
    (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }

  std::string name() const override { return "cuda"; }
  BackendCounters counters() const override {
    BackendCounters c = counters_;
    c.launches = cuda::launch_count().load() - launches0_;
    return c;
  }
  int threads() const override { return 1; }
  DType compute_dtype() const override { return compute_; }
  bool is_host_memory() const override { return false; }
  int vocab_pad() const override { return kDeviceVocabPad; }
  bool device_memory(size_t* free_bytes, size_t* total_bytes) override {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    return true;
  }
  void* native_stream() override { return stream_; }
  std::unique_ptr<Event> make_event() override { return std::make_unique<CudaEvent>(counters_.host_syncs); }
  void record(Event& e) override { CUDA_CHECK(cudaEventRecord(static_cast<CudaEvent&>(e).get(), stream_)); }
  void wait(Event& e) override { CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<CudaEvent&>(e).get(), 0)); }

  // ---- memory ----
  void* alloc(size_t bytes) override {
    void* p = cuda::device_alloc(std::max<size_t>(bytes, 1));  // zero-filled, 256-byte aligned
    counters_.allocs++;
    counters_.host_syncs++;
    CUDA_CHECK(cudaDeviceSynchronize());  // the fill is done before the stream uses p
    return p;
  }
  void release(void* p) override { cuda::device_free(p); }  // cudaFree waits for work that may use p
  void zero_impl(void* p, size_t bytes) override {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    // From pageable memory the call returns once src has been read: the caller may reuse it.
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    synchronize();
  }
  void copy_impl(void* dst, const void* src, size_t bytes) override {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void synchronize() override {
    counters_.host_syncs++;
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    check_error_word();
  }

  // ---- dense ----
  void matmul_impl(Tensor out, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N, int64_t K, bool trans_a,
                   bool trans_b, bool accumulate, int64_t ld_a, int64_t ld_out) override {
    if (lt_) {
      lt_->run(out.data, a.data, b.data, bias.data, M, N, K, trans_a, trans_b, accumulate, a.dtype, out.dtype, stream_,
               nullptr, ld_a, ld_out);
      return;
    }
    if (compute_ == DType::f32) {
      cuda::matmul<float, float>(out.f32(), a.f32(), b.f32(), bias.data ? bias.f32() : nullptr, M, N, K, trans_a,
                                 trans_b, accumulate, ld_a, ld_out, stream_);
    } else if (out.dtype == DType::f32) {
      cuda::matmul<uint16_t, float>(out.f32(), a.bf16(), b.bf16(), bias.data ? bias.bf16() : nullptr, M, N, K,
                                    trans_a, trans_b, accumulate, ld_a, ld_out, stream_);
    } else {
      cuda::matmul<uint16_t, uint16_t>(out.bf16(), a.bf16(), b.bf16(), bias.data ? bias.bf16() : nullptr, M, N, K,
                                       trans_a, trans_b, accumulate, ld_a, ld_out, stream_);
    }
  }
  // With cuBLASLt, one call that reads the residual as C and writes out as D; else a copy and the
  // matmul accumulating onto it.
  void matmul_residual_impl(Tensor out, Tensor residual, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N,
                            int64_t K) override {
    if (lt_) {
      lt_->run(out.data, a.data, b.data, bias.data, M, N, K, false, true, true, a.dtype, out.dtype, stream_,
               residual.data);
      return;
    }
    copy_impl(out.data, residual.data, (size_t)(M * N) * dtype_size(out.dtype));
    matmul_impl(out, a, b, bias, M, N, K, false, true, true, K, N);
  }
  // With cuBLASLt, one call with the GELU in its epilogue; else (the plain kernels, or a shape
  // cuBLASLt has no epilogue algorithm for) the matmul and the GELU kernel.
  void matmul_gelu_impl(Tensor out, Tensor pre, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N,
                        int64_t K) override {
    if (lt_ && lt_->run_epilogue(cuda::LtEpilogue::gelu_aux, out.data, pre.data, a.data, b.data, bias.data, M, N, K,
                                 false, true, a.dtype, out.dtype, stream_))
      return;
    if (lt_) no_gelu_epilogue("forward", M, N, K);
    matmul_impl(pre, a, b, bias, M, N, K, false, true, false, K, N);
    gelu_forward_impl(out, pre, M * N);
  }
  void matmul_dgelu_impl(Tensor dpre, Tensor dout, Tensor b, Tensor pre, int64_t M, int64_t N, int64_t K) override {
    if (lt_ && lt_->run_epilogue(cuda::LtEpilogue::dgelu, dpre.data, pre.data, dout.data, b.data, nullptr, M, N, K,
                                 false, false, dout.dtype, dpre.dtype, stream_))
      return;
    if (lt_) no_gelu_epilogue("backward", M, N, K);
    matmul_impl(dpre, dout, b, Tensor(), M, N, K, false, false, false, K, N);
    gelu_backward_impl(dpre, pre, dpre, M * N);
  }
  // Once per direction and shape: cuBLASLt had no algorithm with the GELU epilogue.
  void no_gelu_epilogue(const char* direction, int64_t M, int64_t N, int64_t K) {
    if (!gelu_unfused_.insert({direction[0] == 'f', M, N, K}).second) return;
    log_warn("cuBLASLt has no GELU %s epilogue for %lld x %lld x %lld (%s): the matmul and GELU run as two kernels",
             direction, (long long)M, (long long)N, (long long)K,
             N % 8 ? "its aux leading dimension must be a multiple of 8" : "no algorithm found");
  }

  void bias_backward_impl(Tensor dbias, Tensor dout, int64_t M, int64_t N) override {
    by_dtype(dout.dtype, "bias_backward", [&](auto tag) {
      cuda::bias_backward(dbias.f32(), (const decltype(tag)*)dout.data, M, N, columns(M, N), stream_);
    });
  }

  // ---- embeddings ----
  void embedding_forward_impl(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int B, int T, int C, int V) override {
    by_dtype(out.dtype, "embedding_forward", [&](auto tag) {
      using A = decltype(tag);
      cuda::embedding_forward((A*)out.data, tokens.i32(), (const A*)wte.data, (const A*)wpe.data, B, T, C, V, err_,
                              stream_);
    });
  }
  void embedding_backward_impl(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int B, int T, int C) override {
    by_dtype(dout.dtype, "embedding_backward", [&](auto tag) {
      cuda::embedding_backward(dwte.f32(), dwpe.data ? dwpe.f32() : nullptr, (const decltype(tag)*)dout.data,
                               tokens.i32(), B, T, C, (int)dwte.shape[0], err_, stream_);
    });
  }

  // ---- norms ----
  void layernorm_forward_impl(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b, int64_t N, int C,
                              float eps) override {
    by_dtype(x.dtype, "layernorm_forward", [&](auto tag) {
      using A = decltype(tag);
      cuda::layernorm_forward((A*)out.data, mean.f32(), rstd.f32(), (const A*)x.data, (const A*)w.data,
                              (const A*)b.data, N, C, eps, stream_);
    });
  }
  void layernorm_backward_impl(Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w, Tensor mean,
                               Tensor rstd, int64_t N, int C) override {
    by_dtype(x.dtype, "layernorm_backward", [&](auto tag) {
      using A = decltype(tag);
      cuda::layernorm_backward((A*)dx.data, dw.f32(), db.f32(), (const A*)dout.data, (const A*)x.data,
                               (const A*)w.data, mean.f32(), rstd.f32(), N, C, columns(N, C), stream_);
    });
  }
  void rmsnorm_forward_impl(Tensor out, Tensor rstd, Tensor x, Tensor w, int64_t N, int C, float eps,
                            float w_offset) override {
    by_dtype(x.dtype, "rmsnorm_forward", [&](auto tag) {
      using A = decltype(tag);
      cuda::rmsnorm_forward((A*)out.data, rstd.f32(), (const A*)x.data, (const A*)w.data, N, C, eps, w_offset,
                            stream_);
    });
  }
  void rmsnorm_backward_impl(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, int64_t N,
                             int C, float w_offset) override {
    by_dtype(x.dtype, "rmsnorm_backward", [&](auto tag) {
      using A = decltype(tag);
      cuda::rmsnorm_backward((A*)dx.data, dw.f32(), (const A*)dout.data, (const A*)x.data, (const A*)w.data,
                             rstd.f32(), N, C, w_offset, columns(N, C), stream_);
    });
  }

  void head_rmsnorm_forward_impl(Tensor out, Tensor rstd, Tensor in, Tensor wq, Tensor wk, int64_t N, int NH, int NKV,
                                 int hs, float eps, float w_offset) override {
    by_dtype(in.dtype, "head_rmsnorm_forward", [&](auto tag) {
      using A = decltype(tag);
      cuda::head_rmsnorm_forward((A*)out.data, rstd.f32(), (const A*)in.data, (const A*)wq.data, (const A*)wk.data, N,
                                 NH, NKV, hs, eps, w_offset, stream_);
    });
  }
  void head_rmsnorm_backward_impl(Tensor din, Tensor dwq, Tensor dwk, Tensor dout, Tensor in, Tensor wq, Tensor wk,
                                  Tensor rstd, int64_t N, int NH, int NKV, int hs, float w_offset) override {
    by_dtype(in.dtype, "head_rmsnorm_backward", [&](auto tag) {
      using A = decltype(tag);
      cuda::head_rmsnorm_backward((A*)din.data, dwq.f32(), dwk.f32(), (const A*)dout.data, (const A*)in.data,
                                  (const A*)wq.data, (const A*)wk.data, rstd.f32(), N, NH, NKV, hs, w_offset,
                                  columns(N, hs), stream_);
    });
  }

  // ---- activations ----
  void gelu_forward_impl(Tensor out, Tensor x, int64_t n) override {
    if (compute_ == DType::f32) cuda::gelu_forward_f32(out.f32(), x.f32(), n, stream_);
    else cuda::gelu_forward_bf16(out.bf16(), x.bf16(), n, stream_);
  }
  void gelu_backward_impl(Tensor dx, Tensor x, Tensor dout, int64_t n) override {
    if (compute_ == DType::f32) cuda::gelu_backward_f32(dx.f32(), x.f32(), dout.f32(), n, stream_);
    else cuda::gelu_backward_bf16(dx.bf16(), x.bf16(), dout.bf16(), n, stream_);
  }
  void swiglu_forward_impl(Tensor out, Tensor gate_up, int64_t N, int I, GluAct act) override {
    const bool gelu = act == GluAct::gelu_tanh;
    if (compute_ == DType::f32) cuda::swiglu_forward_f32(out.f32(), gate_up.f32(), N, I, stream_, gelu);
    else cuda::swiglu_forward_bf16(out.bf16(), gate_up.bf16(), N, I, stream_, gelu);
  }
  void swiglu_backward_impl(Tensor dgate_up, Tensor dout, Tensor gate_up, int64_t N, int I, GluAct act) override {
    const bool gelu = act == GluAct::gelu_tanh;
    if (compute_ == DType::f32)
      cuda::swiglu_backward_f32(dgate_up.f32(), dout.f32(), gate_up.f32(), N, I, stream_, gelu);
    else cuda::swiglu_backward_bf16(dgate_up.bf16(), dout.bf16(), gate_up.bf16(), N, I, stream_, gelu);
  }
  void dropout_impl(Tensor x, int B, int T, int C, const Dropout& d) override {
    by_dtype(x.dtype, "dropout", [&](auto tag) { cuda::dropout((decltype(tag)*)x.data, B, T, C, d, stream_); });
  }

  // ---- attention ----
  static const int32_t* i32_or_null(const Tensor& t) { return t.data ? t.i32() : nullptr; }
  void rope_forward_impl(Tensor qkv, int B, int T, int NH, int NKV, int hs, const RopeSpec& rope,
                         Tensor positions) override {
    by_dtype(qkv.dtype, "rope_forward", [&](auto tag) {
      cuda::rope((decltype(tag)*)qkv.data, i32_or_null(positions), B, T, NH, NKV, hs, rope, 1.0f, stream_);
    });
  }
  void rope_backward_impl(Tensor dqkv, int B, int T, int NH, int NKV, int hs, const RopeSpec& rope,
                          Tensor positions) override {
    by_dtype(dqkv.dtype, "rope_backward", [&](auto tag) {
      cuda::rope((decltype(tag)*)dqkv.data, i32_or_null(positions), B, T, NH, NKV, hs, rope, -1.0f, stream_);
    });
  }
  void attention_kv_impl(Tensor out, Tensor k_cache, Tensor v_cache, Tensor qkv, Tensor key_start, int B, int Tn, int p0,
                         int cap, int NH, int NKV, int hs, int window, const AttnScores& scores) override {
    by_dtype(qkv.dtype, "attention_kv", [&](auto tag) {
      using A = decltype(tag);
      cuda::attention_kv((A*)out.data, (A*)k_cache.data, (A*)v_cache.data, (const A*)qkv.data, key_start.i32(), B, Tn, p0,
                         cap, NH, NKV, hs, window, scores.scale, scores.softcap, stream_);
    });
  }
  cuda::CudnnAttention& cudnn() {
    if (!dnn_) dnn_ = std::make_unique<cuda::CudnnAttention>();
    return *dnn_;
  }
  // The kernel for this call; an explicit LLMT_ATTENTION that does not take it says so once.
  AttnKernel attention_kernel(DType dt, int hs, const Dropout& drop, bool softcap, bool packed, int B, int T, int NH,
                              int NKV) {
    // the reasons are words only while a warning may still be given: nothing is built on every call
    const bool may_warn = attention_ != cuda::AttentionImpl::automatic && !attention_warned_;
    std::string why;
    AttnKernel k = pick_attention(attention_, dt, hs, drop.active(), softcap, may_warn ? &why : nullptr);
    if (!why.empty()) {
      attention_warned_ = true;
      log_warn("LLMT_ATTENTION=%s: %s", cuda::attention_impl_name(attention_), why.c_str());
    }
    if (k == AttnKernel::cudnn && packed && !cuda::cudnn_attention_packs(B, T, NH, NKV, hs)) {
      if (!packed_warned_)
        log_warn("cuDNN attention: %d rows of %d tokens of %d values are past its int32 ragged offsets; packed "
                 "documents run llmt's own kernel", B, T, (NH + 2 * NKV) * hs);
      packed_warned_ = true;
      k = AttnKernel::flash;
    }
    return k;
  }
  void attention_forward_impl(Tensor out, Tensor lse, Tensor qkv, int B, int T, int NH, int NKV, int hs,
                              const Dropout& drop, const PackedDocs& docs, int window,
                              const AttnScores& scores) override {
    const int32_t* doc = i32_or_null(docs.start);
    const AttnKernel k = attention_kernel(qkv.dtype, hs, drop, scores.capped(), doc != nullptr, B, T, NH, NKV);
    // cuDNN without an engine for this shape (it warned, naming it) passes the call on
    if (k == AttnKernel::cudnn && cudnn().forward(out.bf16(), lse.f32(), qkv.bf16(), doc, docs.count, B, T, NH, NKV, hs,
                                                  window, scores.scale, stream_))
      return;
    if (k != AttnKernel::plain && cuda::flash_attention_fits(hs))
      return cuda::flash_attention_forward(out.bf16(), lse.f32(), qkv.bf16(), doc, B, T, NH, NKV, hs, drop, window,
                                           scores.scale, scores.softcap, stream_);
    by_dtype(qkv.dtype, "attention_forward", [&](auto tag) {
      using A = decltype(tag);
      cuda::attention_forward((A*)out.data, lse.f32(), (const A*)qkv.data, doc, B, T, NH, NKV, hs, drop, window,
                              scores.scale, scores.softcap, stream_);
    });
  }
  void attention_backward_impl(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T, int NH,
                               int NKV, int hs, const Dropout& drop, const PackedDocs& docs, int window,
                               const AttnScores& scores) override {
    const int32_t* doc = i32_or_null(docs.start);
    const AttnKernel k = attention_kernel(qkv.dtype, hs, drop, scores.capped(), doc != nullptr, B, T, NH, NKV);
    // cuDNN's lse is llmt's, so whichever kernel ran the forward, any of them can run the backward
    if (k == AttnKernel::cudnn && cudnn().backward(dqkv.bf16(), dout.bf16(), qkv.bf16(), out.bf16(), lse.f32(), doc,
                                                   docs.count, B, T, NH, NKV, hs, window, scores.scale, stream_))
      return;
    float* d = (float*)scratch(attn_d_, (size_t)B * T * NH * sizeof(float));
    if (k != AttnKernel::plain && cuda::flash_attention_fits(hs)) {
      cuda::attention_row_dots(d, dout.bf16(), out.bf16(), (int64_t)B * T * NH, hs, stream_);
      float* partial = (float*)scratch(attn_dq_, cuda::flash_backward_scratch_bytes(B, T, NH, NKV, hs));
      return cuda::flash_attention_backward(dqkv.bf16(), partial, dout.bf16(), qkv.bf16(), lse.f32(), d, doc, B, T, NH,
                                            NKV, hs, drop, window, scores.scale, scores.softcap, stream_);
    }
    by_dtype(qkv.dtype, "attention_backward", [&](auto tag) {
      using A = decltype(tag);
      cuda::attention_backward((A*)dqkv.data, (const A*)dout.data, (const A*)qkv.data, (const A*)out.data, lse.f32(),
                               d, doc, B, T, NH, NKV, hs, drop, window, scores.scale, scores.softcap, stream_);
    });
  }

  // ---- elementwise ----
  void add_impl(Tensor out, Tensor a, Tensor b, int64_t n) override {
    by_dtype(out.dtype, "add", [&](auto tag) {
      if constexpr (std::is_same_v<decltype(tag), float>) cuda::add_f32(out.f32(), a.f32(), b.f32(), n, stream_);
      else cuda::add_bf16(out.bf16(), a.bf16(), b.bf16(), n, stream_);
    });
  }
  void accumulate_impl(Tensor dst, Tensor src, int64_t n) override {
    by_dtype(dst.dtype, "accumulate", [&](auto dtag) {
      by_dtype(src.dtype, "accumulate", [&](auto stag) {
        using D = decltype(dtag);
        using S = decltype(stag);
        if constexpr (std::is_same_v<D, S>) {
          if constexpr (std::is_same_v<D, float>) cuda::accumulate_f32(dst.f32(), src.f32(), n, stream_);
          else cuda::accumulate_bf16(dst.bf16(), src.bf16(), n, stream_);
        } else {
          cuda::accumulate_mixed((D*)dst.data, (const S*)src.data, n, stream_);
        }
      });
    });
  }
  void scale_impl(Tensor x, float s, int64_t n) override {
    by_dtype(x.dtype, "scale", [&](auto tag) {
      if constexpr (std::is_same_v<decltype(tag), float>) cuda::scale_f32(x.f32(), s, n, stream_);
      else cuda::scale_bf16(x.bf16(), s, n, stream_);
    });
  }

  // ---- loss ----
  void cross_entropy_impl(Tensor loss_sum, Tensor dlogits, Tensor logits, Tensor targets, int64_t N, int V,
                          float grad_scale, int64_t ld, float softcap) override {
    double* rows = (double*)scratch(row_losses_, (size_t)std::max<int64_t>(N, 1) * sizeof(double));
    by_dtype(logits.dtype, "cross_entropy", [&](auto tag) {
      using A = decltype(tag);
      cuda::cross_entropy(loss_sum.f64(), rows, (A*)dlogits.data, (const A*)logits.data, targets.i32(), N, V, ld,
                          grad_scale, softcap, err_, stream_);
    });
  }
  void logit_softcap_impl(Tensor x, int64_t N, int V, float cap, int64_t ld) override {
    by_dtype(x.dtype, "logit_softcap",
             [&](auto tag) { cuda::logit_softcap((decltype(tag)*)x.data, N, V, ld, cap, stream_); });
  }

  // ---- optimizer and reductions ----
  void adamw_impl(Tensor p, Tensor p_compute, Tensor g, Tensor m, Tensor v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, const DecaySpans& decay, int t,
                  float grad_scale) override {
    static_assert(DecaySpans::kMax <= cuda::kAdamWMaxSpans, "the kernel takes every span the op allows");
    cuda::adamw(p.f32(), p_compute.data ? p_compute.bf16() : nullptr, g.f32(), m.f32(), v.f32(), n, lr, beta1, beta2,
                eps, weight_decay, decay.count, decay.begin, decay.end, t, grad_scale, stream_);
  }
  void sum_squares_impl(Tensor out, Tensor x, int64_t n) override {
    double* partials = (double*)scratch(partials_, cuda::kSumSquaresPartials * sizeof(double));
    cuda::sum_squares_f32(out.f64(), partials, x.f32(), n, /*accumulate=*/true, stream_);
  }

  // ---- dtype conversion ----
  void convert_impl(Tensor out, Tensor in, int64_t n) override {
    by_dtype(out.dtype, "convert", [&](auto otag) {
      by_dtype(in.dtype, "convert", [&](auto itag) {
        using O = decltype(otag);
        using I = decltype(itag);
        if constexpr (std::is_same_v<O, I>) copy_impl(out.data, in.data, (size_t)n * sizeof(O));
        else if constexpr (std::is_same_v<O, float>) cuda::convert_bf16_to_f32(out.f32(), in.bf16(), n, stream_);
        else cuda::convert_f32_to_bf16(out.bf16(), in.f32(), n, stream_);
      });
    });
  }

  // ---- mixture of experts: not yet implemented on CUDA (issue 47's later phase); each op says so ----
  [[noreturn]] void moe_not_yet(const char* op) {
    fail("cuda %s: the mixture-of-experts ops are not yet implemented on CUDA (issue 47); train MoE models with "
         "--device cpu for now", op);
  }
  void moe_route_impl(Tensor, Tensor, Tensor, Tensor, Tensor, int64_t, int, int, bool, bool) override {
    moe_not_yet("moe_route");
  }
  void moe_route_backward_impl(Tensor, Tensor, Tensor, Tensor, Tensor, int64_t, int, int, bool) override {
    moe_not_yet("moe_route_backward");
  }
  void moe_dispatch_impl(Tensor, Tensor, Tensor, Tensor, Tensor, int64_t, int, int, int) override {
    moe_not_yet("moe_dispatch");
  }
  void moe_undispatch_impl(Tensor, Tensor, Tensor, int64_t, int, int) override { moe_not_yet("moe_undispatch"); }
  void moe_matmul_impl(Tensor, Tensor, Tensor, Tensor, int64_t, int, int64_t, int64_t, int64_t, bool) override {
    moe_not_yet("moe_matmul");
  }
  void moe_matmul_wgrad_impl(Tensor, Tensor, Tensor, Tensor, int64_t, int, int64_t, int64_t, int64_t) override {
    moe_not_yet("moe_matmul_wgrad");
  }
  void moe_combine_impl(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, int64_t, int, int) override {
    moe_not_yet("moe_combine");
  }
  void moe_combine_backward_impl(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                 int64_t, int, int) override {
    moe_not_yet("moe_combine_backward");
  }
  void moe_aux_loss_impl(Tensor, Tensor, Tensor, int, double, float, float) override { moe_not_yet("moe_aux_loss"); }

 private:
  // A scratch buffer of at least `bytes`; growing it waits for the stream to finish with the old one.
  void* scratch(Scratch& s, size_t bytes) {
    if (bytes > s.bytes) {
      counters_.allocs++;
      counters_.host_syncs++;
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      cuda::device_free(s.p);
      s.p = nullptr;
      s.bytes = 0;
      s.p = cuda::device_alloc(bytes);
      s.bytes = bytes;
    }
    return s.p;
  }

  // Throws what a kernel reported, and clears the word so the backend stays usable.
  void check_error_word() {
    int e[cuda::kErrWords];
    CUDA_CHECK(cudaMemcpy(e, err_, sizeof(e), cudaMemcpyDeviceToHost));
    if (e[0] == cuda::kErrNone) return;
    CUDA_CHECK(cudaMemset(err_, 0, sizeof(e)));
    const long long pos = (long long)(((uint64_t)(uint32_t)e[3] << 32) | (uint32_t)e[2]);
    if (e[0] == cuda::kErrToken)
      fail("embedding: token id %d at position %lld is outside the vocabulary [0, %d)", e[1], pos, e[4]);
    if (e[0] == cuda::kErrTarget)
      fail("cross_entropy: target %d at row %lld is outside the vocabulary [0, %d) and is not %d", e[1], pos, e[4],
           kIgnoreIndex);
    fail("cuda backend: a kernel reported error code %d", e[0]);
  }

  DType compute_;
  int device_;
  // launch_count() when the backend was made: its launches are the process's since (a process runs
  // one CUDA backend; a kernel launched outside it in the meantime counts as its own)
  const int64_t launches0_ = cuda::launch_count().load();
  cudaStream_t stream_ = nullptr;
  int* err_ = nullptr;
  Scratch row_losses_, attn_d_, attn_dq_, partials_, columns_;
  // the column sums' partials for N rows of C columns (bias and norm-weight gradients)
  float* columns(int64_t N, int64_t C) { return (float*)scratch(columns_, cuda::column_partials_bytes(N, C)); }
  std::unique_ptr<cuda::LtMatmul> lt_;  // nullptr: the plain kernel
  cuda::AttentionImpl attention_;        // LLMT_ATTENTION when the backend was made
  bool attention_warned_ = false;
  bool packed_warned_ = false;  // packed documents too large for cuDNN's offsets, said once
  std::unique_ptr<cuda::CudnnAttention> dnn_;  // made at the first cuDNN attention call
  std::set<std::tuple<bool, int64_t, int64_t, int64_t>> gelu_unfused_;  // shapes warned about
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device, DType compute, bool tf32) {
  return std::make_unique<CudaBackend>(device, compute, tf32);
}

#ifdef LLMT_SIMT
const char* cuda_build_kind() { return "simt"; }
#else
const char* cuda_build_kind() { return "gpu"; }
#endif

int cuda_device_count() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_device_description(int device) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return strformat("cuda:%d not available (%s)", device, cudaGetErrorString(err));
  }
  if (device < 0 || device >= n) return strformat("cuda:%d not available (%d devices)", device, n);
  cudaDeviceProp prop;
  err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return strformat("cuda:%d not available (cudaGetDeviceProperties: %s)", device, cudaGetErrorString(err));
  }
  int drv = 0, rt = 0;
  (void)cudaDriverGetVersion(&drv);
  (void)cudaRuntimeGetVersion(&rt);
  (void)cudaGetLastError();
  return strformat("cuda:%d %s, %d SMs, %.1f GiB, compute capability %d.%d, driver %d.%d, runtime %d.%d", device,
                   prop.name, prop.multiProcessorCount, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
                   prop.major, prop.minor, drv / 1000, (drv % 1000) / 10, rt / 1000, (rt % 1000) / 10);
}

std::string cuda_attention_kernels(DType compute, int head_size, bool dropout, bool packed, bool softcap) {
  std::string why;
  const AttnKernel k = pick_attention(cuda::attention_impl(), compute, head_size, dropout, softcap, &why);
  std::string s = k == AttnKernel::cudnn   ? "cuDNN " + cuda::cudnn_attention_version() + ", deterministic backward" +
                                              (packed ? ", packed documents as a ragged batch" : "")
                  : k == AttnKernel::flash ? "flash (tensor cores, forward and backward)"
                                           : "plain";
  return why.empty() ? s : s + " (" + why + ")";
}

std::string cuda_matmul_kernels() {
  if (!uses_cublaslt()) return "plain (LLMT_MATMUL=native)";
  return std::string(cuda_build_kind()) == "simt"
             ? "cuBLASLt's CPU stand-in (LLMT_MATMUL=cublaslt), bias and GELU in its epilogues"
             : "cuBLASLt, bias and GELU in its epilogues";
}

double cuda_peak_tflops(int device, DType compute, bool tf32) {
  if (std::string(cuda_build_kind()) != "gpu" || device < 0 || device >= cuda_device_count()) return 0.0;
  cudaDeviceProp prop;
  int clock_khz = 0;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0.0;
  }
  const bool bf16 = compute == DType::bf16;
  const std::string name = prop.name;
  // Published dense peaks (NVIDIA's H100/H200 and A100 datasheets; without sparsity).
  struct Known {
    const char* name;
    double bf16, tf32, f32;
  };
  const Known known[] = {{"H200", 989.4, 494.7, 66.9},
                         {"H100 80GB HBM3", 989.4, 494.7, 66.9},  // SXM
                         {"H100 PCIe", 756.5, 378.0, 51.2},
                         {"A100", 312.0, 156.0, 19.5}};
  for (const Known& k : known)
    if (name.find(k.name) != std::string::npos) return bf16 ? k.bf16 : tf32 ? k.tf32 : k.f32;
  // Otherwise from the clock: dense flops per SM per clock by architecture (Ampere GA100, Hopper).
  double per_clock = 0.0;
  if (prop.major == 8 && prop.minor == 0) per_clock = bf16 ? 2048 : tf32 ? 1024 : 128;
  if (prop.major == 9 && prop.minor == 0) per_clock = bf16 ? 4096 : tf32 ? 2048 : 256;
  return per_clock * prop.multiProcessorCount * clock_khz * 1e3 / 1e12;
}

double cuda_peak_bandwidth_gbs(int device) {
  if (std::string(cuda_build_kind()) != "gpu" || device < 0 || device >= cuda_device_count()) return 0.0;
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0.0;
  }
  // NVIDIA's datasheets: H200 141 GB HBM3e, H100 SXM 80 GB HBM3, H100 PCIe 80 GB HBM2e, A100 80 GB
  // SXM HBM2e, A100 40 GB
  struct Known {
    const char* name;
    double gbs;
  };
  const Known known[] = {{"H200", 4800.0}, {"H100 80GB HBM3", 3350.0}, {"H100 PCIe", 2000.0},
                         {"A100-SXM4-80GB", 2039.0}, {"A100 80GB PCIe", 1935.0}, {"A100", 1555.0}};
  const std::string name = prop.name;
  for (const Known& k : known)
    if (name.find(k.name) != std::string::npos) return k.gbs;
  return 0.0;
}

}  // namespace llmt
