#include "engine/optim/adamw.h"

#include <algorithm>

namespace llmt {

void adamw_step_range(Backend& be, const UnitLayout& unit, int64_t lo, int64_t hi, Tensor p, Tensor p_compute, Tensor g,
                      Tensor m, Tensor v, float lr, const AdamWConfig& cfg, int t, float grad_scale) {
  // One call per tensor that overlaps the range: tensors differ in whether they decay.
  for (const ParamSpec& s : unit.params) {
    int64_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.numel());
    if (a >= b) continue;
    int64_t k = a - lo, n = b - a;
    be.adamw(p.view(k, {n}), p_compute.data ? p_compute.view(k, {n}) : Tensor(), g.view(k, {n}), m.view(k, {n}),
             v.view(k, {n}), n, lr, cfg.beta1, cfg.beta2, cfg.eps, s.decay ? cfg.weight_decay : 0.0f, t, grad_scale);
  }
}

}  // namespace llmt
