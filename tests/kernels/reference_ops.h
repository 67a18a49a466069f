// Double-precision reference implementations of the Backend ops (engine/backend/backend.h),
// written as plain loops straight from the math, for tests/kernels/test_cpu_ops.cpp.
// They share no code with kernels/: a backend is checked against these, never against itself.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

namespace llmt_ref {

using DV = std::vector<double>;

// out[M,N] (= or +=) op(a) @ op(b) + bias[N]; a stored [M,K] (or [K,M] when ta), b stored [K,N] (or [N,K] when tb).
inline void matmul(DV& out, const DV& a, const DV& b, const DV* bias, int64_t M, int64_t N, int64_t K, bool ta,
                   bool tb, bool accumulate) {
  out.resize((size_t)(M * N), 0.0);
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      double s = bias ? (*bias)[n] : 0.0;
      for (int64_t k = 0; k < K; k++) {
        double av = ta ? a[k * M + m] : a[m * K + k];
        double bv = tb ? b[n * K + k] : b[k * N + n];
        s += av * bv;
      }
      out[m * N + n] = (accumulate ? out[m * N + n] : 0.0) + s;
    }
}

// out[B*T,C] = wte[tok] + wpe[t] (wpe may be null)
inline DV embedding(const std::vector<int32_t>& tok, const DV& wte, const DV* wpe, int B, int T, int C) {
  DV out((size_t)B * T * C);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      int64_t row = (int64_t)b * T + t;
      for (int c = 0; c < C; c++)
        out[row * C + c] = wte[(int64_t)tok[row] * C + c] + (wpe ? (*wpe)[(int64_t)t * C + c] : 0.0);
    }
  return out;
}

// LayerNorm over rows of C, biased variance: out = (x - mean) / sqrt(var + eps) * w + b
inline DV layernorm(const DV& x, const DV& w, const DV& b, int64_t N, int C, double eps, DV* mean = nullptr,
                    DV* rstd = nullptr) {
  DV out(x.size());
  if (mean) mean->assign((size_t)N, 0.0);
  if (rstd) rstd->assign((size_t)N, 0.0);
  for (int64_t n = 0; n < N; n++) {
    const double* xr = &x[n * C];
    double mu = 0;
    for (int c = 0; c < C; c++) mu += xr[c];
    mu /= C;
    double var = 0;
    for (int c = 0; c < C; c++) var += (xr[c] - mu) * (xr[c] - mu);
    var /= C;
    double rs = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < C; c++) out[n * C + c] = (xr[c] - mu) * rs * w[c] + b[c];
    if (mean) (*mean)[n] = mu;
    if (rstd) (*rstd)[n] = rs;
  }
  return out;
}

// RMSNorm: out = x / sqrt(mean(x^2) + eps) * w
inline DV rmsnorm(const DV& x, const DV& w, int64_t N, int C, double eps, DV* rstd = nullptr) {
  DV out(x.size());
  if (rstd) rstd->assign((size_t)N, 0.0);
  for (int64_t n = 0; n < N; n++) {
    double ms = 0;
    for (int c = 0; c < C; c++) ms += x[n * C + c] * x[n * C + c];
    ms /= C;
    double rs = 1.0 / std::sqrt(ms + eps);
    for (int c = 0; c < C; c++) out[n * C + c] = x[n * C + c] * rs * w[c];
    if (rstd) (*rstd)[n] = rs;
  }
  return out;
}

// GELU, tanh approximation (Hugging Face gelu_new)
inline double gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
inline DV gelu(const DV& x) {
  DV out(x.size());
  for (size_t i = 0; i < x.size(); i++) out[i] = gelu(x[i]);
  return out;
}

// SwiGLU: rows of gate_up[N, 2I] = [gate | up]; out[N,I] = silu(gate) * up
inline DV swiglu(const DV& gu, int64_t N, int I) {
  DV out((size_t)(N * I));
  for (int64_t n = 0; n < N; n++)
    for (int i = 0; i < I; i++) {
      double g = gu[n * 2 * I + i], u = gu[n * 2 * I + I + i];
      out[n * I + i] = g / (1.0 + std::exp(-g)) * u;
    }
  return out;
}

// GeGLU (Gemma's MLP): out[N,I] = gelu_tanh(gate) * up over rows [gate | up]
inline DV geglu(const DV& gu, int64_t N, int I) {
  DV out((size_t)(N * I));
  for (int64_t n = 0; n < N; n++)
    for (int i = 0; i < I; i++) out[n * I + i] = gelu(gu[n * 2 * I + i]) * gu[n * 2 * I + I + i];
  return out;
}

