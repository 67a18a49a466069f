#include "engine/optim/adamw.h"

#include <algorithm>

namespace llmt {

void adamw_step_range(Backend& be, const UnitLayout& unit, int64_t lo, int64_t hi, float* p, const float* g, float* m,
                      float* v, float lr, const AdamWConfig& cfg, int t, float grad_scale) {
  // One call per tensor that overlaps the range: tensors differ in whether they decay.
  for (const ParamSpec& s : unit.params) {
    int64_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.numel());
    if (a >= b) continue;
    int64_t k = a - lo, n = b - a;
    be.adamw(Tensor(p + k, DType::f32, {n}), Tensor((void*)(g + k), DType::f32, {n}), Tensor(m + k, DType::f32, {n}),
             Tensor(v + k, DType::f32, {n}), n, lr, cfg.beta1, cfg.beta2, cfg.eps, s.decay ? cfg.weight_decay : 0.0f,
             t, grad_scale);
  }
}

AdamW::AdamW(Backend& be, const ParamLayout& layout, const AdamWConfig& cfg) : be_(be), layout_(layout), cfg_(cfg) {
  for (auto& u : layout.units) {
    m_.push_back((float*)be_.alloc(sizeof(float) * u.numel));
    v_.push_back((float*)be_.alloc(sizeof(float) * u.numel));
  }
}

AdamW::~AdamW() {
  for (float* p : m_) be_.release(p);
  for (float* p : v_) be_.release(p);
}

void AdamW::step(const std::vector<float*>& params, const std::vector<float*>& grads, float lr, float grad_scale) {
  t_++;
  for (size_t u = 0; u < layout_.units.size(); u++)
    adamw_step_range(be_, layout_.units[u], 0, layout_.units[u].numel, params[u], grads[u], m_[u], v_[u], lr, cfg_, t_,
                     grad_scale);
}

}  // namespace llmt
