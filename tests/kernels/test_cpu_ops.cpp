// Every op of the CPU Backend (make_cpu_backend) checked on its own against the math:
//  - forwards against double-precision plain-loop references (tests/kernels/reference_ops.h);
//  - backwards against central finite differences of those DOUBLE references, for a random linear
//    functional L = sum(out * r), with the backend's backward fed dout = r;
//  - "+=" outputs are pre-filled with random nonzero values and must be added to; "=" outputs are
//    pre-filled with garbage and must be overwritten.
// Inputs are random (fixed std::mt19937 seeds), never zero, with odd sizes so that swapped dimensions show.
//
// Error measure: rel = max|got - want| / max|want| over the whole tensor; the limits are
// tests/tolerances.h's kF32OpForward and kF32OpBackward (central differences with eps = 1e-6).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/core/tensor.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/kernels/reference_ops.h"
#include "tests/tolerances.h"

namespace {

using llmt::Backend;
using llmt::DType;
using llmt::Tensor;
using DV = std::vector<double>;
using FV = std::vector<float>;
using IV = std::vector<int32_t>;

constexpr double kFwdTol = llmt_test::tol::kF32OpForward;
constexpr double kGradTol = llmt_test::tol::kF32OpBackward;
constexpr double kFdEps = 1e-6;

Backend& be() {
  static std::unique_ptr<Backend> b = llmt::make_cpu_backend(2);
  return *b;
}

// ---- host helpers ----

FV rand_f(std::mt19937& rng, size_t n, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  FV v(n);
  for (auto& x : v) {
    do x = d(rng);
    while (std::fabs(x) < 1e-3f);  // never (near) zero
  }
  return v;
}
DV to_d(const FV& f) { return DV(f.begin(), f.end()); }
DV add_d(const FV& a, const DV& b) {
  DV r(b.size());
  for (size_t i = 0; i < b.size(); i++) r[i] = (double)a[i] + b[i];
  return r;
}
double dot(const DV& a, const DV& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

// Central finite differences of f at x, every coordinate.
DV fd_grad(const std::function<double(const DV&)>& f, DV x, double eps = kFdEps) {
  DV g(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    double xi = x[i];
    x[i] = xi + eps;
    double fp = f(x);
    x[i] = xi - eps;
    double fm = f(x);
    x[i] = xi;
    g[i] = (fp - fm) / (2 * eps);
  }
  return g;
}

// max|got - want| / max|want|, reported with the worst element.
::testing::AssertionResult Close(const FV& got, const DV& want, double tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  double maxd = 0, maxw = 0;
  size_t wi = 0;
  for (size_t i = 0; i < got.size(); i++) {
    double d = std::fabs((double)got[i] - want[i]);
    if (!(d <= maxd)) maxd = d, wi = i;  // catches NaN
    maxw = std::max(maxw, std::fabs(want[i]));
  }
  double rel = maxw > 0 ? maxd / maxw : maxd;
  if (rel < tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "rel err " << rel << " >= " << tol << "; worst at [" << wi << "]: got "
                                       << got[wi] << ", want " << want[wi] << " (max|want| " << maxw << ", n "
                                       << got.size() << ")";
}

// A backend allocation holding a host vector.
class Buf {
 public:
  Buf(size_t bytes) : bytes_(bytes) { p_ = be().alloc(bytes ? bytes : 4); }
  template <class T>
  explicit Buf(const std::vector<T>& h) : Buf(h.size() * sizeof(T)) {
    if (bytes_) be().copy_from_host(p_, h.data(), bytes_);
  }
  ~Buf() { be().release(p_); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void* p() const { return p_; }
  Tensor f32(std::initializer_list<int64_t> dims) const { return Tensor(p_, DType::f32, dims); }
  Tensor i32(std::initializer_list<int64_t> dims) const { return Tensor(p_, DType::i32, dims); }
  Tensor bf16(std::initializer_list<int64_t> dims) const { return Tensor(p_, DType::bf16, dims); }
  template <class T>
  std::vector<T> read() const {
    std::vector<T> h(bytes_ / sizeof(T));
    be().synchronize();
    if (bytes_) be().copy_to_host(h.data(), p_, bytes_);
    return h;
  }
  FV rf() const { return read<float>(); }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

Tensor null_f32(std::initializer_list<int64_t> dims) { return Tensor(nullptr, DType::f32, dims); }

// ======================= memory =======================

TEST(CpuOpsMemory, AllocZeroedAlignedAndCopies) {
  const size_t n = 1001;
  void* p = be().alloc(n * 4);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ((uintptr_t)p % 64, 0u) << "alloc must be 64-byte aligned";
  FV h(n, 1.f);
  be().copy_to_host(h.data(), p, n * 4);
  for (size_t i = 0; i < n; i++) ASSERT_EQ(h[i], 0.f) << "alloc must zero-fill, element " << i;
  std::mt19937 rng(1);
  FV src = rand_f(rng, n);
  be().copy_from_host(p, src.data(), n * 4);
  void* q = be().alloc(n * 4);
  be().copy(q, p, n * 4);
  FV back(n);
  be().copy_to_host(back.data(), q, n * 4);
  EXPECT_EQ(0, std::memcmp(back.data(), src.data(), n * 4));
  be().zero(q, n * 4);
  be().copy_to_host(back.data(), q, n * 4);
  for (size_t i = 0; i < n; i++) ASSERT_EQ(back[i], 0.f) << "zero() left element " << i;
  be().release(p);
  be().release(q);
}

// ======================= matmul =======================

struct MM {
  int64_t M, N, K;
};

// Forward in all four transpose combinations, with and without bias, overwrite and accumulate.
TEST(CpuOpsMatmul, ForwardAllTransposesBiasAccumulate) {
  std::mt19937 rng(11);
  for (MM s : {MM{7, 5, 9}, MM{33, 17, 65}, MM{1, 13, 3}})
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int hb = 0; hb < 2; hb++)
          for (int acc = 0; acc < 2; acc++) {
            SCOPED_TRACE(::testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K << " ta=" << ta
                                              << " tb=" << tb << " bias=" << hb << " accumulate=" << acc);
            FV a = rand_f(rng, s.M * s.K), b = rand_f(rng, s.K * s.N), bias = rand_f(rng, s.N),
               pre = rand_f(rng, s.M * s.N, 2.f, 3.f);
            Buf da(a), db(b), dbias(bias), dout(pre);
            be().matmul(dout.f32({s.M, s.N}), ta ? da.f32({s.K, s.M}) : da.f32({s.M, s.K}),
                        tb ? db.f32({s.N, s.K}) : db.f32({s.K, s.N}), hb ? dbias.f32({s.N}) : null_f32({s.N}),
                        s.M, s.N, s.K, ta, tb, acc);
            DV want = to_d(pre), bd = to_d(bias);
            llmt_ref::matmul(want, to_d(a), to_d(b), hb ? &bd : nullptr, s.M, s.N, s.K, ta, tb, acc);
            EXPECT_TRUE(Close(dout.rf(), want, kFwdTol));
          }
}

// Gradients of out = op(a) @ op(b) + bias, computed the way a model computes them (more matmuls in
// the other transpose combinations, and bias_backward), against finite differences of the double forward.
// da is accumulated (+=) onto random values, db is overwritten (=) over garbage.
TEST(CpuOpsMatmul, GradientsAllTransposesVsFiniteDifferences) {
  std::mt19937 rng(12);
  const int64_t M = 7, N = 5, K = 9;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb);
      FV a = rand_f(rng, M * K), b = rand_f(rng, K * N), bias = rand_f(rng, N), r = rand_f(rng, M * N);
      FV pre_da = rand_f(rng, M * K), pre_db = rand_f(rng, K * N), pre_dbias = rand_f(rng, N);
      DV ad = to_d(a), bd = to_d(b), biasd = to_d(bias), rd = to_d(r);
      auto L = [&](const DV& A, const DV& Bm, const DV& bi) {
        DV out;
        llmt_ref::matmul(out, A, Bm, &bi, M, N, K, ta, tb, false);
        return dot(out, rd);
      };
      DV ga = fd_grad([&](const DV& x) { return L(x, bd, biasd); }, ad);
      DV gb = fd_grad([&](const DV& x) { return L(ad, x, biasd); }, bd);
      DV gbias = fd_grad([&](const DV& x) { return L(ad, bd, x); }, biasd);

      Buf A(a), Bb(b), R(r), dA(pre_da), dB(pre_db), dBias(pre_dbias);
      // dA = r @ B^T  (B = op(b) [K,N])
      if (!ta)
        be().matmul(dA.f32({M, K}), R.f32({M, N}), tb ? Bb.f32({N, K}) : Bb.f32({K, N}), null_f32({K}), M, K, N,
                    false, !tb, true);
      else  // da stored [K,M] = B @ r^T
        be().matmul(dA.f32({K, M}), tb ? Bb.f32({N, K}) : Bb.f32({K, N}), R.f32({M, N}), null_f32({M}), K, M, N,
                    tb, true, true);
      // dB = A^T @ r  (A = op(a) [M,K])
      if (!tb)
        be().matmul(dB.f32({K, N}), ta ? A.f32({K, M}) : A.f32({M, K}), R.f32({M, N}), null_f32({N}), K, N, M,
                    !ta, false, false);
      else  // db stored [N,K] = r^T @ A
        be().matmul(dB.f32({N, K}), R.f32({M, N}), ta ? A.f32({K, M}) : A.f32({M, K}), null_f32({K}), N, K, M,
                    true, ta, false);
      be().bias_backward(dBias.f32({N}), R.f32({M, N}), M, N);
      EXPECT_TRUE(Close(dA.rf(), add_d(pre_da, ga), kGradTol)) << "da (accumulate)";
      EXPECT_TRUE(Close(dB.rf(), gb, kGradTol)) << "db (overwrite)";
      EXPECT_TRUE(Close(dBias.rf(), add_d(pre_dbias, gbias), kGradTol)) << "dbias (+=)";
    }
}

TEST(CpuOpsBiasBackward, AccumulatesColumnSums) {
  std::mt19937 rng(13);
  for (MM s : {MM{13, 11, 0}, MM{1, 7, 0}, MM{257, 3, 0}}) {
    FV dout = rand_f(rng, s.M * s.N), pre = rand_f(rng, s.N, 1.f, 2.f);
    DV want = to_d(pre);
    for (int64_t m = 0; m < s.M; m++)
      for (int64_t n = 0; n < s.N; n++) want[n] += dout[m * s.N + n];
    Buf D(dout), DB(pre);
    be().bias_backward(DB.f32({s.N}), D.f32({s.M, s.N}), s.M, s.N);
    EXPECT_TRUE(Close(DB.rf(), want, kFwdTol)) << "M=" << s.M << " N=" << s.N;
  }
}

// ======================= embedding =======================

constexpr int B_ = 2, T_ = 7, C_ = 12, V_ = 19;

IV make_tokens(std::mt19937& rng) {
  std::uniform_int_distribution<int> d(0, V_ - 1);
  IV tok(B_ * T_);
  for (auto& t : tok) t = d(rng);
  tok[0] = V_ - 1;  // the edges of the table
  tok[1] = 0;
  tok[5] = tok[0];  // repeated tokens: their gradients must add up
  tok[9] = tok[0];
  tok[12] = tok[1];
  return tok;
}

TEST(CpuOpsEmbedding, ForwardWithAndWithoutWpe) {
  std::mt19937 rng(21);
  for (int with_wpe = 0; with_wpe < 2; with_wpe++) {
    SCOPED_TRACE(with_wpe ? "with wpe" : "without wpe");
    IV tok = make_tokens(rng);
    FV wte = rand_f(rng, V_ * C_), wpe = rand_f(rng, T_ * C_), garbage = rand_f(rng, B_ * T_ * C_, 5.f, 6.f);
    Buf Tok(tok), Wte(wte), Wpe(wpe), Out(garbage);
    be().embedding_forward(Out.f32({B_ * T_, C_}), Tok.i32({B_, T_}), Wte.f32({V_, C_}),
                           with_wpe ? Wpe.f32({T_, C_}) : null_f32({T_, C_}), B_, T_, C_, V_);
    DV wpd = to_d(wpe);
    EXPECT_TRUE(Close(Out.rf(), llmt_ref::embedding(tok, to_d(wte), with_wpe ? &wpd : nullptr, B_, T_, C_), kFwdTol));
  }
}

TEST(CpuOpsEmbedding, BackwardVsFiniteDifferencesAccumulates) {
  std::mt19937 rng(22);
  for (int with_wpe = 0; with_wpe < 2; with_wpe++) {
    SCOPED_TRACE(with_wpe ? "with wpe" : "without wpe");
    IV tok = make_tokens(rng);
    FV wte = rand_f(rng, V_ * C_), wpe = rand_f(rng, T_ * C_), r = rand_f(rng, B_ * T_ * C_);
    FV pre_wte = rand_f(rng, V_ * C_), pre_wpe = rand_f(rng, T_ * C_);
    DV wted = to_d(wte), wped = to_d(wpe), rd = to_d(r);
    DV gwte = fd_grad(
        [&](const DV& x) { return dot(llmt_ref::embedding(tok, x, with_wpe ? &wped : nullptr, B_, T_, C_), rd); },
        wted);
    Buf Tok(tok), R(r), dWte(pre_wte), dWpe(pre_wpe);
    be().embedding_backward(dWte.f32({V_, C_}), with_wpe ? dWpe.f32({T_, C_}) : null_f32({T_, C_}), R.f32({B_ * T_, C_}),
                            Tok.i32({B_, T_}), B_, T_, C_);
    EXPECT_TRUE(Close(dWte.rf(), add_d(pre_wte, gwte), kGradTol)) << "dwte (+=)";
    if (with_wpe) {
      DV gwpe = fd_grad([&](const DV& x) { return dot(llmt_ref::embedding(tok, wted, &x, B_, T_, C_), rd); }, wped);
      EXPECT_TRUE(Close(dWpe.rf(), add_d(pre_wpe, gwpe), kGradTol)) << "dwpe (+=)";
    } else {
      EXPECT_EQ(dWpe.rf(), pre_wpe) << "dwpe buffer touched although dwpe.data was null";
    }
  }
}

TEST(CpuOpsEmbedding, TokenOutOfRangeThrows) {
  std::mt19937 rng(23);
  FV wte = rand_f(rng, V_ * C_), wpe = rand_f(rng, T_ * C_);
  Buf Wte(wte), Wpe(wpe), Out(B_ * T_ * C_ * 4);
  for (int bad : {V_, V_ + 100, -1, -100}) {
    IV tok = make_tokens(rng);
    tok[B_ * T_ - 1] = bad;
    Buf Tok(tok);
    EXPECT_THROW(be().embedding_forward(Out.f32({B_ * T_, C_}), Tok.i32({B_, T_}), Wte.f32({V_, C_}),
                                        Wpe.f32({T_, C_}), B_, T_, C_, V_),
                 llmt::Error)
        << "token id " << bad << " with V=" << V_;
  }
}

// ======================= norms =======================

constexpr int64_t NN = 14;  // rows
constexpr int NC = 12;      // channels

TEST(CpuOpsLayerNorm, ForwardMatchesReference) {
  std::mt19937 rng(31);
  FV x = rand_f(rng, NN * NC), w = rand_f(rng, NC), b = rand_f(rng, NC);
  for (int i = 0; i < NN * NC; i++) x[i] += 0.3f * (i / NC);  // rows with different means
  FV g1 = rand_f(rng, NN * NC, 5.f, 6.f), g2 = rand_f(rng, NN, 5.f, 6.f), g3 = rand_f(rng, NN, 5.f, 6.f);
  Buf X(x), W(w), Bb(b), Out(g1), Mean(g2), Rstd(g3);
  const float eps = 1e-5f;
  be().layernorm_forward(Out.f32({NN, NC}), Mean.f32({NN}), Rstd.f32({NN}), X.f32({NN, NC}), W.f32({NC}),
                         Bb.f32({NC}), NN, NC, eps);
  DV mean, rstd;
  DV want = llmt_ref::layernorm(to_d(x), to_d(w), to_d(b), NN, NC, eps, &mean, &rstd);
  EXPECT_TRUE(Close(Out.rf(), want, kFwdTol)) << "out";
  EXPECT_TRUE(Close(Mean.rf(), mean, kFwdTol)) << "mean";
  EXPECT_TRUE(Close(Rstd.rf(), rstd, kFwdTol)) << "rstd";
}

TEST(CpuOpsLayerNorm, BackwardVsFiniteDifferencesAccumulates) {
  std::mt19937 rng(32);
  FV x = rand_f(rng, NN * NC), w = rand_f(rng, NC), b = rand_f(rng, NC), r = rand_f(rng, NN * NC);
  FV pre_dx = rand_f(rng, NN * NC), pre_dw = rand_f(rng, NC), pre_db = rand_f(rng, NC);
  const float eps = 1e-5f;
  Buf X(x), W(w), Bb(b), Out(NN * NC * 4), Mean(NN * 4), Rstd(NN * 4), R(r), dX(pre_dx), dW(pre_dw), dB(pre_db);
  be().layernorm_forward(Out.f32({NN, NC}), Mean.f32({NN}), Rstd.f32({NN}), X.f32({NN, NC}), W.f32({NC}),
                         Bb.f32({NC}), NN, NC, eps);
  be().layernorm_backward(dX.f32({NN, NC}), dW.f32({NC}), dB.f32({NC}), R.f32({NN, NC}), X.f32({NN, NC}),
                          W.f32({NC}), Mean.f32({NN}), Rstd.f32({NN}), NN, NC);
  DV xd = to_d(x), wd = to_d(w), bd = to_d(b), rd = to_d(r);
  auto L = [&](const DV& X_, const DV& W_, const DV& B_) {
    return dot(llmt_ref::layernorm(X_, W_, B_, NN, NC, eps), rd);
  };
  EXPECT_TRUE(Close(dX.rf(), add_d(pre_dx, fd_grad([&](const DV& v) { return L(v, wd, bd); }, xd)), kGradTol))
      << "dx (+=)";
  EXPECT_TRUE(Close(dW.rf(), add_d(pre_dw, fd_grad([&](const DV& v) { return L(xd, v, bd); }, wd)), kGradTol))
      << "dw (+=)";
  EXPECT_TRUE(Close(dB.rf(), add_d(pre_db, fd_grad([&](const DV& v) { return L(xd, wd, v); }, bd)), kGradTol))
      << "db (+=)";
}

TEST(CpuOpsRmsNorm, ForwardMatchesReference) {
  std::mt19937 rng(33);
  FV x = rand_f(rng, NN * NC), w = rand_f(rng, NC);
  FV g1 = rand_f(rng, NN * NC, 5.f, 6.f), g2 = rand_f(rng, NN, 5.f, 6.f);
  Buf X(x), W(w), Out(g1), Rstd(g2);
  const float eps = 1e-6f;
  be().rmsnorm_forward(Out.f32({NN, NC}), Rstd.f32({NN}), X.f32({NN, NC}), W.f32({NC}), NN, NC, eps);
  DV rstd;
  DV want = llmt_ref::rmsnorm(to_d(x), to_d(w), NN, NC, eps, &rstd);
  EXPECT_TRUE(Close(Out.rf(), want, kFwdTol)) << "out";
  EXPECT_TRUE(Close(Rstd.rf(), rstd, kFwdTol)) << "rstd";
}

TEST(CpuOpsRmsNorm, BackwardVsFiniteDifferencesAccumulates) {
  std::mt19937 rng(34);
  FV x = rand_f(rng, NN * NC), w = rand_f(rng, NC), r = rand_f(rng, NN * NC);
  FV pre_dx = rand_f(rng, NN * NC), pre_dw = rand_f(rng, NC);
  const float eps = 1e-6f;
  Buf X(x), W(w), Out(NN * NC * 4), Rstd(NN * 4), R(r), dX(pre_dx), dW(pre_dw);
  be().rmsnorm_forward(Out.f32({NN, NC}), Rstd.f32({NN}), X.f32({NN, NC}), W.f32({NC}), NN, NC, eps);
  be().rmsnorm_backward(dX.f32({NN, NC}), dW.f32({NC}), R.f32({NN, NC}), X.f32({NN, NC}), W.f32({NC}),
                        Rstd.f32({NN}), NN, NC);
  DV xd = to_d(x), wd = to_d(w), rd = to_d(r);
  auto L = [&](const DV& X_, const DV& W_) { return dot(llmt_ref::rmsnorm(X_, W_, NN, NC, eps), rd); };
  EXPECT_TRUE(Close(dX.rf(), add_d(pre_dx, fd_grad([&](const DV& v) { return L(v, wd); }, xd)), kGradTol))
      << "dx (+=)";
  EXPECT_TRUE(Close(dW.rf(), add_d(pre_dw, fd_grad([&](const DV& v) { return L(xd, v); }, wd)), kGradTol))
      << "dw (+=)";
}

// ======================= activations =======================

TEST(CpuOpsGelu, ForwardMatchesTanhReference) {
  std::mt19937 rng(41);
  const int64_t n = 1001;
  FV x = rand_f(rng, n, -4.f, 4.f), g = rand_f(rng, n, 5.f, 6.f);
  Buf X(x), Out(g);
  be().gelu_forward(Out.f32({n}), X.f32({n}), n);
  EXPECT_TRUE(Close(Out.rf(), llmt_ref::gelu(to_d(x)), kFwdTol));
}

TEST(CpuOpsGelu, BackwardVsFiniteDifferencesOverwritesAndAliases) {
  std::mt19937 rng(42);
  const int64_t n = 257;
  FV x = rand_f(rng, n, -4.f, 4.f), r = rand_f(rng, n), g = rand_f(rng, n, 5.f, 6.f);
  DV rd = to_d(r);
  DV want = fd_grad([&](const DV& v) { return dot(llmt_ref::gelu(v), rd); }, to_d(x));
  {
    Buf X(x), R(r), dX(g);
    be().gelu_backward(dX.f32({n}), X.f32({n}), R.f32({n}), n);
    EXPECT_TRUE(Close(dX.rf(), want, kGradTol)) << "dx (=) over garbage";
  }
  {
    Buf X(x), R(r);
    be().gelu_backward(R.f32({n}), X.f32({n}), R.f32({n}), n);  // dx aliases dout
    EXPECT_TRUE(Close(R.rf(), want, kGradTol)) << "dx aliasing dout";
  }
}

TEST(CpuOpsSwiGLU, ForwardMatchesReference) {
  std::mt19937 rng(43);
  const int64_t N = 14;
  const int I = 9;
  FV gu = rand_f(rng, N * 2 * I, -3.f, 3.f), g = rand_f(rng, N * I, 5.f, 6.f);
  Buf GU(gu), Out(g);
  be().swiglu_forward(Out.f32({N, I}), GU.f32({N, 2 * I}), N, I);
  EXPECT_TRUE(Close(Out.rf(), llmt_ref::swiglu(to_d(gu), N, I), kFwdTol));
}

TEST(CpuOpsSwiGLU, BackwardVsFiniteDifferencesOverwrites) {
  std::mt19937 rng(44);
  const int64_t N = 14;
  const int I = 9;
  FV gu = rand_f(rng, N * 2 * I, -3.f, 3.f), r = rand_f(rng, N * I), g = rand_f(rng, N * 2 * I, 5.f, 6.f);
  DV rd = to_d(r);
  DV want = fd_grad([&](const DV& v) { return dot(llmt_ref::swiglu(v, N, I), rd); }, to_d(gu));
  Buf GU(gu), R(r), dGU(g);
  be().swiglu_backward(dGU.f32({N, 2 * I}), R.f32({N, I}), GU.f32({N, 2 * I}), N, I);
  EXPECT_TRUE(Close(dGU.rf(), want, kGradTol)) << "dgate_up (=) over garbage";
}

// ======================= RoPE and attention =======================

struct AttnCfg {
  int NH, NKV;
};
constexpr int AB = 2, AT = 7, HS = 6;

TEST(CpuOpsRope, ForwardAndBackwardVsReference) {
  std::mt19937 rng(51);
  for (AttnCfg c : {AttnCfg{4, 2}, AttnCfg{3, 3}, AttnCfg{3, 1}})
    for (double theta : {10000.0, 10.0}) {
      SCOPED_TRACE(::testing::Message() << "NH=" << c.NH << " NKV=" << c.NKV << " theta=" << theta);
      const int R = (c.NH + 2 * c.NKV) * HS;
      const int64_t n = (int64_t)AB * AT * R;
      FV qkv = rand_f(rng, n), r = rand_f(rng, n);
      DV want = llmt_ref::rope(to_d(qkv), AB, AT, c.NH, c.NKV, HS, theta);
      Buf Q(qkv);
      be().rope_forward(Q.f32({AB * AT, R}), AB, AT, c.NH, c.NKV, HS, (float)theta);
      FV got = Q.rf();
      EXPECT_TRUE(Close(got, want, kFwdTol)) << "rope_forward";
      for (int64_t row = 0; row < AB * AT; row++)
        for (int j = (c.NH + c.NKV) * HS; j < R; j++)
          ASSERT_EQ(got[row * R + j], qkv[row * R + j]) << "v part changed, row " << row << " col " << j;
      // backward: dqkv = r in place; expect d/dqkv sum(rope(qkv) * r)
      DV rd = to_d(r);
      DV g = fd_grad([&](const DV& v) { return dot(llmt_ref::rope(v, AB, AT, c.NH, c.NKV, HS, theta), rd); },
                     to_d(qkv));
      Buf dQ(r);
      be().rope_backward(dQ.f32({AB * AT, R}), AB, AT, c.NH, c.NKV, HS, (float)theta);
      EXPECT_TRUE(Close(dQ.rf(), g, kGradTol)) << "rope_backward";
    }
}

TEST(CpuOpsAttention, ForwardMatchesReference) {
  std::mt19937 rng(52);
  for (AttnCfg c : {AttnCfg{3, 3}, AttnCfg{4, 2}, AttnCfg{3, 1}}) {
    SCOPED_TRACE(::testing::Message() << "NH=" << c.NH << " NKV=" << c.NKV);
    const int R = (c.NH + 2 * c.NKV) * HS;
    FV qkv = rand_f(rng, (size_t)AB * AT * R, -1.5f, 1.5f);
    FV g1 = rand_f(rng, (size_t)AB * AT * c.NH * HS, 5.f, 6.f), g2 = rand_f(rng, (size_t)AB * c.NH * AT * AT, 5.f, 6.f);
    Buf Q(qkv), Out(g1), Att(g2);
    be().attention_forward(Out.f32({AB * AT, c.NH * HS}), Att.f32({AB, c.NH, AT, AT}), Q.f32({AB * AT, R}), AB, AT,
                           c.NH, c.NKV, HS);
    DV att;
    DV want = llmt_ref::attention(to_d(qkv), AB, AT, c.NH, c.NKV, HS, &att);
    EXPECT_TRUE(Close(Out.rf(), want, kFwdTol)) << "out (=)";
    FV got_att = Att.rf();
    FV causal(got_att.size());
    DV causal_want(att.size());
    int64_t masked_nonzero = 0;
    for (int64_t bh = 0; bh < AB * c.NH; bh++)
      for (int t = 0; t < AT; t++)
        for (int u = 0; u < AT; u++) {
          size_t i = ((size_t)bh * AT + t) * AT + u;
          if (u <= t) causal[i] = got_att[i], causal_want[i] = att[i];
          else if (got_att[i] != 0.f) masked_nonzero++;
        }
    EXPECT_TRUE(Close(causal, causal_want, kFwdTol)) << "att probabilities (t2 <= t)";
    EXPECT_EQ(masked_nonzero, 0) << "att (=) must hold probability 0 above the diagonal (the pre-filled garbage "
                                    "was left there, or a nonzero value written)";
  }
}

TEST(CpuOpsAttention, BackwardVsFiniteDifferencesMhaAndGqa) {
  std::mt19937 rng(53);
  for (AttnCfg c : {AttnCfg{3, 3}, AttnCfg{4, 2}, AttnCfg{3, 1}}) {
    SCOPED_TRACE(::testing::Message() << "NH=" << c.NH << " NKV=" << c.NKV);
    const int R = (c.NH + 2 * c.NKV) * HS;
    FV qkv = rand_f(rng, (size_t)AB * AT * R, -1.5f, 1.5f), r = rand_f(rng, (size_t)AB * AT * c.NH * HS);
    FV g1 = rand_f(rng, qkv.size(), 5.f, 6.f), g2 = rand_f(rng, (size_t)AB * c.NH * AT * AT, 5.f, 6.f);
    Buf Q(qkv), Out(r.size() * 4), Att(g2.size() * 4), dOut(r), dQ(g1), dAtt(g2);
    be().attention_forward(Out.f32({AB * AT, c.NH * HS}), Att.f32({AB, c.NH, AT, AT}), Q.f32({AB * AT, R}), AB, AT,
                           c.NH, c.NKV, HS);
    be().attention_backward(dQ.f32({AB * AT, R}), dAtt.f32({AB, c.NH, AT, AT}), dOut.f32({AB * AT, c.NH * HS}),
                            Q.f32({AB * AT, R}), Att.f32({AB, c.NH, AT, AT}), AB, AT, c.NH, c.NKV, HS);
    DV rd = to_d(r);
    DV want = fd_grad([&](const DV& v) { return dot(llmt_ref::attention(v, AB, AT, c.NH, c.NKV, HS), rd); },
                      to_d(qkv));
    EXPECT_TRUE(Close(dQ.rf(), want, kGradTol)) << "dqkv (=) over garbage";
  }
}

// ======================= cross-entropy =======================

TEST(CpuOpsCrossEntropy, LossAndGradientVsFiniteDifferencesWithIgnored) {
  std::mt19937 rng(61);
  const int64_t N = 14;
  const int V = 19;
  const float grad_scale = 0.37f;
  FV logits = rand_f(rng, N * V, -3.f, 3.f), garbage = rand_f(rng, N * V, 5.f, 6.f);
  IV tg(N);
  std::uniform_int_distribution<int> d(0, V - 1);
  for (auto& t : tg) t = d(rng);
  tg[0] = 0;
  tg[1] = V - 1;
  tg[2] = tg[5] = tg[13] = -100;
  DV ld = to_d(logits);
  double want_loss = llmt_ref::cross_entropy(ld, tg, N, V);
  DV want_grad = fd_grad([&](const DV& v) { return grad_scale * llmt_ref::cross_entropy(v, tg, N, V); }, ld);

  {  // separate dlogits pre-filled with garbage
    Buf L(logits), Tg(tg), dL(garbage);
    double loss = be().cross_entropy(dL.f32({N, V}), L.f32({N, V}), Tg.i32({N}), N, V, grad_scale);
    EXPECT_NEAR(loss, want_loss, kFwdTol * std::fabs(want_loss)) << "loss sum over non-ignored rows";
    FV got = dL.rf();
    EXPECT_TRUE(Close(got, want_grad, kGradTol)) << "dlogits (=)";
    for (int64_t n : {2, 5, 13})
      for (int j = 0; j < V; j++) ASSERT_EQ(got[n * V + j], 0.f) << "ignored row " << n << " must be zero";
    EXPECT_EQ(L.rf(), logits) << "logits changed although dlogits is a separate buffer";
  }
  {  // dlogits aliasing logits
    Buf L(logits), Tg(tg);
    double loss = be().cross_entropy(L.f32({N, V}), L.f32({N, V}), Tg.i32({N}), N, V, grad_scale);
    EXPECT_NEAR(loss, want_loss, kFwdTol * std::fabs(want_loss)) << "aliased";
    EXPECT_TRUE(Close(L.rf(), want_grad, kGradTol)) << "dlogits aliasing logits";
  }
  {  // no dlogits: loss only
    Buf L(logits), Tg(tg);
    double loss = be().cross_entropy(null_f32({N, V}), L.f32({N, V}), Tg.i32({N}), N, V, grad_scale);
    EXPECT_NEAR(loss, want_loss, kFwdTol * std::fabs(want_loss)) << "loss only";
    EXPECT_EQ(L.rf(), logits) << "logits changed with dlogits.data == nullptr";
  }
  {  // every row ignored: loss 0 and zero gradient
    IV all(N, -100);
    Buf L(logits), Tg(all), dL(garbage);
    double loss = be().cross_entropy(dL.f32({N, V}), L.f32({N, V}), Tg.i32({N}), N, V, grad_scale);
    EXPECT_EQ(loss, 0.0);
    for (float v : dL.rf()) ASSERT_EQ(v, 0.f) << "all rows ignored: dlogits must be zero";
  }
}

TEST(CpuOpsCrossEntropy, TargetOutOfRangeThrows) {
  std::mt19937 rng(62);
  const int64_t N = 5;
  const int V = 19;
  FV logits = rand_f(rng, N * V);
  for (int bad : {V, V + 7, -1, -99, -101}) {
    IV tg = {0, 3, -100, 7, bad};
    Buf L(logits), Tg(tg), dL(N * V * 4);
    EXPECT_THROW(be().cross_entropy(dL.f32({N, V}), L.f32({N, V}), Tg.i32({N}), N, V, 1.f), llmt::Error)
        << "target " << bad << " with dlogits";
    EXPECT_THROW(be().cross_entropy(null_f32({N, V}), L.f32({N, V}), Tg.i32({N}), N, V, 1.f), llmt::Error)
        << "target " << bad << " loss only";
  }
}

// ======================= optimizer and reductions =======================

TEST(CpuOpsAdamW, ThreeStepsMatchTorchAdamW) {
  std::mt19937 rng(71);
  const int64_t n = 37;
  // beta2 and eps away from the defaults so that a hard-coded constant or eps in the wrong place shows:
  // with |g*grad_scale| ~ 0.25, eps = 1e-3 moves the update by ~0.5%, far above the tolerance.
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-3f, wd = 0.1f, gs = 0.5f;
  FV p = rand_f(rng, n), m(n, 0.f), v(n, 0.f);
  DV pd = to_d(p), md(n, 0.0), vd(n, 0.0);
  Buf P(p), M(m), Vb(v);
  for (int t = 1; t <= 3; t++) {
    SCOPED_TRACE(::testing::Message() << "step " << t);
    FV g = rand_f(rng, n);
    Buf G(g);
    FV p_before = P.rf();
    DV pd_before = pd;
    be().adamw(P.f32({n}), G.f32({n}), M.f32({n}), Vb.f32({n}), n, lr, b1, b2, eps, wd, t, gs);
    llmt_ref::adamw(pd, to_d(g), md, vd, lr, b1, b2, eps, wd, t, gs);
    FV got = P.rf();
    EXPECT_TRUE(Close(got, pd, kFwdTol)) << "p";
    EXPECT_TRUE(Close(M.rf(), md, kFwdTol)) << "m";
    EXPECT_TRUE(Close(Vb.rf(), vd, kFwdTol)) << "v";
    // the update itself, from the same starting point, relative to its own size
    FV upd(n);
    DV want_upd(n);
    for (int64_t i = 0; i < n; i++) {
      upd[i] = got[i] - p_before[i];
      want_upd[i] = pd[i] - pd_before[i];
    }
    EXPECT_TRUE(Close(upd, want_upd, kGradTol)) << "p_new - p_old";
  }
}

TEST(CpuOpsSumSquares, MatchesDouble) {
  std::mt19937 rng(72);
  for (int64_t n : {1, 7, 1001, 100003}) {
    FV x = rand_f(rng, n, -2.f, 2.f);
    double want = 0;
    for (float f : x) want += (double)f * f;
    Buf X(x);
    double got = be().sum_squares(X.f32({n}), n);
    EXPECT_NEAR(got, want, kFwdTol * want) << "n=" << n;
  }
}

// ======================= dtype conversion =======================

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
bool bf16_is_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0; }

// Round to nearest even by distances (not by bit tricks): the two bf16 neighbours of a finite x, the
// nearer wins, ties go to the even mantissa; above the largest bf16 the upper neighbour is 2^128 (= inf).
uint16_t ref_bf16(float x) {
  uint32_t u = bits(x);
  uint32_t lo = u & 0xffff0000u;
  if (lo == u) return (uint16_t)(u >> 16);
  uint32_t hi = lo + 0x10000u;  // next bf16 away from zero
  double xd = std::fabs((double)x), lod = std::fabs((double)from_bits(lo));
  double hid = ((hi & 0x7fffffffu) == 0x7f800000u) ? std::ldexp(1.0, 128) : std::fabs((double)from_bits(hi));
  double dl = xd - lod, dh = hid - xd;
  if (dl < dh) return (uint16_t)(lo >> 16);
  if (dh < dl) return (uint16_t)(hi >> 16);
  return ((lo >> 16) & 1) ? (uint16_t)(hi >> 16) : (uint16_t)(lo >> 16);
}

TEST(CpuOpsConvert, F32ToBf16RoundsToNearestEven) {
  struct Case {
    uint32_t in;
    uint16_t out;
  };
  const Case cases[] = {
      {0x3f808000u, 0x3f80},  // tie, lower neighbour even: stays
      {0x3f818000u, 0x3f82},  // tie, lower neighbour odd: rounds up to even
      {0x3f808001u, 0x3f81},  // just above the tie
      {0x3f807fffu, 0x3f80},  // just below the tie
      {0xbf808000u, 0xbf80},  // negative tie to even
      {0xbf818000u, 0xbf82},
      {0x3f80ffffu, 0x3f81},
      {0x3fffffffu, 0x4000},  // carry into the exponent
      {0x7f7fffffu, 0x7f80},  // max float rounds to inf
      {0x7f7f7fffu, 0x7f7f},
      {0x7f800000u, 0x7f80},  // inf
      {0xff800000u, 0xff80},  // -inf
      {0x00000000u, 0x0000},
      {0x80000000u, 0x8000},
      {0x00008000u, 0x0000},  // subnormal tie to even (zero)
      {0x00018000u, 0x0002},  // subnormal tie to even (up)
  };
  const int n = sizeof(cases) / sizeof(cases[0]);
  FV in(n);
  for (int i = 0; i < n; i++) in[i] = from_bits(cases[i].in);
  Buf I(in), O((size_t)n * 2);
  be().convert(O.bf16({n}), I.f32({n}), n);
  auto out = O.read<uint16_t>();
  for (int i = 0; i < n; i++)
    EXPECT_EQ(out[i], cases[i].out) << std::hex << "f32 0x" << cases[i].in << " -> bf16 0x" << out[i]
                                    << ", want 0x" << cases[i].out;
}

TEST(CpuOpsConvert, F32ToBf16NaNStaysNaN) {
  const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7f80ffffu, 0xffffffffu, 0x7fffffffu};
  const int n = 6;
  FV in(n);
  for (int i = 0; i < n; i++) in[i] = from_bits(nans[i]);
  Buf I(in), O((size_t)n * 2);
  be().convert(O.bf16({n}), I.f32({n}), n);
  auto out = O.read<uint16_t>();
  for (int i = 0; i < n; i++)
    EXPECT_TRUE(bf16_is_nan(out[i])) << std::hex << "f32 NaN 0x" << nans[i] << " -> bf16 0x" << out[i];
}