// transformers' rope_scaling in double: linear divides every inv_freq by factor; llama3 divides those
// whose wavelength 2 pi / inv_freq exceeds original / low, keeps those below original / high, and in
// between blends (1 - s) inv_freq / factor + s inv_freq with s = (original / wavelength - low) / (high - low);
// longrope divides inv_freq i by ext[i] and scales cos and sin by attn. Only the first rotary_dim
// channels of a head rotate (0: all), with frequencies theta^(-2i / rotary_dim).
struct RopeRef {
  double theta = 10000.0;
  int scaling = 0;  // 0 none, 1 linear, 2 llama3, 3 longrope
  double factor = 1.0, low = 1.0, high = 4.0, original = 8192.0;
  int rotary_dim = 0;
  double attn = 1.0;
  std::vector<double> ext;
};
inline double rope_inv_freq_ref(const RopeRef& r, int i, int hs) {
  const int d = r.rotary_dim > 0 ? r.rotary_dim : hs;
  const double f = std::pow(r.theta, -2.0 * i / d);
  if (r.scaling == 3) return f / r.ext.at((size_t)i);
  if (r.scaling == 1) return f / r.factor;
  if (r.scaling != 2) return f;
  const double wavelen = 2.0 * M_PI / f;
  if (wavelen > r.original / r.low) return f / r.factor;
  if (wavelen < r.original / r.high) return f;
  const double s = (r.original / wavelen - r.low) / (r.high - r.low);
  return (1.0 - s) * f / r.factor + s * f;
}

// RoPE, Hugging Face rotate_half layout, on the q (NH heads) and k (NKV heads) parts of each qkv row;
// position of row (b,t) is t; inv_freq[i] = rope_inv_freq_ref(r, i, hs); v and each head's channels
// past rotary_dim are untouched.
inline DV rope(const DV& qkv, int B, int T, int NH, int NKV, int hs, const RopeRef& r) {
  DV out = qkv;
  const int R = (NH + 2 * NKV) * hs, half = (r.rotary_dim > 0 ? r.rotary_dim : hs) / 2;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      int64_t base = ((int64_t)b * T + t) * R;
      for (int h = 0; h < NH + NKV; h++) {  // the q heads, then the k heads, are contiguous
        const double* x = &qkv[base + (int64_t)h * hs];
        double* y = &out[base + (int64_t)h * hs];
        for (int i = 0; i < half; i++) {
          double inv_freq = rope_inv_freq_ref(r, i, hs);
          double ang = t * inv_freq, c = r.attn * std::cos(ang), s = r.attn * std::sin(ang);
          y[i] = x[i] * c - x[i + half] * s;
          y[i + half] = x[i + half] * c + x[i] * s;
        }
      }
    }
  return out;
}

// Causal grouped-query attention. out[B*T, NH*hs]; lse[B,NH,T] the log-sum-exp of each query row's
// scaled scores; drop(b, h, t, u), when given, multiplies probability (t, u) after the softmax
// (dropout: 0 or 1/(1-p)). window > 0: query t sees keys t - window < u <= t only (transformers'
// sliding_window_overlay: kv_idx > q_idx - sliding_window). Scores as transformers' Gemma 2
// eager_attention_forward: s = scale q.k (scale 0: 1/sqrt(hs)), then softcap > 0: softcap tanh(s /
// softcap), before the mask and the softmax.
using DropFn = std::function<double(int b, int h, int t, int u)>;
inline int first_key(int t, int window) { return window > 0 ? std::max(0, t - window + 1) : 0; }
struct Scores {
  double scale = 0.0, softcap = 0.0;
  double scale_for(int hs) const { return scale > 0.0 ? scale : 1.0 / std::sqrt((double)hs); }
  double cap(double s) const { return softcap > 0.0 ? softcap * std::tanh(s / softcap) : s; }
  double dcap(double s) const {  // d cap(s) / ds
    if (softcap <= 0.0) return 1.0;
    const double t = std::tanh(s / softcap);
    return 1.0 - t * t;
  }
};
inline DV attention(const DV& qkv, int B, int T, int NH, int NKV, int hs, DV* lse_out = nullptr,
                    const DropFn& drop = nullptr, int window = 0, const Scores& sc = Scores()) {
  const int R = (NH + 2 * NKV) * hs, group = NH / NKV;
  const double scale = sc.scale_for(hs);
  DV out((size_t)B * T * NH * hs, 0.0);
  if (lse_out) lse_out->assign((size_t)B * NH * T, 0.0);
  std::vector<double> p((size_t)T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      int kh = h / group;
      for (int t = 0; t < T; t++) {
        const double* q = &qkv[((int64_t)b * T + t) * R + (int64_t)h * hs];
        double mx = -1e300;
        const int u0 = first_key(t, window);
        for (int u = u0; u <= t; u++) {
          const double* k = &qkv[((int64_t)b * T + u) * R + (int64_t)NH * hs + (int64_t)kh * hs];
          double s = 0;
          for (int d = 0; d < hs; d++) s += q[d] * k[d];
          p[u] = sc.cap(s * scale);
          mx = std::max(mx, p[u]);
        }
        double z = 0;
        for (int u = u0; u <= t; u++) z += (p[u] = std::exp(p[u] - mx));
        for (int u = u0; u <= t; u++) p[u] /= z;
        if (lse_out) (*lse_out)[((int64_t)b * NH + h) * T + t] = mx + std::log(z);
        double* o = &out[((int64_t)b * T + t) * NH * hs + (int64_t)h * hs];
        for (int u = u0; u <= t; u++) {
          const double* v = &qkv[((int64_t)b * T + u) * R + (int64_t)(NH + NKV) * hs + (int64_t)kh * hs];
          double pu = drop ? p[u] * drop(b, h, t, u) : p[u];
          for (int d = 0; d < hs; d++) o[d] += pu * v[d];
        }
      }
    }
  return out;
}

