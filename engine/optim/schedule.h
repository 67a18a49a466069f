// Learning-rate schedules as transformers' get_scheduler defines them: the multiplier of the
// base rate for the optimizer step that follows `step` earlier steps (LambdaLR's lr_lambda(step)).
#pragma once
#include <cstdint>
#include <string>

namespace llmt {

struct Schedule {
  std::string type = "linear";  // linear, cosine, constant, constant_with_warmup
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double multiplier(int64_t step) const;
};

// Checks the name; warmup_steps > 0 wins over warmup_ratio (ceil(ratio * total)), as in TrainingArguments.
Schedule make_schedule(const std::string& type, int64_t total_steps, int64_t warmup_steps, double warmup_ratio);

}  // namespace llmt