TEST(CpuOpsConvert, RandomRoundTripsAgainstDistanceReference) {
  std::mt19937 rng(81);
  const int64_t n = 4099;
  FV in(n);
  std::uniform_int_distribution<int> e(-30, 30);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (int64_t i = 0; i < n; i++) in[i] = std::ldexp(d(rng), e(rng));
  for (int64_t i = 0; i < n; i += 17) in[i] = from_bits((bits(in[i]) & 0xffff0000u) | 0x8000u);  // exact ties
  Buf I(in), O((size_t)n * 2), Back((size_t)n * 4);
  be().convert(O.bf16({n}), I.f32({n}), n);
  auto out = O.read<uint16_t>();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++)
    if (out[i] != ref_bf16(in[i]) && bad++ < 5)
      ADD_FAILURE() << std::hex << "f32 0x" << bits(in[i]) << " -> 0x" << out[i] << ", want 0x" << ref_bf16(in[i]);
  EXPECT_EQ(bad, 0);
  // bf16 -> f32 is exact: the 16 bits become the top half
  be().convert(Back.f32({n}), O.bf16({n}), n);
  FV back = Back.rf();
  for (int64_t i = 0; i < n; i++)
    ASSERT_EQ(bits(back[i]), (uint32_t)out[i] << 16) << "bf16 -> f32 at " << i;
}

