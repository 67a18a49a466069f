// The CPU backend: fp32 compute, matmuls through CBLAS (OpenBLAS), OpenMP across rows, heads or
// channels elsewhere. Every op follows the contract written in engine/backend/backend.h.
// Work is split so that no two threads write the same element: results do not depend on
// timing, only on the thread count (which fixes how partial sums are grouped).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace llmt {

namespace {

const float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(int threads) {
    nthreads_ = threads > 0 ? threads : omp_get_max_threads();
    openblas_set_num_threads(nthreads_);
  }
  std::string name() const override { return "cpu"; }
  int threads() const override { return nthreads_; }

  // ---- memory ----
  void* alloc(size_t bytes) override {
    size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    LLMT_CHECK(p != nullptr, "cpu backend: out of memory allocating %zu bytes", bytes);
    std::memset(p, 0, rounded);
    return p;
  }
  void release(void* p) override { std::free(p); }
  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void synchronize() override {}

  // ---- dense ----
  void matmul(Tensor out, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N, int64_t K, bool trans_a,
              bool trans_b, bool accumulate) override {
    float* o = out.f32();
    const float* A = a.f32();
    const float* Bm = b.f32();
    float beta = accumulate ? 1.0f : 0.0f;
    if (bias.data) {
      // out (=|+=) bias broadcast over rows, then the product is added on top.
      const float* bb = bias.f32();
#pragma omp parallel for num_threads(nthreads_)
      for (int64_t i = 0; i < M; i++) {
        float* row = o + i * N;
        if (accumulate)
          for (int64_t j = 0; j < N; j++) row[j] += bb[j];
        else
          for (int64_t j = 0; j < N; j++) row[j] = bb[j];
      }
      beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)M,
                (int)N, (int)K, 1.0f, A, trans_a ? (int)M : (int)K, Bm, trans_b ? (int)K : (int)N, beta, o, (int)N);
  }

  void bias_backward(Tensor dbias, Tensor dout, int64_t M, int64_t N) override {
    float* db = dbias.f32();
    const float* d = dout.f32();
    // Each thread owns a block of columns and walks every row.
#pragma omp parallel num_threads(nthreads_)
    {
      int nt = omp_get_num_threads(), id = omp_get_thread_num();
      int64_t per = (N + nt - 1) / nt, j0 = std::min<int64_t>(N, id * per), j1 = std::min<int64_t>(N, j0 + per);
      for (int64_t i = 0; i < M; i++) {
        const float* row = d + i * N;
        for (int64_t j = j0; j < j1; j++) db[j] += row[j];
      }
    }
  }

  // ---- embeddings ----
  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int B, int T, int C, int V) override {
    float* o = out.f32();
    const int32_t* tok = tokens.i32();
    const float* te = wte.f32();
    const float* pe = wpe.data ? wpe.f32() : nullptr;
    for (int64_t i = 0; i < (int64_t)B * T; i++)
      LLMT_CHECK(tok[i] >= 0 && tok[i] < V, "embedding: token id %d at position %lld is outside the vocabulary [0, %d)",
                 tok[i], (long long)i, V);
#pragma omp parallel for num_threads(nthreads_)
    for (int64_t i = 0; i < (int64_t)B * T; i++) {
      float* row = o + i * C;
      const float* e = te + (int64_t)tok[i] * C;
      if (pe) {
        const float* p = pe + (i % T) * C;
        for (int c = 0; c < C; c++) row[c] = e[c] + p[c];
      } else {
        std::memcpy(row, e, sizeof(float) * C);
      }
    }
  }

  void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int B, int T, int C) override {
    float* dte = dwte.f32();
    float* dpe = dwpe.data ? dwpe.f32() : nullptr;
    const float* d = dout.f32();
    const int32_t* tok = tokens.i32();
    // Split over channels: two tokens with the same id never race.
#pragma omp parallel num_threads(nthreads_)
    {
      int nt = omp_get_num_threads(), id = omp_get_thread_num();
      int per = (C + nt - 1) / nt, c0 = std::min(C, id * per), c1 = std::min(C, c0 + per);
      for (int64_t i = 0; i < (int64_t)B * T; i++) {
        const float* row = d + i * C;
        float* e = dte + (int64_t)tok[i] * C;
        for (int c = c0; c < c1; c++) e[c] += row[c];
        if (dpe) {
          float* p = dpe + (i % T) * C;
          for (int c = c0; c < c1; c++) p[c] += row[c];
        }
      }
    }
  }

  // ---- norms ----
  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b, int64_t N, int C,
                         float eps) override {
    float* o = out.f32();
    float* mu = mean.f32();
    float* rs = rstd.f32();
    const float* X = x.f32();
    const float* W = w.f32();
    const float* Bb = b.f32();
#pragma omp parallel for num_threads(nthreads_)
    for (int64_t i = 0; i < N; i++) {
      const float* xi = X + i * C;
      float m = 0.0f;
      for (int c = 0; c < C; c++) m += xi[c];
      m /= C;
      float var = 0.0f;
      for (int c = 0; c < C; c++) var += (xi[c] - m) * (xi[c] - m);
      var /= C;
      float r = 1.0f / std::sqrt(var + eps);
      float* oi = o + i * C;
      for (int c = 0; c < C; c++) oi[c] = (xi[c] - m) * r * W[c] + Bb[c];
      mu[i] = m;
      rs[i] = r;
    }
  }

  void layernorm_backward(Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w, Tensor mean, Tensor rstd,
                          int64_t N, int C) override {
    float* DX = dx.f32();
    float* DW = dw.f32();
    float* DB = db.f32();
    const float* D = dout.f32();
    const float* X = x.f32();
    const float* W = w.f32();
    const float* mu = mean.f32();
    const float* rs = rstd.f32();
    // Weight and bias gradients: per-thread partial sums over rows, reduced in thread order.
    std::vector<float> partial((size_t)nthreads_ * 2 * C, 0.0f);
#pragma omp parallel num_threads(nthreads_)
    {
      int nt = omp_get_num_threads(), id = omp_get_thread_num();
      float* pw = partial.data() + (size_t)id * 2 * C;
      float* pb = pw + C;
      int64_t per = (N + nt - 1) / nt, i0 = std::min<int64_t>(N, id * per), i1 = std::min<int64_t>(N, i0 + per);
      for (int64_t i = i0; i < i1; i++) {
        const float* xi = X + i * C;
        const float* di = D + i * C;
        float m = mu[i], r = rs[i];
        float mean_dn = 0.0f, mean_dn_n = 0.0f;  // means of dnorm and dnorm * norm over the row
        for (int c = 0; c < C; c++) {
          float n = (xi[c] - m) * r;
          float dn = di[c] * W[c];
          mean_dn += dn;
          mean_dn_n += dn * n;
          pw[c] += di[c] * n;
          pb[c] += di[c];
        }
        mean_dn /= C;
        mean_dn_n /= C;
        float* dxi = DX + i * C;
        for (int c = 0; c < C; c++) {
          float n = (xi[c] - m) * r;
          dxi[c] += (di[c] * W[c] - mean_dn - n * mean_dn_n) * r;
        }
      }
    }
    for (int t = 0; t < nthreads_; t++) {
      const float* pw = partial.data() + (size_t)t * 2 * C;
      for (int c = 0; c < C; c++) {
        DW[c] += pw[c];
        DB[c] += pw[C + c];
      }
    }
  }

  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, int64_t N, int C, float eps) override {
    float* o = out.f32();
    float* rs = rstd.f32();
    const float* X = x.f32();
    const float* W = w.f32();
#pragma omp parallel for num_threads(nthreads_)
    for (int64_t i = 0; i < N; i++) {
      const float* xi = X + i * C;
      float ss = 0.0f;
      for (int c = 0; c < C; c++) ss += xi[c] * xi[c];
      float r = 1.0f / std::sqrt(ss / C + eps);
      float* oi = o + i * C;
      for (int c = 0; c < C; c++) oi[c] = xi[c] * r * W[c];
      rs[i] = r;
    }
  }

  void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, int64_t N,
                        int C) override {
    float* DX = dx.f32();
    float* DW = dw.f32();
    const float* D = dout.f32();
    const float* X = x.f32();
    const float* W = w.f32();
    const float* rs = rstd.f32();
    std::vector<float> partial((size_t)nthreads_ * C, 0.0f);
#pragma omp parallel num_threads(nthreads_)
    {
      int nt = omp_get_num_threads(), id = omp_get_thread_num();
      float* pw = partial.data() + (size_t)id * C;
      int64_t per = (N + nt - 1) / nt, i0 = std::min<int64_t>(N, id * per), i1 = std::min<int64_t>(N, i0 + per);
      for (int64_t i = i0; i < i1; i++) {
        const float* xi = X + i * C;
        const float* di = D + i * C;
        float r = rs[i];
        float mean_dn_n = 0.0f;  // mean of dnorm * norm over the row
        for (int c = 0; c < C; c++) {
          float n = xi[c] * r;
          mean_dn_n += di[c] * W[c] * n;
          pw[c] += di[c] * n;
        }
        mean_dn_n /= C;
        float* dxi = DX + i * C;
        for (int c = 0; c < C; c++) dxi[c] += (di[c] * W[c] - xi[c] * r * mean_dn_n) * r;
      }
    }
    for (int t = 0; t < nthreads_; t++)
      for (int c = 0; c < C; c++) DW[c] += partial[(size_t)t * C + c];
  }

  // ---- activations ----
  void gelu_forward(Tensor out, Tensor x, int64_t n) override {
    float* o = out.f32();
    const float* X = x.f32();
#pragma omp parallel for simd num_threads(nthreads_)
    for (int64_t i = 0; i < n; i++) {
      float v = X[i];
      o[i] = 0.5f * v * (1.0f + std::tanh(kGeluScale * (v + 0.044715f * v * v * v)));
    }
  }

  void gelu_backward(Tensor dx, Tensor x, Tensor dout, int64_t n) override {
    float* DX = dx.f32();
    const float* X = x.f32();
    const float* D = dout.f32();
#pragma omp parallel for simd num_threads(nthreads_)
    for (int64_t i = 0; i < n; i++) {
      float v = X[i];
      float t = std::tanh(kGeluScale * (v + 0.044715f * v * v * v));
      float dt = (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
      DX[i] = D[i] * (0.5f * (1.0f + t) + 0.5f * v * dt);
    }
  }

  void swiglu_forward(Tensor out, Tensor gate_up, int64_t N, int I) override {
    float* o = out.f32();
    const float* gu = gate_up.f32();
#pragma omp parallel for num_threads(nthreads_)
    for (int64_t i = 0; i < N; i++) {
      const float* g = gu + i * 2 * I;
      const float* u = g + I;
      float* oi = o + i * I;
      for (int j = 0; j < I; j++) oi[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
    }
  }

  void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, int64_t N, int I) override {
    float* dgu = dgate_up.f32();
    const float* D = dout.f32();
    const float* gu = gate_up.f32();
#pragma omp parallel for num_threads(nthreads_)
    for (int64_t i = 0; i < N; i++) {
      const float* g = gu + i * 2 * I;
      const float* u = g + I;
      const float* di = D + i * I;
      float* dg = dgu + i * 2 * I;
      float* du = dg + I;
      for (int j = 0; j < I; j++) {
        float s = 1.0f / (1.0f + std::exp(-g[j]));
        du[j] = di[j] * g[j] * s;
        dg[j] = di[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
      }
    }
  }

  // ---- attention ----
  // cos/sin of pos * inv_freq[i] for pos < T, i < hs/2, computed in fp32 the way transformers does.
  static void rope_table(std::vector<float>& cs, std::vector<float>& sn, int T, int hs, float theta) {
    int half = hs / 2;
    cs.resize((size_t)T * half);
    sn.resize((size_t)T * half);
    for (int i = 0; i < half; i++) {
      float inv_freq = 1.0f / std::pow(theta, (float)(2 * i) / (float)hs);
      for (int t = 0; t < T; t++) {
        float angle = (float)t * inv_freq;
        cs[(size_t)t * half + i] = (float)std::cos((double)angle);
        sn[(size_t)t * half + i] = (float)std::sin((double)angle);
      }
    }
  }

  // Rotates the q and k heads of every token by +angle (forward) or -angle (backward).
  void rope_apply(Tensor qkv, int B, int T, int NH, int NKV, int hs, float theta, float sign) {
    LLMT_CHECK(hs % 2 == 0, "rope: head size %d is odd", hs);
    float* X = qkv.f32();
    std::vector<float> cs, sn;
    rope_table(cs, sn, T, hs, theta);
    int half = hs / 2;
    int64_t row = (int64_t)(NH + 2 * NKV) * hs;
#pragma omp parallel for num_threads(nthreads_)
    for (int64_t i = 0; i < (int64_t)B * T; i++) {
      int t = (int)(i % T);
      const float* c = cs.data() + (size_t)t * half;
      const float* s = sn.data() + (size_t)t * half;
      for (int h = 0; h < NH + NKV; h++) {  // q heads then k heads, contiguous in the row
        float* x = X + i * row + (int64_t)h * hs;
        for (int j = 0; j < half; j++) {
          float x1 = x[j], x2 = x[j + half], sj = sign * s[j];
          x[j] = x1 * c[j] - x2 * sj;
          x[j + half] = x2 * c[j] + x1 * sj;
        }
      }
    }
  }
  void rope_forward(Tensor qkv, int B, int T, int NH, int NKV, int hs, float theta) override {
    rope_apply(qkv, B, T, NH, NKV, hs, theta, 1.0f);
  }
  void rope_backward(Tensor dqkv, int B, int T, int NH, int NKV, int hs, float theta) override {
    rope_apply(dqkv, B, T, NH, NKV, hs, theta, -1.0f);  // a rotation's transpose is its inverse
  }

  void attention_forward(Tensor out, Tensor att, Tensor qkv, int B, int T, int NH, int NKV, int hs) override {
    LLMT_CHECK(NKV > 0 && NH % NKV == 0, "attention: %d heads do not group over %d kv heads", NH, NKV);
    float* O = out.f32();
    float* A = att.f32();
    const float* X = qkv.f32();
    int64_t row = (int64_t)(NH + 2 * NKV) * hs;
    int group = NH / NKV;
    float scale = 1.0f / std::sqrt((float)hs);
#pragma omp parallel for collapse(2) num_threads(nthreads_)
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        int kvh = h / group;
        const float* base = X + (int64_t)b * T * row;
        for (int t = 0; t < T; t++) {
          const float* q = base + t * row + (int64_t)h * hs;
          float* a = A + (((int64_t)b * NH + h) * T + t) * T;
          float maxv = -INFINITY;
          for (int t2 = 0; t2 <= t; t2++) {
            const float* k = base + t2 * row + (int64_t)(NH + kvh) * hs;
            float dot = 0.0f;
            for (int j = 0; j < hs; j++) dot += q[j] * k[j];
            a[t2] = dot * scale;
            maxv = std::max(maxv, a[t2]);
          }
          float sum = 0.0f;
          for (int t2 = 0; t2 <= t; t2++) {
            a[t2] = std::exp(a[t2] - maxv);
            sum += a[t2];
          }
          float inv = 1.0f / sum;
          for (int t2 = 0; t2 <= t; t2++) a[t2] *= inv;
          for (int t2 = t + 1; t2 < T; t2++) a[t2] = 0.0f;
          float* o = O + ((int64_t)b * T + t) * NH * hs + (int64_t)h * hs;
          for (int j = 0; j < hs; j++) o[j] = 0.0f;
          for (int t2 = 0; t2 <= t; t2++) {
            const float* v = base + t2 * row + (int64_t)(NH + NKV + kvh) * hs;
            float p = a[t2];
            for (int j = 0; j < hs; j++) o[j] += p * v[j];
          }
        }
      }
    }
  }

  void attention_backward(Tensor dqkv, Tensor datt, Tensor dout, Tensor qkv, Tensor att, int B, int T, int NH,
                          int NKV, int hs) override {
    float* DX = dqkv.f32();
    float* DA = datt.f32();
    const float* D = dout.f32();
    const float* X = qkv.f32();
    const float* A = att.f32();
    int64_t row = (int64_t)(NH + 2 * NKV) * hs;
    int group = NH / NKV;
    float scale = 1.0f / std::sqrt((float)hs);
    std::memset(DX, 0, sizeof(float) * (size_t)B * T * row);
    // One task per (batch, kv head): the heads that share a kv head add into its dk and dv in turn.
#pragma omp parallel for collapse(2) num_threads(nthreads_)
    for (int b = 0; b < B; b++) {
      for (int kvh = 0; kvh < NKV; kvh++) {
        const float* base = X + (int64_t)b * T * row;
        float* dbase = DX + (int64_t)b * T * row;
        for (int h = kvh * group; h < (kvh + 1) * group; h++) {
          for (int t = 0; t < T; t++) {
            const float* a = A + (((int64_t)b * NH + h) * T + t) * T;
            float* da = DA + (((int64_t)b * NH + h) * T + t) * T;
            const float* dout_t = D + ((int64_t)b * T + t) * NH * hs + (int64_t)h * hs;
            // through the weighted sum: datt = dout . v, dv += att * dout
            float dot_sum = 0.0f;  // sum over t2 of att * datt, for the softmax backward
            for (int t2 = 0; t2 <= t; t2++) {
              const float* v = base + t2 * row + (int64_t)(NH + NKV + kvh) * hs;
              float* dv = dbase + t2 * row + (int64_t)(NH + NKV + kvh) * hs;
              float dot = 0.0f;
              for (int j = 0; j < hs; j++) {
                dot += dout_t[j] * v[j];
                dv[j] += a[t2] * dout_t[j];
              }
              da[t2] = dot;
              dot_sum += a[t2] * dot;
            }
            // through softmax and the scaled dot product
            const float* q = base + t * row + (int64_t)h * hs;
            float* dq = dbase + t * row + (int64_t)h * hs;
            for (int t2 = 0; t2 <= t; t2++) {
              float ds = a[t2] * (da[t2] - dot_sum) * scale;
              const float* k = base + t2 * row + (int64_t)(NH + kvh) * hs;
              float* dk = dbase + t2 * row + (int64_t)(NH + kvh) * hs;
              for (int j = 0; j < hs; j++) {
                dq[j] += ds * k[j];
                dk[j] += ds * q[j];
              }
            }
          }
        }
      }
    }
  }

  // ---- elementwise ----
  void add(Tensor out, Tensor a, Tensor b, int64_t n) override {
    float* o = out.f32();
    const float* A = a.f32();
    const float* Bv = b.f32();
#pragma omp parallel for simd num_threads(nthreads_)
    for (int64_t i = 0; i < n; i++) o[i] = A[i] + Bv[i];
  }
  void accumulate(Tensor dst, Tensor src, int64_t n) override {
    float* d = dst.f32();
    const float* s = src.f32();
#pragma omp parallel for simd num_threads(nthreads_)
    for (int64_t i = 0; i < n; i++) d[i] += s[i];
  }
  void scale(Tensor x, float s, int64_t n) override {
    float* X = x.f32();
#pragma omp parallel for simd num_threads(nthreads_)
    for (int64_t i = 0; i < n; i++) X[i] *= s;
  }

  // ---- loss ----
  double cross_entropy(Tensor dlogits, Tensor logits, Tensor targets, int64_t N, int V, float grad_scale) override {
    const float* L = logits.f32();
    float* DL = dlogits.data ? dlogits.f32() : nullptr;
    const int32_t* tg = targets.i32();
    for (int64_t i = 0; i < N; i++)
      LLMT_CHECK(tg[i] == -100 || (tg[i] >= 0 && tg[i] < V),
                 "cross_entropy: target %d at row %lld is outside the vocabulary [0, %d) and is not -100", tg[i],
                 (long long)i, V);
    double total = 0.0;
#pragma omp parallel for reduction(+ : total) num_threads(nthreads_)
    for (int64_t i = 0; i < N; i++) {
      const float* l = L + i * V;
      float* dl = DL ? DL + i * V : nullptr;
      int target = tg[i];
      if (target == -100) {
        if (dl) std::memset(dl, 0, sizeof(float) * V);
        continue;
      }
      float maxv = -INFINITY;
      for (int j = 0; j < V; j++) maxv = std::max(maxv, l[j]);
      float target_logit = l[target];
      double sum = 0.0;
      if (dl) {
        // dl may alias l: keep exp(l - max) in dl, then normalise in place.
        for (int j = 0; j < V; j++) {
          dl[j] = std::exp(l[j] - maxv);
          sum += dl[j];
        }
        float f = (float)(grad_scale / sum);
        for (int j = 0; j < V; j++) dl[j] *= f;
        dl[target] -= grad_scale;
      } else {
        for (int j = 0; j < V; j++) sum += std::exp(l[j] - maxv);
      }
      total += std::log(sum) + maxv - target_logit;
    }
    return total;
  }

  // ---- optimizer and reductions ----
  void adamw(Tensor p, Tensor g, Tensor m, Tensor v, int64_t n, float lr, float beta1, float beta2, float eps,
             float weight_decay, int t, float grad_scale) override {
    float* P = p.f32();
    const float* G = g.f32();
    float* Mm = m.f32();
    float* Vv = v.f32();
    float bc1 = 1.0f - std::pow(beta1, (float)t);
    float bc2 = 1.0f - std::pow(beta2, (float)t);
    float step_size = lr / bc1;
    float bc2_sqrt = std::sqrt(bc2);
    float decay = 1.0f - lr * weight_decay;
#pragma omp parallel for simd num_threads(nthreads_)
    for (int64_t i = 0; i < n; i++) {
      float gi = G[i] * grad_scale;
      float mi = beta1 * Mm[i] + (1.0f - beta1) * gi;
      float vi = beta2 * Vv[i] + (1.0f - beta2) * gi * gi;
      Mm[i] = mi;
      Vv[i] = vi;
      P[i] = P[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
    }
  }

  double sum_squares(Tensor x, int64_t n) override {
    const float* X = x.f32();
    double total = 0.0;
#pragma omp parallel for reduction(+ : total) num_threads(nthreads_)
    for (int64_t i = 0; i < n; i++) total += (double)X[i] * X[i];
    return total;
  }

  // ---- dtype conversion ----
  void convert(Tensor out, Tensor in, int64_t n) override {
    if (in.dtype == DType::f32 && out.dtype == DType::bf16) {
      const float* s = in.f32();
      uint16_t* d = out.bf16();
#pragma omp parallel for num_threads(nthreads_)
      for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16(s[i]);
    } else if (in.dtype == DType::bf16 && out.dtype == DType::f32) {
      const uint16_t* s = in.bf16();
      float* d = out.f32();
#pragma omp parallel for num_threads(nthreads_)
      for (int64_t i = 0; i < n; i++) d[i] = bf16_to_f32(s[i]);
    } else {
      fail("convert: %s to %s is not supported", dtype_name(in.dtype), dtype_name(out.dtype));
    }
  }

 private:
  int nthreads_ = 1;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace llmt
