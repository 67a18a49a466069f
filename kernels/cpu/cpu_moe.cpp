#include "kernels/cpu/cpu_moe.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace llmt::cpu_moe {

namespace {

inline float ld(const float* p, int64_t i) { return p[i]; }
inline float ld(const uint16_t* p, int64_t i) { return bf16_to_f32(p[i]); }
inline void st(float* p, int64_t i, float v) { p[i] = v; }
inline void st(uint16_t* p, int64_t i, float v) { p[i] = f32_to_bf16(v); }

// f(A{}) with A the element type of act tensors
template <class F>
void by_act(bool bf16, F&& f) {
  if (bf16) f(uint16_t{});
  else f(float{});
}

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

// PyTorch's comparator for largest-first: NaN counts as the largest, then by value alone (the index
// takes no part: ties are left where the algorithms put them, which is what this reproduces).
void topk_row(const float* x, int E, int k, int32_t* idx) {
  using Elem = std::pair<float, int64_t>;
  static thread_local std::vector<Elem> queue;  // grows once; no allocation per call after that
  queue.resize((size_t)E);
  for (int e = 0; e < E; e++) queue[(size_t)e] = {x[e], e};
  auto greater = [](const Elem& a, const Elem& b) {
    return (std::isnan(a.first) && !std::isnan(b.first)) || a.first > b.first;
  };
  if ((int64_t)k * 64 <= E) {
    std::partial_sort(queue.begin(), queue.begin() + k, queue.end(), greater);
  } else {
    std::nth_element(queue.begin(), queue.begin() + (k - 1), queue.end(), greater);
    std::sort(queue.begin(), queue.begin() + (k - 1), greater);
  }
  for (int s = 0; s < k; s++) idx[s] = (int32_t)queue[(size_t)s].second;
}

void route(bool bf16, Tensor topk_idx, Tensor topk_w, Tensor probs, Tensor stats, Tensor logits, int64_t N, int E,
           int k, bool norm_topk, bool round_w, int threads) {
  by_act(bf16, [&](auto tag) {
    using A = decltype(tag);
    const A* lg = (const A*)logits.data;
    float* p = probs.f32();
    int32_t* idx = topk_idx.i32();
    float* w = topk_w.f32();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < N; t++) {
      // softmax in fp32, as transformers' softmax(router_logits, dtype=float)
      float* pt = p + t * E;
      float mx = -INFINITY;
      for (int e = 0; e < E; e++) mx = std::max(mx, ld(lg, t * E + e));
      float sum = 0.0f;
      for (int e = 0; e < E; e++) sum += pt[e] = std::exp(ld(lg, t * E + e) - mx);
      for (int e = 0; e < E; e++) pt[e] /= sum;
      topk_row(pt, E, k, idx + t * k);
      float top = 0.0f;
      for (int s = 0; s < k; s++) top += pt[idx[t * k + s]];
      for (int s = 0; s < k; s++) {
        float v = pt[idx[t * k + s]];
        if (norm_topk) v /= top;
        if (round_w && bf16) v = bf16_to_f32(f32_to_bf16(v));
        w[t * k + s] = v;
      }
    }
    if (!stats.data) return;
    float* counts = stats.f32();
    float* prob_sum = counts + E;
    for (int64_t i = 0; i < N * k; i++) counts[idx[i]] += 1.0f;  // exact: integers
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int e = 0; e < E; e++) {  // each expert's column in token order
      float s = 0.0f;
      for (int64_t t = 0; t < N; t++) s += p[t * E + e];
      prob_sum[e] += s;
    }
  });
}

void route_backward(bool bf16, Tensor dlogits, Tensor dtopk_w, Tensor probs, Tensor topk_idx, Tensor aux_grad,
                    int64_t N, int E, int k, bool norm_topk, int threads) {
  by_act(bf16, [&](auto tag) {
    using A = decltype(tag);
    A* dl = (A*)dlogits.data;
    const float* p = probs.f32();
    const float* dw = dtopk_w.f32();
    const int32_t* idx = topk_idx.i32();
    const float* aux = aux_grad.data ? aux_grad.f32() : nullptr;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < N; t++) {
      static thread_local std::vector<float> dp;
      dp.assign((size_t)E, 0.0f);
      const float* pt = p + t * E;
      const int32_t* it = idx + t * k;
      if (norm_topk) {  // w_s = p_s / S over the chosen: dp_s = (dw_s - sum_j dw_j w_j) / S
        float S = 0.0f, dot = 0.0f;
        for (int s = 0; s < k; s++) S += pt[it[s]];
        for (int s = 0; s < k; s++) dot += dw[t * k + s] * (pt[it[s]] / S);
        for (int s = 0; s < k; s++) dp[(size_t)it[s]] = (dw[t * k + s] - dot) / S;
      } else {
        for (int s = 0; s < k; s++) dp[(size_t)it[s]] = dw[t * k + s];
      }
      if (aux)
        for (int e = 0; e < E; e++) dp[(size_t)e] += aux[e];
      float pdp = 0.0f;  // softmax: dlogit_e = p_e (dp_e - sum_j p_j dp_j)
      for (int e = 0; e < E; e++) pdp += pt[e] * dp[(size_t)e];
      for (int e = 0; e < E; e++) st(dl, t * E + e, pt[e] * (dp[(size_t)e] - pdp));
    }
  });
}