TEST(CpuOpsConvert, Bf16ToF32KeepsSpecials) {
  std::vector<uint16_t> h = {0x0000, 0x8000, 0x3f80, 0xbf81, 0x7f80, 0xff80, 0x7fc1, 0x0001, 0x7f7f};
  const int64_t n = (int64_t)h.size();
  Buf I(h), O((size_t)n * 4);
  be().convert(O.f32({n}), I.bf16({n}), n);
  FV out = O.rf();
  for (int64_t i = 0; i < n; i++) EXPECT_EQ(bits(out[i]), (uint32_t)h[i] << 16) << "bf16 0x" << std::hex << h[i];
}

// ======================= elementwise =======================

TEST(CpuOpsElementwise, AddAccumulateScale) {
  std::mt19937 rng(91);
  const int64_t n = 1003;
  FV a = rand_f(rng, n), b = rand_f(rng, n), g = rand_f(rng, n, 5.f, 6.f);
  DV sum(n);
  for (int64_t i = 0; i < n; i++) sum[i] = (double)a[i] + b[i];
  {
    Buf A(a), Bb(b), O(g);
    be().add(O.f32({n}), A.f32({n}), Bb.f32({n}), n);
    EXPECT_TRUE(Close(O.rf(), sum, kFwdTol)) << "add (=)";
    EXPECT_EQ(A.rf(), a);
    EXPECT_EQ(Bb.rf(), b);
  }
  {
    Buf A(a), Bb(b);
    be().add(A.f32({n}), A.f32({n}), Bb.f32({n}), n);
    EXPECT_TRUE(Close(A.rf(), sum, kFwdTol)) << "add, out aliasing a";
  }
  {
    Buf A(a), Bb(b);
    be().add(Bb.f32({n}), A.f32({n}), Bb.f32({n}), n);
    EXPECT_TRUE(Close(Bb.rf(), sum, kFwdTol)) << "add, out aliasing b";
  }
  {
    Buf D(a), S(b);
    be().accumulate(D.f32({n}), S.f32({n}), n);
    EXPECT_TRUE(Close(D.rf(), sum, kFwdTol)) << "accumulate (+=)";
    EXPECT_EQ(S.rf(), b) << "accumulate changed src";
  }
  {
    Buf X(a);
    const float s = -0.731f;
    be().scale(X.f32({n}), s, n);
    DV want(n);
    for (int64_t i = 0; i < n; i++) want[i] = (double)a[i] * s;
    EXPECT_TRUE(Close(X.rf(), want, kFwdTol)) << "scale";
  }
}

}  // namespace
