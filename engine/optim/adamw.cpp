#include "engine/optim/adamw.h"

#include <algorithm>

namespace llmt {

void adamw_step_range(Backend& be, const UnitLayout& unit, int64_t lo, int64_t hi, Tensor p, Tensor p_compute, Tensor g,
                      Tensor m, Tensor v, float lr, const AdamWConfig& cfg, int t, float grad_scale) {
  // One call for the tensors overlapping the range, their decay as spans (one launch per shard on a
  // GPU, where a call per tensor was ~150 launches a GPT-2 step); a new call where the spans would
  // overflow a call's. The alignment gaps between a unit's tensors (kParamAlign) ride along: they
  // hold zeros with zero gradients, which AdamW leaves zero, decayed or not, so a decaying tensor's
  // span runs on over the gap to the next decaying one.
  int64_t first = -1, last = -1;  // the current call's elements, relative to lo
  DecaySpans spans;
  auto flush = [&] {
    if (first < 0) return;
    const int64_t n = last - first;
    for (int s = 0; s < spans.count; s++) spans.begin[s] -= first, spans.end[s] -= first;
    be.adamw(p.view(first, {n}), p_compute.data ? p_compute.view(first, {n}) : Tensor(), g.view(first, {n}),
             m.view(first, {n}), v.view(first, {n}), n, lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, spans, t,
             grad_scale);
    first = last = -1;
    spans = DecaySpans();
  };
  for (const ParamSpec& s : unit.params) {
    const int64_t a = std::max(lo, s.offset) - lo, b = std::min(hi, s.offset + s.numel()) - lo;
    if (a >= b) continue;
    bool extends_span = s.decay && spans.count > 0 && spans.end[spans.count - 1] == last;
    if (first >= 0 && s.decay && !extends_span && spans.count == DecaySpans::kMax) {
      flush();
      extends_span = false;
    }
    if (first < 0) first = a;
    last = b;
    if (!s.decay) continue;
    if (extends_span) spans.end[spans.count - 1] = b;
    else spans.begin[spans.count] = a, spans.end[spans.count] = b, spans.count++;
  }
  flush();
}

}  // namespace llmt
