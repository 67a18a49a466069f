// The mixture-of-experts ops (engine/backend/backend.h, "mixture of experts") on the CPU backend, fp32
// and bf16, against double-precision references and central finite differences (as test_ops.cpp
// checks the dense ops): routing with torch.topk's tie rule (tests/reference/moe_topk_ties.json),
// the grouping's stable order, each expert's products (an expert with no rows included), the combine
// with and without a shared expert, the load-balancing loss; and the CUDA backend's refusal until its
// kernels exist.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "engine/backend/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/test_util.h"
#include "tests/tolerances.h"

namespace {

using llmt::Backend;
using llmt::DType;
using llmt::Tensor;
using DV = std::vector<double>;
using FV = std::vector<float>;
using IV = std::vector<int32_t>;
namespace tol = llmt_test::tol;

class MoeOps : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { be_ = llmt::make_cpu_backend(2, GetParam()); }
  bool bf16() const { return GetParam() == DType::bf16; }
  double fwd_tol() const { return bf16() ? tol::kBf16OpForward : tol::kF32OpForward; }
  double grad_tol() const { return bf16() ? tol::kBf16OpBackward : tol::kF32OpBackward; }
  float rep(float x) const { return bf16() ? llmt::bf16_to_f32(llmt::f32_to_bf16(x)) : x; }
  FV rand_act(std::mt19937& rng, size_t n, float lo = -1.f, float hi = 1.f) {
    std::uniform_real_distribution<float> d(lo, hi);
    FV v(n);
    for (auto& x : v) x = rep(d(rng));
    return v;
  }
  // a backend buffer holding host values: floats in the act dtype (act), or as given
  struct Buf {
    Backend& be;
    void* p;
    size_t bytes;
    DType dt;
    Buf(Backend& b, size_t n_bytes, DType t) : be(b), p(b.alloc(n_bytes ? n_bytes : 4)), bytes(n_bytes), dt(t) {}
    ~Buf() { be.release(p); }
    Tensor t(std::initializer_list<int64_t> dims) const { return Tensor(p, dt, dims); }
    FV floats() const {  // f32 or act contents
      FV out(bytes / llmt::dtype_size(dt));
      if (dt == DType::f32) {
        be.copy_to_host(out.data(), p, bytes);
      } else {
        std::vector<uint16_t> h(out.size());
        be.copy_to_host(h.data(), p, bytes);
        for (size_t i = 0; i < h.size(); i++) out[i] = llmt::bf16_to_f32(h[i]);
      }
      return out;
    }
    IV ints() const {
      IV out(bytes / 4);
      be.copy_to_host(out.data(), p, bytes);
      return out;
    }
  };
  std::unique_ptr<Buf> act(const FV& v) {
    auto b = std::make_unique<Buf>(*be_, v.size() * llmt::dtype_size(GetParam()), GetParam());
    if (bf16()) {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); i++) h[i] = llmt::f32_to_bf16(v[i]);
      be_->copy_from_host(b->p, h.data(), b->bytes);
    } else {
      be_->copy_from_host(b->p, v.data(), b->bytes);
    }
    return b;
  }
  std::unique_ptr<Buf> f32(const FV& v) {
    auto b = std::make_unique<Buf>(*be_, v.size() * 4, DType::f32);
    be_->copy_from_host(b->p, v.data(), b->bytes);
    return b;
  }
  std::unique_ptr<Buf> i32(const IV& v) {
    auto b = std::make_unique<Buf>(*be_, v.size() * 4, DType::i32);
    be_->copy_from_host(b->p, v.data(), b->bytes);
    return b;
  }
  std::unique_ptr<Buf> f64(double v) {
    auto b = std::make_unique<Buf>(*be_, 8, DType::f64);
    be_->copy_from_host(b->p, &v, 8);
    return b;
  }
  std::unique_ptr<Backend> be_;
};

::testing::AssertionResult Close(const FV& got, const DV& want, double limit) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << got.size() << " vs " << want.size();
  double maxd = 0, maxw = 0;
  size_t wi = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double d = std::fabs((double)got[i] - want[i]);
    if (!(d <= maxd)) maxd = d, wi = i;
    maxw = std::max(maxw, std::fabs(want[i]));
  }
  const double rel = maxw > 0 ? maxd / maxw : maxd;
  if (rel < limit) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "rel err " << rel << " >= " << limit << " at [" << wi << "]: got " << got[wi]
                                       << ", want " << want[wi];
}

