// A Backend that runs another one and, while enabled, times each op into a category (matmul,
// attention, loss, ...): llmt bench's breakdown of a step. Disabled, it only forwards.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "engine/backend/backend.h"

namespace llmt {

class ProfilingBackend : public Backend {
 public:
  explicit ProfilingBackend(std::unique_ptr<Backend> inner) : in_(std::move(inner)) {}
  Backend& inner() { return *in_; }
  void enable(bool on) { on_ = on; }
  void reset() { ms_.clear(); }
  // Milliseconds spent in each category's ops while enabled (each op waits for its work to finish).
  const std::map<std::string, double>& ms() const { return ms_; }

  std::string name() const override { return in_->name(); }
  int threads() const override { return in_->threads(); }
  DType compute_dtype() const override { return in_->compute_dtype(); }
  bool is_host_memory() const override { return in_->is_host_memory(); }
  void* native_stream() override { return in_->native_stream(); }
  std::unique_ptr<Event> make_event() override { return in_->make_event(); }
  void record(Event& e) override { in_->record(e); }
  void wait(Event& e) override { in_->wait(e); }
  void* alloc(size_t bytes) override { return in_->alloc(bytes); }
  void release(void* p) override { in_->release(p); }
  void zero(void* p, size_t bytes) override;
  void copy_from_host(void* dst, const void* src, size_t bytes) override { in_->copy_from_host(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { in_->copy_to_host(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override;
  void synchronize() override { in_->synchronize(); }

  void matmul(Tensor out, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b,
              bool accumulate) override;
  void bias_backward(Tensor dbias, Tensor dout, int64_t M, int64_t N) override;
  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int B, int T, int C, int V) override;
  void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int B, int T, int C) override;
  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b, int64_t N, int C,
                         float eps) override;
  void layernorm_backward(Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w, Tensor mean, Tensor rstd,
                          int64_t N, int C) override;
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, int64_t N, int C, float eps) override;
  void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, int64_t N, int C) override;
  void gelu_forward(Tensor out, Tensor x, int64_t n) override;
  void gelu_backward(Tensor dx, Tensor x, Tensor dout, int64_t n) override;
  void swiglu_forward(Tensor out, Tensor gate_up, int64_t N, int I) override;
  void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, int64_t N, int I) override;
  void dropout(Tensor x, int B, int T, int C, const Dropout& d) override;
  void rope_forward(Tensor qkv, int B, int T, int NH, int NKV, int hs, const RopeSpec& rope) override;
  void rope_backward(Tensor dqkv, int B, int T, int NH, int NKV, int hs, const RopeSpec& rope) override;
  void attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int NH, int NKV, int hs,
                         const Dropout& drop) override;
  void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T, int NH, int NKV,
                          int hs, const Dropout& drop) override;
  void add(Tensor out, Tensor a, Tensor b, int64_t n) override;
  void accumulate(Tensor dst, Tensor src, int64_t n) override;
  void scale(Tensor x, float s, int64_t n) override;
  void cross_entropy(Tensor loss_sum, Tensor dlogits, Tensor logits, Tensor targets, int64_t N, int V,
                     float grad_scale) override;
  void adamw(Tensor p, Tensor p_compute, Tensor g, Tensor m, Tensor v, int64_t n, float lr, float beta1, float beta2,
             float eps, float weight_decay, int t, float grad_scale) override;
  void sum_squares(Tensor out, Tensor x, int64_t n) override;
  void convert(Tensor out, Tensor in, int64_t n) override;

 private:
  template <class F>
  void timed(const char* category, F&& f);

  std::unique_ptr<Backend> in_;
  bool on_ = false;
  std::map<std::string, double> ms_;
};

}  // namespace llmt