void dispatch(bool bf16, Tensor offsets, Tensor pos, Tensor xg, Tensor x, Tensor topk_idx, int64_t N, int E, int k,
              int C, int threads) {
  int32_t* off = offsets.i32();
  int32_t* ps = pos.i32();
  const int32_t* idx = topk_idx.i32();
  // a counting sort, stable: within an expert, assignments in token order (then slot order)
  std::fill(off, off + E + 1, 0);
  for (int64_t i = 0; i < N * k; i++) {
    LLMT_CHECK(idx[i] >= 0 && idx[i] < E, "cpu moe_dispatch: assignment %lld chose expert %d of %d", (long long)i,
               idx[i], E);
    off[idx[i] + 1]++;
  }
  for (int e = 0; e < E; e++) off[e + 1] += off[e];
  static thread_local std::vector<int32_t> cursor;
  cursor.assign(off, off + E);
  for (int64_t i = 0; i < N * k; i++) ps[i] = cursor[(size_t)idx[i]]++;
  if (!xg.data) return;
  by_act(bf16, [&](auto tag) {
    using A = decltype(tag);
    const A* src = (const A*)x.data;
    A* dst = (A*)xg.data;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < N * k; i++)
      std::copy(src + (i / k) * C, src + (i / k) * C + C, dst + (int64_t)ps[i] * C);
  });
}

void undispatch(bool bf16, Tensor dx, Tensor dxg, Tensor pos, int64_t N, int k, int C, int threads) {
  by_act(bf16, [&](auto tag) {
    using A = decltype(tag);
    A* d = (A*)dx.data;
    const A* g = (const A*)dxg.data;
    const int32_t* ps = pos.i32();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < N; t++)
      for (int c = 0; c < C; c++) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) s += ld(g, (int64_t)ps[t * k + j] * C + c);
        st(d, t * C + c, ld(d, t * C + c) + s);
      }
  });
}

void combine(bool bf16, Tensor out, Tensor residual, Tensor y, Tensor topk_w, Tensor pos, Tensor shared, Tensor gate,
             int64_t N, int k, int C, int threads) {
  by_act(bf16, [&](auto tag) {
    using A = decltype(tag);
    A* o = (A*)out.data;
    const A *r = (const A*)residual.data, *yy = (const A*)y.data, *sh = (const A*)shared.data,
            *gt = (const A*)gate.data;
    const float* w = topk_w.f32();
    const int32_t* ps = pos.i32();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < N; t++) {
      const float g = sh ? sigmoid(ld(gt, t)) : 0.0f;
      for (int c = 0; c < C; c++) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++) acc += w[t * k + j] * ld(yy, (int64_t)ps[t * k + j] * C + c);
        if (sh) acc += g * ld(sh, t * C + c);
        st(o, t * C + c, ld(r, t * C + c) + acc);
      }
    }
  });
}

void combine_backward(bool bf16, Tensor dy, Tensor dtopk_w, Tensor dshared, Tensor dgate, Tensor dout, Tensor y,
                      Tensor topk_w, Tensor pos, Tensor shared, Tensor gate, int64_t N, int k, int C, int threads) {
  by_act(bf16, [&](auto tag) {
    using A = decltype(tag);
    A *d_y = (A*)dy.data, *d_sh = (A*)dshared.data, *d_g = (A*)dgate.data;
    const A *g_out = (const A*)dout.data, *yy = (const A*)y.data, *sh = (const A*)shared.data,
            *gt = (const A*)gate.data;
    const float* w = topk_w.f32();
    float* dw = dtopk_w.f32();
    const int32_t* ps = pos.i32();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < N; t++) {
      for (int j = 0; j < k; j++) {
        const int64_t row = (int64_t)ps[t * k + j] * C;
        float dot = 0.0f;
        for (int c = 0; c < C; c++) {
          const float go = ld(g_out, t * C + c);
          dot += go * ld(yy, row + c);
          st(d_y, row + c, w[t * k + j] * go);
        }
        dw[t * k + j] = dot;
      }
      if (!sh) continue;
      const float g = sigmoid(ld(gt, t));
      float dot = 0.0f;
      for (int c = 0; c < C; c++) {
        const float go = ld(g_out, t * C + c);
        dot += go * ld(sh, t * C + c);
        st(d_sh, t * C + c, g * go);
      }
      st(d_g, t, dot * g * (1.0f - g));
    }
  });
}

void aux_loss(Tensor loss, Tensor grad, Tensor stats, int E, double rows, float coef, float grad_scale) {
  const float* counts = stats.f32();
  const float* prob_sum = counts + E;
  double aux = 0.0;
  for (int e = 0; e < E; e++) aux += ((double)counts[e] / rows) * ((double)prob_sum[e] / rows);
  *(double*)loss.data += (double)coef * E * aux;
  float* g = grad.f32();
  for (int e = 0; e < E; e++) g[e] = (float)((double)grad_scale * coef * E * counts[e] / (rows * rows));
}

}  // namespace llmt::cpu_moe