DV fd_grad(const std::function<double(const DV&)>& f, DV x, double eps = 1e-6) {
  DV g(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double xi = x[i];
    x[i] = xi + eps;
    const double fp = f(x);
    x[i] = xi - eps;
    const double fm = f(x);
    x[i] = xi;
    g[i] = (fp - fm) / (2 * eps);
  }
  return g;
}

// softmax of a row, and the double reference of routing given the chosen experts
DV softmax(const DV& x, int64_t t, int E) {
  DV p((size_t)E);
  double mx = -1e300, s = 0;
  for (int e = 0; e < E; e++) mx = std::max(mx, x[(size_t)(t * E + e)]);
  for (int e = 0; e < E; e++) s += p[(size_t)e] = std::exp(x[(size_t)(t * E + e)] - mx);
  for (auto& v : p) v /= s;
  return p;
}
// the chosen weights of token t: the probabilities of idx's experts, renormalised when norm
DV chosen_weights(const DV& logits, const IV& idx, int64_t t, int E, int k, bool norm) {
  const DV p = softmax(logits, t, E);
  DV w((size_t)k);
  double s = 0;
  for (int j = 0; j < k; j++) s += w[(size_t)j] = p[(size_t)idx[(size_t)(t * k + j)]];
  if (norm)
    for (auto& v : w) v /= s;
  return w;
}

// torch.topk's choices on rows of exact ties (make_moe_fixtures.py): the same experts in the same
// order, through moe_route (softmax keeps ties and order), on both of its algorithms
TEST_P(MoeOps, RouteBreaksTiesAsTorchTopk) {
  std::ifstream f(llmt_test::reference_dir() + "/moe_topk_ties.json");
  ASSERT_TRUE(f.good());
  const nlohmann::json ref = nlohmann::json::parse(f);
  int rows = 0;
  for (const auto& c : ref["cases"]) {
    const int E = c["E"], k = c["k"];
    const auto values = c["rows"].get<std::vector<std::vector<float>>>();
    const auto want = c["indices"].get<std::vector<IV>>();
    const int64_t N = (int64_t)values.size();
    FV flat;
    for (const auto& r : values) flat.insert(flat.end(), r.begin(), r.end());
    auto L = act(flat);
    auto idx = i32(IV((size_t)(N * k))), w = f32(FV((size_t)(N * k))), p = f32(FV((size_t)(N * E)));
    be_->moe_route(idx->t({N, k}), w->t({N, k}), p->t({N, E}), Tensor(), L->t({N, E}), N, E, k, true, false);
    const IV got = idx->ints();
    for (int64_t t = 0; t < N; t++, rows++)
      EXPECT_EQ(IV(got.begin() + t * k, got.begin() + (t + 1) * k), want[(size_t)t]) << "E " << E << " k " << k
                                                                                      << " row " << t;
  }
  EXPECT_EQ(rows, 408);
}

