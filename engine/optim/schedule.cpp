#include "engine/optim/schedule.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/core/json_text.h"

namespace llmt {

double Schedule::multiplier(int64_t step) const {
  if (type == "constant") return 1.0;
  if (step < warmup_steps) return (double)step / (double)std::max<int64_t>(1, warmup_steps);
  if (type == "constant_with_warmup") return 1.0;
  const double decay_steps = (double)std::max<int64_t>(1, total_steps - warmup_steps);
  if (type == "linear") return std::max(0.0, (double)(total_steps - step) / decay_steps);
  const double progress = (double)(step - warmup_steps) / decay_steps;
  if (type == "cosine") return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * num_cycles * 2.0 * progress)));
  if (type == "cosine_with_restarts") {
    if (progress >= 1.0) return 0.0;
    return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * std::fmod(num_cycles * progress, 1.0))));
  }
  // polynomial: from base_lr down to lr_end, then held there
  if (step > total_steps) return lr_end / base_lr;
  const double remaining = 1.0 - progress;
  return ((base_lr - lr_end) * std::pow(remaining, power) + lr_end) / base_lr;
}

Schedule make_schedule(const std::string& type, int64_t total_steps, int64_t warmup_steps, double warmup_ratio,
                       const std::string& kwargs, double base_lr) {
  LLMT_CHECK(type == "linear" || type == "cosine" || type == "cosine_with_restarts" || type == "polynomial" ||
                 type == "constant" || type == "constant_with_warmup",
             "unknown --lr_scheduler_type \"%s\" (llmt implements linear, cosine, cosine_with_restarts, polynomial, "
             "constant, constant_with_warmup)",
             type.c_str());
  LLMT_CHECK(warmup_steps >= 0, "--warmup_steps must not be negative");
  LLMT_CHECK(warmup_ratio >= 0.0 && warmup_ratio <= 1.0, "--warmup_ratio must lie in [0, 1], got %g", warmup_ratio);
  Schedule s;
  s.type = type;
  s.total_steps = std::max<int64_t>(1, total_steps);
  s.warmup_steps = warmup_steps > 0 ? warmup_steps : (int64_t)std::ceil(warmup_ratio * (double)total_steps);
  s.base_lr = base_lr;
  if (type == "cosine_with_restarts") s.num_cycles = 1.0;
  if (!kwargs.empty() && kwargs != "{}") {
    check_json_depth(kwargs, "--lr_scheduler_kwargs");
    nlohmann::json j = nlohmann::json::parse(kwargs, nullptr, false);
    LLMT_CHECK(!j.is_discarded(), "--lr_scheduler_kwargs: not JSON: %s", clip_for_message(kwargs).c_str());
    LLMT_CHECK(j.is_object(), "--lr_scheduler_kwargs must be a JSON object, e.g. '{\"num_cycles\": 2}'");
    for (const auto& [key, value] : j.items()) {
      const bool known = ((type == "cosine" || type == "cosine_with_restarts") && key == "num_cycles") ||
                         (type == "polynomial" && (key == "lr_end" || key == "power"));
      LLMT_CHECK(known, "--lr_scheduler_kwargs: %s takes no \"%s\" (cosine and cosine_with_restarts take num_cycles; "
                 "polynomial takes lr_end and power)", type.c_str(), key.c_str());
      LLMT_CHECK(value.is_number() && std::isfinite(value.get<double>()),
                 "--lr_scheduler_kwargs: \"%s\" must be a finite number", key.c_str());
      const double v = value.get<double>();
      if (key == "num_cycles") s.num_cycles = v;
      if (key == "lr_end") s.lr_end = v;
      if (key == "power") s.power = v;
    }
  }
  LLMT_CHECK(type != "polynomial" || s.lr_end < base_lr,
             "--lr_scheduler_type polynomial: lr_end (%g) must be below --learning_rate (%g), as transformers requires",
             s.lr_end, base_lr);
  return s;
}

}  // namespace llmt
