// AdamW over fp32 parameters with fp32 moments, torch.optim.AdamW's update. Weight decay follows
// the Hugging Face Trainer's rule: every tensor except biases and norm weights (ParamSpec::decay).
// Works on any contiguous range [lo, hi) of a unit's flat buffer, so a rank can step just its shard.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/params/layout.h"

namespace llmt {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// One AdamW step (t is 1-based) for elements [lo, hi) of a unit whose parameters, gradients and
// moments for that range start at p, g, m, v. grad_scale multiplies the gradient (clipping).
void adamw_step_range(Backend& be, const UnitLayout& unit, int64_t lo, int64_t hi, float* p, const float* g, float* m,
                      float* v, float lr, const AdamWConfig& cfg, int t, float grad_scale);

// Moments for whole units, for a single process (FSDP keeps its own, per shard).
class AdamW {
 public:
  AdamW(Backend& be, const ParamLayout& layout, const AdamWConfig& cfg);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;
  // Steps every unit; params[u] and grads[u] are full unit buffers on the backend.
  void step(const std::vector<float*>& params, const std::vector<float*>& grads, float lr, float grad_scale);
  int steps_done() const { return t_; }

 private:
  Backend& be_;
  const ParamLayout& layout_;
  AdamWConfig cfg_;
  std::vector<float*> m_, v_;
  int t_ = 0;
};

}  // namespace llmt