// probabilities, choices (the k largest, largest first), weights with and without renormalisation
// and rounding, and the aux loss's sums, against double references
TEST_P(MoeOps, RouteForwardMatchesReference) {
  std::mt19937 rng(7);
  const int64_t N = 11;
  const int E = 5, k = 3;
  const FV lg = rand_act(rng, N * E, -3.f, 3.f);
  const DV lgd(lg.begin(), lg.end());
  for (int mode = 0; mode < 3; mode++) {  // norm_topk; plain; plain with rounding (Qwen's)
    const bool norm = mode == 0, round = mode == 2;
    auto L = act(lg);
    auto idx = i32(IV((size_t)(N * k))), w = f32(FV((size_t)(N * k), 9.f)), p = f32(FV((size_t)(N * E), 9.f));
    auto stats = f32(FV((size_t)(2 * E), 1.0f));  // += onto ones
    be_->moe_route(idx->t({N, k}), w->t({N, k}), p->t({N, E}), stats->t({2 * E}), L->t({N, E}), N, E, k, norm, round);
    const IV got = idx->ints();
    DV want_p, want_w, want_stats((size_t)(2 * E), 1.0);
    for (int64_t t = 0; t < N; t++) {
      const DV pt = softmax(lgd, t, E);
      want_p.insert(want_p.end(), pt.begin(), pt.end());
      std::vector<int> order(E);
      for (int e = 0; e < E; e++) order[(size_t)e] = e;
      std::sort(order.begin(), order.end(), [&](int a, int b) { return pt[(size_t)a] > pt[(size_t)b]; });
      for (int j = 0; j < k; j++) {
        EXPECT_EQ(got[(size_t)(t * k + j)], order[(size_t)j]) << "token " << t << " slot " << j;
        want_stats[(size_t)order[(size_t)j]] += 1;
      }
      const DV wt = chosen_weights(lgd, got, t, E, k, norm);
      want_w.insert(want_w.end(), wt.begin(), wt.end());
      for (int e = 0; e < E; e++) want_stats[(size_t)(E + e)] += pt[(size_t)e];
    }
    EXPECT_TRUE(Close(p->floats(), want_p, tol::kF32OpForward)) << "probs, mode " << mode;
    EXPECT_TRUE(Close(w->floats(), want_w, round && bf16() ? tol::kBf16OpForward : tol::kF32OpForward)) << mode;
    if (round && bf16()) {
      for (float v : w->floats()) EXPECT_EQ(v, rep(v)) << "weights rounded to bf16";
    }
    EXPECT_TRUE(Close(stats->floats(), want_stats, tol::kF32OpForward)) << "stats (+=), mode " << mode;
  }
}

// the router's gradient: from the weights' (and the aux loss's, on every probability) to the logits,
// against finite differences of the double reference with the choices held
TEST_P(MoeOps, RouteBackwardVsFiniteDifferences) {
  std::mt19937 rng(8);
  const int64_t N = 9;
  const int E = 6, k = 2;
  const FV lg = rand_act(rng, N * E, -2.f, 2.f);
  const FV r = rand_act(rng, N * k), aux = rand_act(rng, E, -0.3f, 0.3f);
  for (int mode = 0; mode < 3; mode++) {  // norm; plain; norm with the aux gradient
    const bool norm = mode != 1, with_aux = mode == 2;
    auto L = act(lg);
    auto idx = i32(IV((size_t)(N * k))), w = f32(FV((size_t)(N * k))), p = f32(FV((size_t)(N * E)));
    be_->moe_route(idx->t({N, k}), w->t({N, k}), p->t({N, E}), Tensor(), L->t({N, E}), N, E, k, norm, false);
    const IV chosen = idx->ints();
    auto dw = f32(r), auxg = f32(aux), dl = act(FV((size_t)(N * E), 7.f));
    be_->moe_route_backward(dl->t({N, E}), dw->t({N, k}), p->t({N, E}), idx->t({N, k}),
                            with_aux ? auxg->t({E}) : Tensor(), N, E, k, norm);
    const DV want = fd_grad(
        [&](const DV& x) {
          double s = 0;
          for (int64_t t = 0; t < N; t++) {
            const DV wt = chosen_weights(x, chosen, t, E, k, norm);
            for (int j = 0; j < k; j++) s += r[(size_t)(t * k + j)] * wt[(size_t)j];
            if (with_aux) {
              const DV pt = softmax(x, t, E);
              for (int e = 0; e < E; e++) s += aux[(size_t)e] * pt[(size_t)e];
            }
          }
          return s;
        },
        DV(lg.begin(), lg.end()));
    EXPECT_TRUE(Close(dl->floats(), want, grad_tol())) << "dlogits (=), mode " << mode;
  }
}

