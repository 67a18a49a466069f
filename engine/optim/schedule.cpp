#include "engine/optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"

namespace llmt {

double Schedule::multiplier(int64_t step) const {
  if (type == "constant") return 1.0;
  if (step < warmup_steps) return (double)step / (double)std::max<int64_t>(1, warmup_steps);
  if (type == "constant_with_warmup") return 1.0;
  const double decay_steps = (double)std::max<int64_t>(1, total_steps - warmup_steps);
  if (type == "linear") return std::max(0.0, (double)(total_steps - step) / decay_steps);
  // cosine over half a cycle (transformers' default num_cycles = 0.5)
  double progress = (double)(step - warmup_steps) / decay_steps;
  return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * 2.0 * 0.5 * progress)));
}

Schedule make_schedule(const std::string& type, int64_t total_steps, int64_t warmup_steps, double warmup_ratio) {
  LLMT_CHECK(type == "linear" || type == "cosine" || type == "constant" || type == "constant_with_warmup",
             "unknown --lr_scheduler_type \"%s\" (llmt implements linear, cosine, constant, constant_with_warmup)",
             type.c_str());
  LLMT_CHECK(warmup_steps >= 0, "--warmup_steps must not be negative");
  LLMT_CHECK(warmup_ratio >= 0.0 && warmup_ratio <= 1.0, "--warmup_ratio must lie in [0, 1], got %g", warmup_ratio);
  Schedule s;
  s.type = type;
  s.total_steps = std::max<int64_t>(1, total_steps);
  s.warmup_steps = warmup_steps > 0 ? warmup_steps : (int64_t)std::ceil(warmup_ratio * (double)total_steps);
  return s;
}

}  // namespace llmt