// attention's gradient, analytically: the dqkv for which sum(attention(qkv) * dout) changes by
// dqkv . dqkv_step. Per query row t: P = softmax(scale q k^T), dP = (dout_t . v_u) drop(t, u),
// dS = P (dP - sum_u P dP), dq = scale dS k, dk_u += scale dS_u q, dv_u += P_u drop(t, u) dout_t;
// with a soft cap, dS takes the cap's derivative 1 - tanh^2(scale q.k / softcap) too.
inline DV attention_backward(const DV& qkv, const DV& dout, int B, int T, int NH, int NKV, int hs,
                             const DropFn& drop = nullptr, int window = 0, const Scores& sc = Scores()) {
  const int R = (NH + 2 * NKV) * hs, group = NH / NKV;
  const double scale = sc.scale_for(hs);
  DV dqkv(qkv.size(), 0.0);
  std::vector<double> p((size_t)T), dp((size_t)T), dc((size_t)T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const int64_t qrow = ((int64_t)b * T + t) * R + (int64_t)h * hs;
        const double* q = &qkv[qrow];
        const double* g = &dout[((int64_t)b * T + t) * NH * hs + (int64_t)h * hs];
        auto key = [&](int u) { return ((int64_t)b * T + u) * R + (int64_t)(NH + h / group) * hs; };
        auto val = [&](int u) { return key(u) + (int64_t)NKV * hs; };
        double mx = -1e300, z = 0, D = 0;
        const int u0 = first_key(t, window);
        for (int u = u0; u <= t; u++) {
          double s = 0, d = 0;
          for (int c = 0; c < hs; c++) s += q[c] * qkv[key(u) + c], d += g[c] * qkv[val(u) + c];
          p[u] = sc.cap(s * scale);
          dc[u] = sc.dcap(s * scale);
          dp[u] = drop ? d * drop(b, h, t, u) : d;
          mx = std::max(mx, p[u]);
        }
        for (int u = u0; u <= t; u++) z += (p[u] = std::exp(p[u] - mx));
        for (int u = u0; u <= t; u++) D += (p[u] /= z) * dp[u];
        for (int u = u0; u <= t; u++) {
          const double ds = p[u] * (dp[u] - D) * scale * dc[u], pv = drop ? p[u] * drop(b, h, t, u) : p[u];
          for (int c = 0; c < hs; c++) {
            dqkv[qrow + c] += ds * qkv[key(u) + c];
            dqkv[key(u) + c] += ds * q[c];
            dqkv[val(u) + c] += pv * g[c];
          }
        }
      }
  return dqkv;
}

// Sum over rows whose target != -100 of -log softmax(logits[n])[target[n]]; softcap > 0: of the
// logits capped first, softcap tanh(logits / softcap) (Gemma2ForCausalLM's final_logit_softcapping).
inline double cross_entropy(const DV& logits_in, const std::vector<int32_t>& targets, int64_t N, int V,
                            double softcap = 0.0) {
  DV logits = logits_in;
  if (softcap > 0.0)
    for (double& x : logits) x = softcap * std::tanh(x / softcap);
  double total = 0;
  for (int64_t n = 0; n < N; n++) {
    if (targets[n] == -100) continue;
    const double* x = &logits[n * V];
    double mx = *std::max_element(x, x + V);
    double z = 0;
    for (int j = 0; j < V; j++) z += std::exp(x[j] - mx);
    total += mx + std::log(z) - x[targets[n]];
  }
  return total;
}

// One step of torch.optim.AdamW (_single_tensor_adamw), gradient scaled by grad_scale first;
// element i decays with wd[i] (one AdamW call over tensors that decay and tensors that do not).
inline void adamw(DV& p, const DV& g, DV& m, DV& v, double lr, double beta1, double beta2, double eps, const DV& wd,
                  int t, double grad_scale) {
  double bc1 = 1.0 - std::pow(beta1, t), bc2 = 1.0 - std::pow(beta2, t);
  double step_size = lr / bc1, bc2_sqrt = std::sqrt(bc2);
  for (size_t i = 0; i < p.size(); i++) {
    double gi = g[i] * grad_scale;
    p[i] *= 1.0 - lr * wd[i];
    m[i] = beta1 * m[i] + (1.0 - beta1) * gi;
    v[i] = beta2 * v[i] + (1.0 - beta2) * gi * gi;
    double denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] -= step_size * m[i] / denom;
  }
}

}  // namespace llmt_ref