// grouping: offsets, each assignment's row (stable: token order within an expert), the rows gathered;
// and its backward, the slots' rows summed back onto each token (+=)
TEST_P(MoeOps, DispatchIsAStableCountingSortAndUndispatchItsAdjoint) {
  std::mt19937 rng(9);
  const int64_t N = 7;
  const int E = 5, k = 2, C = 3;
  const IV idx = {3, 0, 0, 3, 1, 3, 3, 0, 0, 1, 3, 1, 0, 3};  // expert 2 gets none, expert 4 none
  const FV x = rand_act(rng, N * C), g = rand_act(rng, N * k * C), d0 = rand_act(rng, N * C);
  auto X = act(x), I = i32(idx), off = i32(IV((size_t)E + 1, -5)), pos = i32(IV((size_t)(N * k), -5));
  auto XG = act(FV((size_t)(N * k * C), 9.f));
  be_->moe_dispatch(off->t({E + 1}), pos->t({N * k}), XG->t({N * k, C}), X->t({N, C}), I->t({N, k}), N, E, k, C);
  EXPECT_EQ(off->ints(), (IV{0, 5, 8, 8, 14, 14}));
  IV want_pos((size_t)(N * k));
  IV cursor = {0, 5, 8, 8, 14};
  for (int64_t i = 0; i < N * k; i++) want_pos[(size_t)i] = cursor[(size_t)idx[(size_t)i]]++;
  EXPECT_EQ(pos->ints(), want_pos);
  const FV xg = XG->floats();
  for (int64_t i = 0; i < N * k; i++)
    for (int c = 0; c < C; c++) EXPECT_EQ(xg[(size_t)(want_pos[(size_t)i] * C + c)], x[(size_t)(i / k * C + c)]);
  auto G = act(g), D = act(d0);
  be_->moe_undispatch(D->t({N, C}), G->t({N * k, C}), pos->t({N * k}), N, k, C);
  DV want((size_t)(N * C));
  for (int64_t t = 0; t < N; t++)
    for (int c = 0; c < C; c++) {
      double s = d0[(size_t)(t * C + c)];
      for (int j = 0; j < k; j++) s += g[(size_t)(want_pos[(size_t)(t * k + j)] * C + c)];
      want[(size_t)(t * C + c)] = s;
    }
  EXPECT_TRUE(Close(D->floats(), want, fwd_tol())) << "undispatch (+=)";
}

// each expert's product over its rows, both weight layouts, an expert with no rows; the weights'
// gradients (+=, the empty expert's untouched), against double references
TEST_P(MoeOps, ExpertMatmulsOverTheirRows) {
  std::mt19937 rng(10);
  const int E = 4, n = 5, K = 7;
  const int64_t rows = 9, stride = n * K + 3;  // a gap between experts, as the layout's alignment leaves
  const IV off = {0, 4, 4, 6, 9};  // expert 1 has no rows
  const FV a = rand_act(rng, rows * K), w = rand_act(rng, (E - 1) * stride + n * K), d = rand_act(rng, rows * n);
  auto A = act(a), W = act(w), O = i32(off), D = act(d);
  for (int trans = 0; trans < 2; trans++) {
    auto OUT = act(FV((size_t)(rows * n), 9.f));
    auto IN = act(FV((size_t)(rows * K)));
    // trans_w: out [rows, n] = a W^T, W stored [n, K]; else a' [rows, K... as [rows, n] x [n, K]]
    if (trans) {
      be_->moe_matmul(OUT->t({rows, n}), A->t({rows, K}), W->t({(int64_t)w.size()}), O->t({E + 1}), rows, E, n, K,
                      stride, true);
    } else {  // out [rows, K] = d [rows, n] W_e [n, K]: W stored [K' = n, n' = K]
      be_->moe_matmul(IN->t({rows, K}), D->t({rows, n}), W->t({(int64_t)w.size()}), O->t({E + 1}), rows, E, K, n,
                      stride, false);
    }
    const int64_t cols = trans ? n : K, inner = trans ? K : n;
    DV want((size_t)(rows * cols));
    for (int e = 0; e < E; e++)
      for (int64_t r = off[(size_t)e]; r < off[(size_t)e + 1]; r++)
        for (int64_t j = 0; j < cols; j++) {
          double s = 0;
          for (int64_t i = 0; i < inner; i++)
            s += trans ? (double)a[(size_t)(r * K + i)] * w[(size_t)(e * stride + j * K + i)]
                       : (double)d[(size_t)(r * n + i)] * w[(size_t)(e * stride + i * K + j)];
          want[(size_t)(r * cols + j)] = s;
        }
    EXPECT_TRUE(Close((trans ? OUT : IN)->floats(), want, fwd_tol())) << "trans_w " << trans;
  }
  FV dw0((size_t)((E - 1) * stride + n * K));
  for (auto& v : dw0) v = std::uniform_real_distribution<float>(-1.f, 1.f)(rng);
  auto DW = f32(dw0);
  be_->moe_matmul_wgrad(DW->t({(int64_t)dw0.size()}), D->t({rows, n}), A->t({rows, K}), O->t({E + 1}), rows, E, n, K,
                        stride);
  DV want(dw0.begin(), dw0.end());
  for (int e = 0; e < E; e++)
    for (int64_t j = 0; j < n; j++)
      for (int64_t i = 0; i < K; i++)
        for (int64_t r = off[(size_t)e]; r < off[(size_t)e + 1]; r++)
          want[(size_t)(e * stride + j * K + i)] += (double)d[(size_t)(r * n + j)] * a[(size_t)(r * K + i)];
  EXPECT_TRUE(Close(DW->floats(), want, fwd_tol())) << "weight gradients (+=)";
  const FV got = DW->floats();
  for (int64_t i = stride; i < 2 * stride; i++) EXPECT_EQ(got[(size_t)i], dw0[(size_t)i]) << "the empty expert's";
}

