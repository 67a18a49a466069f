#include "engine/backend/profiling.h"

#include <chrono>

namespace llmt {

template <class F>
void ProfilingBackend::timed(const char* category, F&& f) {
  if (!on_) return f();
  in_->synchronize();
  auto t0 = std::chrono::steady_clock::now();
  f();
  in_->synchronize();
  ms_[category] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void ProfilingBackend::zero(void* p, size_t bytes) {
  timed("gradient zeroing", [&] { in_->zero(p, bytes); });
}
void ProfilingBackend::copy(void* dst, const void* src, size_t bytes) {
  timed("copies", [&] { in_->copy(dst, src, bytes); });
}
void ProfilingBackend::matmul(Tensor out, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N, int64_t K,
                              bool trans_a, bool trans_b, bool accumulate) {
  timed("matmul", [&] { in_->matmul(out, a, b, bias, M, N, K, trans_a, trans_b, accumulate); });
}
void ProfilingBackend::bias_backward(Tensor dbias, Tensor dout, int64_t M, int64_t N) {
  timed("matmul", [&] { in_->bias_backward(dbias, dout, M, N); });
}
void ProfilingBackend::embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int B, int T, int C, int V) {
  timed("embedding", [&] { in_->embedding_forward(out, tokens, wte, wpe, B, T, C, V); });
}
void ProfilingBackend::embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int B, int T, int C) {
  timed("embedding", [&] { in_->embedding_backward(dwte, dwpe, dout, tokens, B, T, C); });
}
void ProfilingBackend::layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b, int64_t N,
                                         int C, float eps) {
  timed("norms", [&] { in_->layernorm_forward(out, mean, rstd, x, w, b, N, C, eps); });
}
void ProfilingBackend::layernorm_backward(Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w, Tensor mean,
                                          Tensor rstd, int64_t N, int C) {
  timed("norms", [&] { in_->layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C); });
}
void ProfilingBackend::rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, int64_t N, int C, float eps) {
  timed("norms", [&] { in_->rmsnorm_forward(out, rstd, x, w, N, C, eps); });
}
void ProfilingBackend::rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, int64_t N,
                                        int C) {
  timed("norms", [&] { in_->rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C); });
}
void ProfilingBackend::gelu_forward(Tensor out, Tensor x, int64_t n) {
  timed("activations", [&] { in_->gelu_forward(out, x, n); });
}
void ProfilingBackend::gelu_backward(Tensor dx, Tensor x, Tensor dout, int64_t n) {
  timed("activations", [&] { in_->gelu_backward(dx, x, dout, n); });
}
void ProfilingBackend::swiglu_forward(Tensor out, Tensor gate_up, int64_t N, int I) {
  timed("activations", [&] { in_->swiglu_forward(out, gate_up, N, I); });
}
void ProfilingBackend::swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, int64_t N, int I) {
  timed("activations", [&] { in_->swiglu_backward(dgate_up, dout, gate_up, N, I); });
}
void ProfilingBackend::dropout(Tensor x, int B, int T, int C, const Dropout& d) {
  timed("activations", [&] { in_->dropout(x, B, T, C, d); });
}
void ProfilingBackend::rope_forward(Tensor qkv, int B, int T, int NH, int NKV, int hs, const RopeSpec& rope) {
  timed("attention", [&] { in_->rope_forward(qkv, B, T, NH, NKV, hs, rope); });
}
void ProfilingBackend::rope_backward(Tensor dqkv, int B, int T, int NH, int NKV, int hs, const RopeSpec& rope) {
  timed("attention", [&] { in_->rope_backward(dqkv, B, T, NH, NKV, hs, rope); });
}
void ProfilingBackend::attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int NH, int NKV, int hs,
                                         const Dropout& drop) {
  timed("attention", [&] { in_->attention_forward(out, lse, qkv, B, T, NH, NKV, hs, drop); });
}
void ProfilingBackend::attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T,
                                          int NH, int NKV, int hs, const Dropout& drop) {
  timed("attention", [&] { in_->attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, hs, drop); });
}
void ProfilingBackend::add(Tensor out, Tensor a, Tensor b, int64_t n) {
  timed("elementwise", [&] { in_->add(out, a, b, n); });
}
void ProfilingBackend::accumulate(Tensor dst, Tensor src, int64_t n) {
  timed("elementwise", [&] { in_->accumulate(dst, src, n); });
}
void ProfilingBackend::scale(Tensor x, float s, int64_t n) {
  timed("elementwise", [&] { in_->scale(x, s, n); });
}
void ProfilingBackend::cross_entropy(Tensor loss_sum, Tensor dlogits, Tensor logits, Tensor targets, int64_t N, int V,
                                     float grad_scale) {
  timed("loss", [&] { in_->cross_entropy(loss_sum, dlogits, logits, targets, N, V, grad_scale); });
}
void ProfilingBackend::adamw(Tensor p, Tensor p_compute, Tensor g, Tensor m, Tensor v, int64_t n, float lr,
                             float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale) {
  timed("adamw", [&] { in_->adamw(p, p_compute, g, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale); });
}
void ProfilingBackend::sum_squares(Tensor out, Tensor x, int64_t n) {
  timed("grad norm", [&] { in_->sum_squares(out, x, n); });
}
void ProfilingBackend::convert(Tensor out, Tensor in, int64_t n) {
  timed("elementwise", [&] { in_->convert(out, in, n); });
}

}  // namespace llmt
