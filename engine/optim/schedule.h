// Learning-rate schedules as transformers' get_scheduler defines them: the multiplier of the
// base rate for the optimizer step that follows `step` earlier steps (LambdaLR's lr_lambda(step)).
#pragma once
#include <cstdint>
#include <string>

namespace llmt {

struct Schedule {
  // linear, cosine, cosine_with_restarts, polynomial, constant, constant_with_warmup
  std::string type = "linear";
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double num_cycles = 0.5;  // cosine: half-cycles x 2 (0.5: down once); cosine_with_restarts: restarts (1)
  double lr_end = 1e-7;     // polynomial: the rate it decays to, and its power
  double power = 1.0;
  double base_lr = 1.0;     // polynomial: the peak rate (its multiplier depends on lr_end / base_lr)
  double multiplier(int64_t step) const;
};

// Checks the name; warmup_steps > 0 wins over warmup_ratio (ceil(ratio * total)), as in TrainingArguments.
// kwargs is --lr_scheduler_kwargs, a JSON object of the schedule function's keyword arguments
// (cosine and cosine_with_restarts: num_cycles; polynomial: lr_end, power); another key is an error, as
// it is a TypeError in transformers. base_lr is --learning_rate (polynomial needs it).
Schedule make_schedule(const std::string& type, int64_t total_steps, int64_t warmup_steps, double warmup_ratio,
                       const std::string& kwargs = "", double base_lr = 1.0);

}  // namespace llmt