// out = residual + the weighted rows (+ the gated shared expert); its backward against finite
// differences for y, the weights, the shared expert and its gate
TEST_P(MoeOps, CombineForwardAndBackward) {
  std::mt19937 rng(11);
  const int64_t N = 6;
  const int k = 2, C = 5;
  const IV pos = {3, 0, 7, 1, 2, 11, 4, 9, 10, 5, 6, 8};
  for (int shared_on = 0; shared_on < 2; shared_on++) {
    const FV res = rand_act(rng, N * C), y = rand_act(rng, N * k * C), w = rand_act(rng, N * k, 0.1f, 1.f),
             sh = rand_act(rng, N * C), gate = rand_act(rng, N, -2.f, 2.f), r = rand_act(rng, N * C);
    auto forward = [&](const DV& yy, const DV& ww, const DV& ss, const DV& gg) {
      DV out((size_t)(N * C));
      for (int64_t t = 0; t < N; t++)
        for (int c = 0; c < C; c++) {
          double s = res[(size_t)(t * C + c)];
          for (int j = 0; j < k; j++) s += ww[(size_t)(t * k + j)] * yy[(size_t)(pos[(size_t)(t * k + j)] * C + c)];
          if (shared_on) s += ss[(size_t)(t * C + c)] / (1 + std::exp(-gg[(size_t)t]));
          out[(size_t)(t * C + c)] = s;
        }
      return out;
    };
    const DV yd(y.begin(), y.end()), wd(w.begin(), w.end()), sd(sh.begin(), sh.end()), gd(gate.begin(), gate.end());
    auto RES = act(res), Y = act(y), W = f32(w), P = i32(pos), SH = act(sh), G = act(gate), OUT = act(FV(res.size()));
    const Tensor shared = shared_on ? SH->t({N, C}) : Tensor(), g = shared_on ? G->t({N}) : Tensor();
    be_->moe_combine(OUT->t({N, C}), RES->t({N, C}), Y->t({N * k, C}), W->t({N, k}), P->t({N * k}), shared, g, N, k, C);
    EXPECT_TRUE(Close(OUT->floats(), forward(yd, wd, sd, gd), fwd_tol())) << "shared " << shared_on;
    auto R = act(r), DY = act(FV(y.size(), 9.f)), DW = f32(FV(w.size(), 9.f)), DS = act(FV(sh.size(), 9.f)),
         DG = act(FV(gate.size(), 9.f));
    be_->moe_combine_backward(DY->t({N * k, C}), DW->t({N, k}), shared_on ? DS->t({N, C}) : Tensor(),
                              shared_on ? DG->t({N}) : Tensor(), R->t({N, C}), Y->t({N * k, C}), W->t({N, k}),
                              P->t({N * k}), shared, g, N, k, C);
    auto L = [&](const DV& out) {
      double s = 0;
      for (size_t i = 0; i < out.size(); i++) s += out[i] * r[i];
      return s;
    };
    EXPECT_TRUE(Close(DY->floats(), fd_grad([&](const DV& v) { return L(forward(v, wd, sd, gd)); }, yd), grad_tol()));
    EXPECT_TRUE(Close(DW->floats(), fd_grad([&](const DV& v) { return L(forward(yd, v, sd, gd)); }, wd), grad_tol()));
    if (!shared_on) continue;
    EXPECT_TRUE(Close(DS->floats(), fd_grad([&](const DV& v) { return L(forward(yd, wd, v, gd)); }, sd), grad_tol()));
    EXPECT_TRUE(Close(DG->floats(), fd_grad([&](const DV& v) { return L(forward(yd, wd, sd, v)); }, gd), grad_tol()));
  }
}

