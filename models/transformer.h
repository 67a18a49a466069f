// GPT-2 and LLaMA forward and backward, built from Backend ops, unit by unit through a UnitStore
// (engine/params/unit_store.h).
#pragma once
#include <cstdint>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/params/unit_store.h"
#include "models/config.h"
#include "models/layout.h"

namespace llmt {

class Transformer {
 public:
  // Allocates activations for batches of B sequences of up to T tokens on the backend. With
  // checkpointing only each block's input is kept; backward recomputes the block's forward.
  Transformer(const ModelConfig& cfg, Backend& backend, int B, int T, bool checkpointing = false);
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ModelLayout& layout() const { return layout_; }
  int batch() const { return B_; }
  int seq_len() const { return T_max_; }  // the most tokens per sequence
  // Bytes of activations and scratch this model allocates for (B, T).
  static int64_t activation_bytes(const ModelConfig& cfg, int B, int T, bool checkpointing);

  // Runs the forward pass on tokens[B*T] (host memory). With targets[B*T] (host, -100 = ignored)
  // it returns the sum of the token losses; with want_grad it also leaves grad_scale * dloss/dlogits
  // in place of the logits for backward (grad_scale is usually 1 / tokens counted in the step).
  // Without targets it returns 0 and keeps the logits. seq_len (<= seq_len(); 0 = all of it) is
  // this batch's sequence length T: tokens and targets hold B*T entries.
  double forward(UnitStore& store, const int32_t* tokens, const int32_t* targets, bool want_grad,
                 float grad_scale, int seq_len = 0);
  // Adds this batch's gradients into store.grads(u); call after forward(..., want_grad = true).
  void backward(UnitStore& store);
  // Logits [B*T, V] on the backend (T of the last forward), valid after a forward without want_grad.
  Tensor logits() const;

 private:
  void norm_forward(float* out, float* mean, float* rstd, Tensor x, const float* w, int64_t w_off, int64_t b_off);
  void norm_backward(Tensor x, const float* mean, const float* rstd, const float* w, float* g, int64_t w_off,
                     int64_t b_off);
  void block_forward(int l, const float* w);
  void block_backward(int l, const float* w, float* g);
  int act(int l) const { return checkpointing_ ? 0 : l; }  // which set of block activations layer l uses
  float* buf(size_t n);

  ModelConfig cfg_;
  ModelLayout layout_;
  Backend& be_;
  int B_, T_max_;   // capacity
  int cur_T_ = 0;   // the current batch's sequence length
  bool checkpointing_;
  std::vector<void*> allocations_;
  bool have_grad_ = false;

  // activations: resid_ per layer; the rest per layer, or one set reused when checkpointing
  int32_t *tokens_ = nullptr, *targets_ = nullptr;
  std::vector<float*> resid_;        // [L+1] residual stream entering block l (resid_[L] leaves the last)
  std::vector<float*> ln1_, ln1_mean_, ln1_rstd_, qkv_, att_, attn_out_, resid_mid_;
  std::vector<float*> ln2_, ln2_mean_, ln2_rstd_, mlp_in_, mlp_act_;
  float *lnf_ = nullptr, *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr, *logits_ = nullptr;
  // backward scratch
  float *dres_ = nullptr, *dnorm_ = nullptr, *dattn_ = nullptr, *dqkv_ = nullptr, *datt_ = nullptr;
  float *dmlp_in_ = nullptr, *dmlp_act_ = nullptr;
};

// A UnitStore over full per-unit buffers on one process (no sharding): params and grads.
class FullUnitStore : public UnitStore {
 public:
  FullUnitStore(Backend& backend, const ModelLayout& layout);
  ~FullUnitStore();
  float* acquire(int unit) override { return params_[unit]; }
  void release(int) override {}
  float* grads(int unit) override { return grads_[unit]; }
  void grads_done(int) override {}
  float* params(int unit) { return params_[unit]; }
  void zero_grads();
  size_t num_units() const { return params_.size(); }

 private:
  Backend& be_;
  const ModelLayout& layout_;
  std::vector<float*> params_, grads_;
};

// Fills a unit's parameters the way GPT-2 / LLaMA initialise them: normal(0, 0.02) weights,
// output projections scaled by 1/sqrt(2 * n_layer), zero biases, unit norm weights.
// Deterministic in (seed, unit): independent of how units are later sharded. Host memory.
void init_unit_params(const ModelConfig& cfg, const UnitLayout& unit, int unit_index, uint64_t seed, float* host);

}  // namespace llmt
