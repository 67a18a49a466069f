// AdamW over fp32 parameters with fp32 moments, torch.optim.AdamW's update. Weight decay follows
// the Hugging Face Trainer's rule: every tensor except biases and norm weights (ParamSpec::decay).
// Works on any contiguous range [lo, hi) of a unit's flat buffer, so a rank can step just its shard.
#pragma once
#include <cstdint>

#include "engine/backend/backend.h"
#include "engine/params/layout.h"

namespace llmt {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// One AdamW step (t is 1-based) for elements [lo, hi) of a unit. p, g, m, v (f32) hold that range
// from their element 0; p_compute (or an empty tensor) receives the new p in the compute dtype.
// grad_scale multiplies the gradient (clipping).
void adamw_step_range(Backend& be, const UnitLayout& unit, int64_t lo, int64_t hi, Tensor p, Tensor p_compute, Tensor g,
                      Tensor m, Tensor v, float lr, const AdamWConfig& cfg, int t, float grad_scale);

}  // namespace llmt