// transformers' load_balancing_loss_func from the sums, and its gradient per probability
TEST_P(MoeOps, AuxLossIsTransformersFormula) {
  const int E = 4;
  const double rows = 26 * 2;  // two layers of 26 tokens
  const FV stats = {30, 10, 0, 64, 14.5f, 9.25f, 4.0f, 24.25f};  // counts (k = 2), probability sums
  auto S = f32(stats), G = f32(FV(E, 9.f));
  auto loss = f64(0.5);
  be_->moe_aux_loss(loss->t({1}), G->t({E}), S->t({2 * E}), E, rows, 0.1f, 0.25f);
  double aux = 0;
  for (int e = 0; e < E; e++) aux += (stats[(size_t)e] / rows) * (stats[(size_t)(E + e)] / rows);
  aux *= E;
  double got = 0;
  be_->copy_to_host(&got, loss->p, 8);
  EXPECT_NEAR(got, 0.5 + (double)0.1f * aux, 1e-12) << "loss (+=)";
  DV want(E);
  for (int e = 0; e < E; e++) want[(size_t)e] = 0.25 * 0.1 * E * stats[(size_t)e] / (rows * rows);
  EXPECT_TRUE(Close(G->floats(), want, tol::kF32OpForward));
}

TEST_P(MoeOps, EntriesRefuseBadArguments) {
  auto I = i32(IV(8)), W = f32(FV(8)), P = f32(FV(16)), L = act(FV(16));
  llmt_test::expect_error([&] { be_->moe_route(I->t({4, 2}), W->t({4, 2}), P->t({4, 4}), Tensor(), L->t({4, 4}), 4,
                                               4, 5, true, false); }, {"moe_route", "k = 5"});
  llmt_test::expect_error([&] { be_->moe_route(W->t({4, 2}), W->t({4, 2}), P->t({4, 4}), Tensor(), L->t({4, 4}), 4,
                                               4, 2, true, false); }, {"moe_route", "topk_idx is f32"});
  auto bad = i32({0, 1, 7, 2});
  auto off = i32(IV(5)), pos = i32(IV(4));
  llmt_test::expect_error([&] { be_->moe_dispatch(off->t({5}), pos->t({4}), Tensor(), Tensor(), bad->t({2, 2}), 2, 4,
                                                  2, 3); }, {"moe_dispatch", "expert 7 of 4"});
}

INSTANTIATE_TEST_SUITE_P(Cpu, MoeOps, ::testing::Values(DType::f32, DType::bf16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(llmt::dtype_name(i.param)); });

// Until its kernels come, every MoE op of the CUDA backend refuses with a message that says so.
TEST(MoeOpsCuda, NotYetImplementedSaysSo) {
  auto be = llmt::make_cuda_backend(0, DType::f32, false);
  void* p = be->alloc(1024);
  const Tensor f(p, DType::f32, {64}), i(p, DType::i32, {64});
  llmt_test::expect_error([&] { be->moe_route(i, f, f, Tensor(), f, 4, 4, 2, true, false); },
                          {"cuda moe_route", "not yet implemented on CUDA"});
  llmt_test::expect_error([&] { be->moe_matmul(f, f, f, i, 2, 2, 2, 2, 4, true); },
                          {"cuda moe_matmul", "not yet implemented on CUDA"});
  be->release(p);
}

}  // namespace
