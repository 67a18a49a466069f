// The Backend interface: memory, and the one op set every model is built from.
// The CPU backend (kernels/cpu) computes in fp32; the CUDA backend (kernels/cuda) will compute
// in bf16 with fp32 accumulation behind the same calls. Models and the trainer never see which.
//
// Conventions for every op:
//  - Shapes are given explicitly (N rows = B*T tokens, C channels); tensors are row-major.
//  - "+=" in a comment means the op accumulates into that output; "=" means it overwrites.
//  - Backward ops that accumulate let gradients from several paths (residual stream, tied
//    embeddings, micro-batches) meet in one buffer without extra copies.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/core/tensor.h"

namespace llmt {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda"
  virtual int threads() const = 0;       // CPU threads the backend's ops use

  // ---- memory (device memory for CUDA, host memory for the CPU) ----
  virtual void* alloc(size_t bytes) = 0;  // zero-filled, 64-byte aligned
  virtual void release(void* p) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() = 0;

  // ---- dense ----
  // out[M,N] (= or +=) op(a) @ op(b) + bias[N]
  //   op(a): a stored [M,K], or [K,M] with trans_a;  op(b): b stored [K,N], or [N,K] with trans_b.
  //   bias may have data == nullptr; accumulate adds to out instead of overwriting it.
  virtual void matmul(Tensor out, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N, int64_t K,
                      bool trans_a, bool trans_b, bool accumulate) = 0;
  // dbias[N] += sum over rows of dout[M,N]
  virtual void bias_backward(Tensor dbias, Tensor dout, int64_t M, int64_t N) = 0;

  // ---- embeddings ----
  // out[B*T,C] = wte[token] (+ wpe[t] when wpe.data != nullptr). Token ids must lie in [0, V).
  virtual void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int B, int T, int C, int V) = 0;
  // dwte[token] += dout; dwpe[t] += dout (when dwpe.data != nullptr)
  virtual void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int B, int T, int C) = 0;

  // ---- norms ----
  // out = (x - mean) * rstd * w + b over each row of C; mean[N] and rstd[N] are saved for backward.
  virtual void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b,
                                 int64_t N, int C, float eps) = 0;
  // dx += ..., dw += ..., db += ...
  virtual void layernorm_backward(Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w,
                                  Tensor mean, Tensor rstd, int64_t N, int C) = 0;
  // out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps) saved for backward.
  virtual void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, int64_t N, int C, float eps) = 0;
  // dx += ..., dw += ...
  virtual void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd,
                                int64_t N, int C) = 0;

  // ---- activations ----
  // GELU, tanh form (gelu_new). out = gelu(x); dx = dout * gelu'(x) (dx may alias dout).
  virtual void gelu_forward(Tensor out, Tensor x, int64_t n) = 0;
  virtual void gelu_backward(Tensor dx, Tensor x, Tensor dout, int64_t n) = 0;
  // SwiGLU over rows of gate_up[N, 2I] = [gate | up]: out[N,I] = silu(gate) * up.
  // dgate_up (=) from dout[N,I].
  virtual void swiglu_forward(Tensor out, Tensor gate_up, int64_t N, int I) = 0;
  virtual void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, int64_t N, int I) = 0;

  // ---- attention ----
  // qkv rows are [q (NH*hs) | k (NKV*hs) | v (NKV*hs)] for each of the B*T tokens.
  // RoPE in place on the q and k parts, Hugging Face rotate_half layout, positions 0..T-1,
  // inv_freq[i] = theta^(-2i/hs). rope_backward applies the inverse rotation to dq and dk in place.
  virtual void rope_forward(Tensor qkv, int B, int T, int NH, int NKV, int hs, float theta) = 0;
  virtual void rope_backward(Tensor dqkv, int B, int T, int NH, int NKV, int hs, float theta) = 0;
  // Causal self-attention with grouped-query heads (head h reads kv head h / (NH/NKV)), scale 1/sqrt(hs).
  // out[B*T, NH*hs] (=); att[B,NH,T,T] (=) keeps the softmax probabilities for backward.
  virtual void attention_forward(Tensor out, Tensor att, Tensor qkv, int B, int T, int NH, int NKV, int hs) = 0;
  // dqkv (=); datt[B,NH,T,T] is scratch.
  virtual void attention_backward(Tensor dqkv, Tensor datt, Tensor dout, Tensor qkv, Tensor att, int B, int T,
                                  int NH, int NKV, int hs) = 0;

  // ---- elementwise ----
  virtual void add(Tensor out, Tensor a, Tensor b, int64_t n) = 0;  // out = a + b (out may alias a or b)
  virtual void accumulate(Tensor dst, Tensor src, int64_t n) = 0;  // dst += src
  virtual void scale(Tensor x, float s, int64_t n) = 0;             // x *= s

  // ---- loss ----
  // Softmax cross-entropy over rows of logits[N,V] with targets[N] (i32; -100 = ignored).
  // Returns the sum of the per-row losses over rows not ignored (as double, on the host).
  // When dlogits.data != nullptr: dlogits (=) grad_scale * (softmax - onehot), zero on ignored rows;
  // dlogits may alias logits. A target outside [0, V) other than -100 is an error.
  virtual double cross_entropy(Tensor dlogits, Tensor logits, Tensor targets, int64_t N, int V,
                               float grad_scale) = 0;

  // ---- optimizer and reductions ----
  // AdamW as torch.optim.AdamW: p *= 1 - lr*wd; m,v updated with g*grad_scale; bias-corrected step t (1-based).
  virtual void adamw(Tensor p, Tensor g, Tensor m, Tensor v, int64_t n, float lr, float beta1, float beta2,
                     float eps, float weight_decay, int t, float grad_scale) = 0;
  virtual double sum_squares(Tensor x, int64_t n) = 0;  // returned on the host

  // ---- dtype conversion ----
  virtual void convert(Tensor out, Tensor in, int64_t n) = 0;  // f32 <-> bf16 (round to nearest even)
};

}  // namespace llmt
