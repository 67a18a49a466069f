// The Backend op conformance suite: every op of every backend checked on its own against the math,
// run once per backend configuration (the CPU in fp32 and in bf16; the CUDA backend joins through
// the same list). As ggml's test-backend-ops: one suite, every backend.
//  - forwards against double-precision plain-loop references (tests/kernels/reference_ops.h);
//  - backwards against central finite differences of those DOUBLE references, for a random linear
//    functional L = sum(out * r), with the backend's backward fed dout = r;
//  - "+=" outputs are pre-filled with random nonzero values and must be added to; "=" outputs are
//    pre-filled with garbage and must be overwritten.
// Inputs are random (fixed std::mt19937 seeds), never zero, with odd sizes so that swapped dimensions
// show. In bf16 the inputs are drawn exactly representable in bf16, so the references see what the
// backend sees and the error measured is the op's own (fp32 arithmetic, bf16 rounding of results).
//
// Error measure: rel = max|got - want| / max|want| over the whole tensor; the limits are
// tests/tolerances.h's op limits for the backend's compute dtype (central differences, eps = 1e-6).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/core/tensor.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/kernels/reference_ops.h"
#include "tests/tolerances.h"

namespace {

using llmt::Backend;
using llmt::DType;
using llmt::Tensor;
using DV = std::vector<double>;
using FV = std::vector<float>;
using IV = std::vector<int32_t>;
namespace tol = llmt_test::tol;

constexpr double kFdEps = 1e-6;

// A CUDA backend made with environment variable `var` (LLMT_MATMUL, LLMT_ATTENTION: read when the
// backend is made) set to `value`.
std::unique_ptr<Backend> cuda_with(const char* var, const char* value, DType compute) {
  const char* was = std::getenv(var);
  const std::string saved = was ? was : "";
  setenv(var, value, 1);
  auto be = llmt::make_cuda_backend(0, compute, false);
  if (was) setenv(var, saved.c_str(), 1);
  else unsetenv(var);
  return be;
}

// The backend configurations the suite runs against.
struct BackendCase {
  const char* name;
  std::function<std::unique_ptr<Backend>()> make;
};
const std::vector<BackendCase>& backend_cases() {
  static const std::vector<BackendCase> cases = {
      {"cpu_f32", [] { return llmt::make_cpu_backend(2, DType::f32); }},
      {"cpu_bf16", [] { return llmt::make_cpu_backend(2, DType::bf16); }},
      // the CUDA backend: on the SIMT emulator in ctest, on the GPU in scripts/gpu_selftest.sh
      {"cuda_f32", [] { return llmt::make_cuda_backend(0, DType::f32, false); }},
      {"cuda_bf16", [] { return llmt::make_cuda_backend(0, DType::bf16, false); }},
      // the same with every matmul through cuBLASLt: its CPU stand-in on the emulator, the library on a GPU
      {"cuda_lt_f32", [] { return cuda_with("LLMT_MATMUL", "cublaslt", DType::f32); }},
      {"cuda_lt_bf16", [] { return cuda_with("LLMT_MATMUL", "cublaslt", DType::bf16); }},
      // attention through cuDNN where it takes the call (bf16, no dropout): its CPU stand-in on the
      // emulator, the library on a GPU; the other ops as cuda_bf16
      {"cuda_dnn_bf16", [] { return cuda_with("LLMT_ATTENTION", "cudnn", DType::bf16); }},
  };
  return cases;
}

Backend* g_be = nullptr;  // the current case's backend
Backend& be() { return *g_be; }
DType act_dtype() { return g_be->compute_dtype(); }
bool is_bf16() { return act_dtype() == DType::bf16; }
double fwd_tol() { return is_bf16() ? tol::kBf16OpForward : tol::kF32OpForward; }
double grad_tol() { return is_bf16() ? tol::kBf16OpBackward : tol::kF32OpBackward; }

class Ops : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    backend_ = backend_cases()[GetParam()].make();
    g_be = backend_.get();
  }
  void TearDown() override {
    g_be = nullptr;
    backend_.reset();
  }
  std::unique_ptr<Backend> backend_;
};

std::string case_name(const ::testing::TestParamInfo<int>& info) { return backend_cases()[info.param].name; }

// ---- host helpers ----

// A value the act dtype holds exactly (bf16 rounding in bf16, itself in f32).
float representable(float x) { return is_bf16() ? llmt::bf16_to_f32(llmt::f32_to_bf16(x)) : x; }

FV rand_f(std::mt19937& rng, size_t n, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  FV v(n);
  for (auto& x : v) {
    do x = d(rng);
    while (std::fabs(x) < 1e-3f);  // never (near) zero
  }
  return v;
}
// Random values for an act tensor: exactly representable in the compute dtype.
FV rand_act(std::mt19937& rng, size_t n, float lo = -1.f, float hi = 1.f) {
  FV v = rand_f(rng, n, lo, hi);
  for (auto& x : v) x = representable(x);
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
  if (std::getenv("LLMT_TEST_MARGINS")) std::printf("margin %s %.3g of %.3g\n", ::testing::UnitTest::GetInstance()->current_test_info()->name(), rel, tol);
  if (rel < tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "rel err " << rel << " >= " << tol << "; worst at [" << wi << "]: got "
                                       << got[wi] << ", want " << want[wi] << " (max|want| " << maxw << ", n "
                                       << got.size() << ")";
}

// A backend allocation holding a host vector: f32 / i32 as given, or floats stored in the act
// dtype (Buf::act).
class Buf {
 public:
  explicit Buf(size_t bytes) : bytes_(bytes) { p_ = be().alloc(bytes ? bytes : 4); }
  template <class T>
  explicit Buf(const std::vector<T>& h) : Buf(h.size() * sizeof(T)) {
    if (bytes_) be().copy_from_host(p_, h.data(), bytes_);
  }
  // floats stored in the compute dtype (rounded to nearest even in bf16)
  static std::unique_ptr<Buf> act(const FV& h) {
    if (!is_bf16()) return std::make_unique<Buf>(h);
    std::vector<uint16_t> b(h.size());
    for (size_t i = 0; i < h.size(); i++) b[i] = llmt::f32_to_bf16(h[i]);
    auto buf = std::make_unique<Buf>(b);
    buf->bf16_ = true;
    return buf;
  }
  static std::unique_ptr<Buf> act_bytes(size_t n) {
    auto buf = std::make_unique<Buf>(n * llmt::dtype_size(act_dtype()));
    buf->bf16_ = is_bf16();
    return buf;
  }
  ~Buf() { be().release(p_); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void* p() const { return p_; }
  Tensor f32(std::initializer_list<int64_t> dims) const { return Tensor(p_, DType::f32, dims); }
  Tensor f64(std::initializer_list<int64_t> dims) const { return Tensor(p_, DType::f64, dims); }
  Tensor i32(std::initializer_list<int64_t> dims) const { return Tensor(p_, DType::i32, dims); }
  Tensor bf16(std::initializer_list<int64_t> dims) const { return Tensor(p_, DType::bf16, dims); }
  Tensor a(std::initializer_list<int64_t> dims) const { return Tensor(p_, bf16_ ? DType::bf16 : DType::f32, dims); }
  template <class T>
  std::vector<T> read() const {
    std::vector<T> h(bytes_ / sizeof(T));
    be().synchronize();
    if (bytes_) be().copy_to_host(h.data(), p_, bytes_);
    return h;
  }
  // the contents as floats, whatever they are stored in
  FV rf() const {
    if (!bf16_) return read<float>();
    std::vector<uint16_t> h = read<uint16_t>();
    FV f(h.size());
    for (size_t i = 0; i < h.size(); i++) f[i] = llmt::bf16_to_f32(h[i]);
    return f;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
  bool bf16_ = false;
};
using BufP = std::unique_ptr<Buf>;

Tensor null_act(std::initializer_list<int64_t> dims) { return Tensor(nullptr, act_dtype(), dims); }

// ======================= memory =======================

TEST_P(Ops, MemoryAllocZeroedAlignedAndCopies) {
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
  auto e = be().make_event();  // events exist on every backend; on the CPU they are already complete
  be().record(*e);
  be().wait(*e);
  e->synchronize();
}

// ======================= matmul =======================

struct MM {
  int64_t M, N, K;
};

// Forward in all four transpose combinations, with and without bias, overwrite and accumulate, into
// an act output (activations) and an f32 output (parameter gradients).
TEST_P(Ops, MatmulForwardAllTransposesBiasAccumulate) {
  std::mt19937 rng(11);
  for (MM s : {MM{7, 5, 9}, MM{33, 17, 65}, MM{1, 13, 3}})
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int hb = 0; hb < 2; hb++)
          for (int acc = 0; acc < 2; acc++)
            for (int f32_out = 0; f32_out < 2; f32_out++) {
              if (f32_out && hb) continue;  // parameter gradients take no bias
              SCOPED_TRACE(::testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K << " ta=" << ta
                                                << " tb=" << tb << " bias=" << hb << " accumulate=" << acc
                                                << " out=" << (f32_out ? "f32" : "act"));
              FV a = rand_act(rng, s.M * s.K), b = rand_act(rng, s.K * s.N), bias = rand_act(rng, s.N),
                 pre = f32_out ? rand_f(rng, s.M * s.N, 2.f, 3.f) : rand_act(rng, s.M * s.N, 2.f, 3.f);
              BufP da = Buf::act(a), db = Buf::act(b), dbias = Buf::act(bias);
              BufP dout = f32_out ? std::make_unique<Buf>(pre) : Buf::act(pre);
              be().matmul(f32_out ? dout->f32({s.M, s.N}) : dout->a({s.M, s.N}),
                          ta ? da->a({s.K, s.M}) : da->a({s.M, s.K}), tb ? db->a({s.N, s.K}) : db->a({s.K, s.N}),
                          hb ? dbias->a({s.N}) : null_act({s.N}), s.M, s.N, s.K, ta, tb, acc);
              DV want = to_d(pre), bd = to_d(bias);
              llmt_ref::matmul(want, to_d(a), to_d(b), hb ? &bd : nullptr, s.M, s.N, s.K, ta, tb, acc);
              EXPECT_TRUE(Close(dout->rf(), want, f32_out ? tol::kF32OpForward + (is_bf16() ? tol::kBf16OpForward / 4 : 0)
                                                          : fwd_tol()));
            }
}

// Gradients of out = op(a) @ op(b) + bias, computed the way a model computes them (more matmuls in
// the other transpose combinations, and bias_backward), against finite differences of the double
// forward. da (an activation gradient, act) is accumulated (+=) onto random values; db (a parameter
// gradient, f32) is overwritten (=) over garbage.
TEST_P(Ops, MatmulGradientsAllTransposesVsFiniteDifferences) {
  std::mt19937 rng(12);
  const int64_t M = 7, N = 5, K = 9;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb);
      FV a = rand_act(rng, M * K), b = rand_act(rng, K * N), bias = rand_act(rng, N), r = rand_act(rng, M * N);
      FV pre_da = rand_act(rng, M * K), pre_db = rand_f(rng, K * N), pre_dbias = rand_f(rng, N);
      DV ad = to_d(a), bd = to_d(b), biasd = to_d(bias), rd = to_d(r);
      auto L = [&](const DV& A, const DV& Bm, const DV& bi) {
        DV out;
        llmt_ref::matmul(out, A, Bm, &bi, M, N, K, ta, tb, false);
        return dot(out, rd);
      };
      DV ga = fd_grad([&](const DV& x) { return L(x, bd, biasd); }, ad);
      DV gb = fd_grad([&](const DV& x) { return L(ad, x, biasd); }, bd);
      DV gbias = fd_grad([&](const DV& x) { return L(ad, bd, x); }, biasd);

      BufP A = Buf::act(a), Bb = Buf::act(b), R = Buf::act(r), dA = Buf::act(pre_da);
      Buf dB(pre_db), dBias(pre_dbias);
      // dA = r @ B^T  (B = op(b) [K,N])
      if (!ta)
        be().matmul(dA->a({M, K}), R->a({M, N}), tb ? Bb->a({N, K}) : Bb->a({K, N}), null_act({K}), M, K, N, false,
                    !tb, true);
      else  // da stored [K,M] = B @ r^T
        be().matmul(dA->a({K, M}), tb ? Bb->a({N, K}) : Bb->a({K, N}), R->a({M, N}), null_act({M}), K, M, N, tb,
                    true, true);
      // dB = A^T @ r  (A = op(a) [M,K])
      if (!tb)
        be().matmul(dB.f32({K, N}), ta ? A->a({K, M}) : A->a({M, K}), R->a({M, N}), null_act({N}), K, N, M, !ta,
                    false, false);
      else  // db stored [N,K] = r^T @ A
        be().matmul(dB.f32({N, K}), R->a({M, N}), ta ? A->a({K, M}) : A->a({M, K}), null_act({K}), N, K, M, true,
                    ta, false);
      be().bias_backward(dBias.f32({N}), R->a({M, N}), M, N);
      EXPECT_TRUE(Close(dA->rf(), add_d(pre_da, ga), grad_tol())) << "da (accumulate)";
      EXPECT_TRUE(Close(dB.rf(), gb, grad_tol())) << "db (overwrite)";
      EXPECT_TRUE(Close(dBias.rf(), add_d(pre_dbias, gbias), grad_tol())) << "dbias (+=)";
    }
}

// Whether the case runs cuBLASLt's emulated stand-in, whose choice of epilogue shapes is known: on a
// GPU the library's heuristic decides (and the backend warns when it declines one).
bool stand_in_cublaslt(int param) {
  return std::string(backend_cases()[param].name).find("_lt_") != std::string::npos &&
         std::string(llmt::cuda_build_kind()) == "simt";
}
// The case runs cuDNN's stand-in for attention (on a GPU, cuDNN's heuristics decide what it takes).
bool stand_in_cudnn(int param) {
  return std::string(backend_cases()[param].name).find("_dnn_") != std::string::npos &&
         std::string(llmt::cuda_build_kind()) == "simt";
}

// A linear layer into GELU as one op: pre = a b^T + bias and out = gelu(pre), against the double
// reference. N = 24 takes cuBLASLt's GELU_AUX_BIAS epilogue (one launch); N = 13 cannot (the aux
// leading dimension must be a multiple of 8) and runs the matmul and GELU apart.
TEST_P(Ops, MatmulGeluEqualsMatmulThenGelu) {
  std::mt19937 rng(14);
  const bool lt = stand_in_cublaslt(GetParam());
  for (MM s : {MM{19, 24, 33}, MM{7, 13, 9}})
    for (int hb = 0; hb < 2; hb++) {
      SCOPED_TRACE(::testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K << " bias=" << hb);
      FV a = rand_act(rng, s.M * s.K, -2.f, 2.f), b = rand_act(rng, s.N * s.K), bias = rand_act(rng, s.N);
      FV g1 = rand_act(rng, s.M * s.N, 5.f, 6.f), g2 = rand_act(rng, s.M * s.N, 5.f, 6.f);
      BufP A = Buf::act(a), Bm = Buf::act(b), Bias = Buf::act(bias), Out = Buf::act(g1), Pre = Buf::act(g2);
      const int64_t launches = be().counters().launches;
      be().matmul_gelu(Out->a({s.M, s.N}), Pre->a({s.M, s.N}), A->a({s.M, s.K}), Bm->a({s.N, s.K}),
                       hb ? Bias->a({s.N}) : null_act({s.N}), s.M, s.N, s.K);
      if (lt) {
        EXPECT_EQ(be().counters().launches - launches, s.N % 8 ? 2 : 1) << "fused: one cuBLASLt call";
      }
      DV pre, bd = to_d(bias);
      llmt_ref::matmul(pre, to_d(a), to_d(b), hb ? &bd : nullptr, s.M, s.N, s.K, false, true, false);
      EXPECT_TRUE(Close(Pre->rf(), pre, fwd_tol())) << "pre";
      EXPECT_TRUE(Close(Out->rf(), llmt_ref::gelu(pre), fwd_tol())) << "out";
    }
}

// Operands, a bias and GELU's aux buffer one element past their buffers' starts (off 16-byte
// alignment): every backend computes them, and cuBLASLt must choose its algorithm for the alignment it
// is given (cublaslt_matmul.cu shows the search the bias and aux pointers' alignment), not fail at
// launch, as its stand-in does when an algorithm assumed more alignment than a pointer has.
TEST_P(Ops, MatmulWithOperandsOffAlignment) {
  std::mt19937 rng(19);
  const int64_t M = 6, N = 16, K = 8;
  FV a = rand_act(rng, M * K + 1), b = rand_act(rng, N * K + 1), bias = rand_act(rng, N + 1);
  BufP A = Buf::act(a), Bm = Buf::act(b), Bias = Buf::act(bias), Out = Buf::act_bytes(M * N + 1),
       Pre = Buf::act_bytes(M * N + 1);
  auto off = [](const Buf& buf, std::initializer_list<int64_t> dims) {  // a view one element in
    Tensor t = buf.a(dims);
    t.data = (char*)t.data + llmt::dtype_size(t.dtype);
    return t;
  };
  const FV a1(a.begin() + 1, a.end()), b1(b.begin() + 1, b.end()), bias1(bias.begin() + 1, bias.end());
  DV want, bd = to_d(bias1);
  llmt_ref::matmul(want, to_d(a1), to_d(b1), &bd, M, N, K, false, true, false);
  be().matmul(off(*Out, {M, N}), off(*A, {M, K}), off(*Bm, {N, K}), off(*Bias, {N}), M, N, K, false, true, false);
  FV got = Out->rf();
  EXPECT_TRUE(Close(FV(got.begin() + 1, got.end()), want, fwd_tol())) << "matmul with a bias";
  be().matmul_gelu(off(*Out, {M, N}), off(*Pre, {M, N}), off(*A, {M, K}), off(*Bm, {N, K}), off(*Bias, {N}), M, N, K);
  got = Pre->rf();
  EXPECT_TRUE(Close(FV(got.begin() + 1, got.end()), want, fwd_tol())) << "matmul_gelu's pre";
  got = Out->rf();
  EXPECT_TRUE(Close(FV(got.begin() + 1, got.end()), llmt_ref::gelu(want), fwd_tol())) << "matmul_gelu's out";
}

// dpre = (dout b) * gelu'(pre), with gelu' by central differences of the double GELU.
TEST_P(Ops, MatmulDgeluEqualsMatmulThenGeluBackward) {
  std::mt19937 rng(15);
  const bool lt = stand_in_cublaslt(GetParam());
  for (MM s : {MM{19, 24, 33}, MM{7, 13, 9}}) {
    SCOPED_TRACE(::testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K);
    FV dout = rand_act(rng, s.M * s.K), b = rand_act(rng, s.K * s.N), pre = rand_act(rng, s.M * s.N, -4.f, 4.f);
    FV g = rand_act(rng, s.M * s.N, 5.f, 6.f);
    BufP D = Buf::act(dout), Bm = Buf::act(b), P = Buf::act(pre), dP = Buf::act(g);
    const int64_t launches = be().counters().launches;
    be().matmul_dgelu(dP->a({s.M, s.N}), D->a({s.M, s.K}), Bm->a({s.K, s.N}), P->a({s.M, s.N}), s.M, s.N, s.K);
    if (lt) {
      EXPECT_EQ(be().counters().launches - launches, s.N % 8 ? 2 : 1) << "fused: one cuBLASLt call";
    }
    DV want;
    llmt_ref::matmul(want, to_d(dout), to_d(b), nullptr, s.M, s.N, s.K, false, false, false);
    for (size_t i = 0; i < want.size(); i++) {
      const double x = pre[i];
      want[i] *= (llmt_ref::gelu(x + kFdEps) - llmt_ref::gelu(x - kFdEps)) / (2 * kFdEps);
    }
    EXPECT_TRUE(Close(dP->rf(), want, grad_tol()));
  }
}

// out = residual + a b^T + bias as one op (cuBLASLt: C = residual, D = out), the residual untouched.
TEST_P(Ops, MatmulResidualAddsTheResidualOnce) {
  std::mt19937 rng(16);
  const bool lt = stand_in_cublaslt(GetParam());
  for (MM s : {MM{19, 24, 33}, MM{7, 13, 9}})
    for (int hb = 0; hb < 2; hb++) {
      SCOPED_TRACE(::testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K << " bias=" << hb);
      FV a = rand_act(rng, s.M * s.K), b = rand_act(rng, s.N * s.K), bias = rand_act(rng, s.N);
      FV res = rand_act(rng, s.M * s.N, -3.f, 3.f), g = rand_act(rng, s.M * s.N, 5.f, 6.f);
      BufP A = Buf::act(a), Bm = Buf::act(b), Bias = Buf::act(bias), R = Buf::act(res), Out = Buf::act(g);
      const int64_t launches = be().counters().launches;
      be().matmul_residual(Out->a({s.M, s.N}), R->a({s.M, s.N}), A->a({s.M, s.K}), Bm->a({s.N, s.K}),
                           hb ? Bias->a({s.N}) : null_act({s.N}), s.M, s.N, s.K);
      if (lt) {
        EXPECT_EQ(be().counters().launches - launches, 1) << "one cuBLASLt call, no copy";
      }
      DV want = to_d(res), bd = to_d(bias);
      llmt_ref::matmul(want, to_d(a), to_d(b), hb ? &bd : nullptr, s.M, s.N, s.K, false, true, true);
      EXPECT_TRUE(Close(Out->rf(), want, fwd_tol())) << "out";
      EXPECT_EQ(R->rf(), res) << "the residual is read, not written";
    }
}

TEST_P(Ops, MatmulRejectsMixedInputDtypes) {
  Buf a(64 * 4), b(64 * 4), out(64 * 4);
  Tensor wrong = is_bf16() ? a.f32({8, 8}) : a.bf16({8, 8});
  EXPECT_THROW(be().matmul(out.f32({8, 8}), wrong, b.a({8, 8}), null_act({8}), 8, 8, 8, false, false, false),
               llmt::Error);
}

TEST_P(Ops, BiasBackwardAccumulatesColumnSums) {
  std::mt19937 rng(13);
  for (MM s : {MM{13, 11, 0}, MM{1, 7, 0}, MM{257, 3, 0}}) {
    FV dout = rand_act(rng, s.M * s.N), pre = rand_f(rng, s.N, 1.f, 2.f);
    DV want = to_d(pre);
    for (int64_t m = 0; m < s.M; m++)
      for (int64_t n = 0; n < s.N; n++) want[n] += dout[m * s.N + n];
    BufP D = Buf::act(dout);
    Buf DB(pre);
    be().bias_backward(DB.f32({s.N}), D->a({s.M, s.N}), s.M, s.N);
    EXPECT_TRUE(Close(DB.rf(), want, tol::kF32OpForward)) << "M=" << s.M << " N=" << s.N;
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

TEST_P(Ops, EmbeddingForwardWithAndWithoutWpe) {
  std::mt19937 rng(21);
  for (int with_wpe = 0; with_wpe < 2; with_wpe++) {
    SCOPED_TRACE(with_wpe ? "with wpe" : "without wpe");
    IV tok = make_tokens(rng);
    FV wte = rand_act(rng, V_ * C_), wpe = rand_act(rng, T_ * C_), garbage = rand_act(rng, B_ * T_ * C_, 5.f, 6.f);
    Buf Tok(tok);
    BufP Wte = Buf::act(wte), Wpe = Buf::act(wpe), Out = Buf::act(garbage);
    be().embedding_forward(Out->a({B_ * T_, C_}), Tok.i32({B_, T_}), Wte->a({V_, C_}),
                           with_wpe ? Wpe->a({T_, C_}) : null_act({T_, C_}), B_, T_, C_, V_);
    DV wpd = to_d(wpe);
    EXPECT_TRUE(
        Close(Out->rf(), llmt_ref::embedding(tok, to_d(wte), with_wpe ? &wpd : nullptr, B_, T_, C_), fwd_tol()));
  }
}

TEST_P(Ops, EmbeddingBackwardVsFiniteDifferencesAccumulates) {
  std::mt19937 rng(22);
  for (int with_wpe = 0; with_wpe < 2; with_wpe++) {
    SCOPED_TRACE(with_wpe ? "with wpe" : "without wpe");
    IV tok = make_tokens(rng);
    FV wte = rand_act(rng, V_ * C_), wpe = rand_act(rng, T_ * C_), r = rand_act(rng, B_ * T_ * C_);
    FV pre_wte = rand_f(rng, V_ * C_), pre_wpe = rand_f(rng, T_ * C_);
    DV wted = to_d(wte), wped = to_d(wpe), rd = to_d(r);
    DV gwte = fd_grad(
        [&](const DV& x) { return dot(llmt_ref::embedding(tok, x, with_wpe ? &wped : nullptr, B_, T_, C_), rd); },
        wted);
    Buf Tok(tok), dWte(pre_wte), dWpe(pre_wpe);
    BufP R = Buf::act(r);
    be().embedding_backward(dWte.f32({V_, C_}), with_wpe ? dWpe.f32({T_, C_}) : Tensor(nullptr, DType::f32, {T_, C_}),
                            R->a({B_ * T_, C_}), Tok.i32({B_, T_}), B_, T_, C_);
    EXPECT_TRUE(Close(dWte.rf(), add_d(pre_wte, gwte), grad_tol())) << "dwte (+=)";
    if (with_wpe) {
      DV gwpe = fd_grad([&](const DV& x) { return dot(llmt_ref::embedding(tok, wted, &x, B_, T_, C_), rd); }, wped);
      EXPECT_TRUE(Close(dWpe.rf(), add_d(pre_wpe, gwpe), grad_tol())) << "dwpe (+=)";
    } else {
      EXPECT_EQ(dWpe.rf(), pre_wpe) << "dwpe buffer touched although dwpe.data was null";
    }
  }
}

// At training sizes a device backend splits the rows by token id over many threads (kernels/cuda:
// classes of ids); each id's rows must still add in row order, so every backend gives the sums of
// the plain loop below bit for bit, and a bad id in any class is still refused.
TEST_P(Ops, EmbeddingBackwardAddsEachIdsRowsInRowOrderAtTrainingSizes) {
  std::mt19937 rng(25);
  const int B = 8, T = 64, C = 12, V = 50;  // 512 rows: several classes of ids on a device
  std::uniform_int_distribution<int> pick(0, V - 1);
  IV tok(B * T);
  for (auto& t : tok) t = pick(rng) % 7 == 0 ? 3 : pick(rng);  // id 3 frequent, as a space or "the" is
  FV dout = rand_act(rng, (size_t)B * T * C), pre_wte = rand_f(rng, V * C), pre_wpe = rand_f(rng, T * C);
  FV want_wte = pre_wte, want_wpe = pre_wpe;
  for (int64_t row = 0; row < B * T; row++)
    for (int c = 0; c < C; c++) {
      want_wte[(size_t)tok[row] * C + c] += dout[(size_t)row * C + c];
      want_wpe[(size_t)(row % T) * C + c] += dout[(size_t)row * C + c];
    }
  Buf Tok(tok), dWte(pre_wte), dWpe(pre_wpe);
  BufP D = Buf::act(dout);
  be().embedding_backward(dWte.f32({V, C}), dWpe.f32({T, C}), D->a({B * T, C}), Tok.i32({B, T}), B, T, C);
  be().synchronize();
  EXPECT_EQ(dWte.rf(), want_wte) << "dwte";
  EXPECT_EQ(dWpe.rf(), want_wpe) << "dwpe";
  for (int at : {0, B * T / 2 + 1, B * T - 1}) {
    IV bad = tok;
    bad[at] = at == 0 ? -1 : V + at;
    Buf BadTok(bad);
    EXPECT_THROW(
        {
          be().embedding_backward(dWte.f32({V, C}), Tensor(nullptr, DType::f32, {T, C}), D->a({B * T, C}),
                                  BadTok.i32({B, T}), B, T, C);
          be().synchronize();
        },
        llmt::Error)
        << "bad id at row " << at;
  }
}

TEST_P(Ops, EmbeddingTokenOutOfRangeThrows) {
  std::mt19937 rng(23);
  FV wte = rand_act(rng, V_ * C_), wpe = rand_act(rng, T_ * C_);
  BufP Wte = Buf::act(wte), Wpe = Buf::act(wpe), Out = Buf::act_bytes(B_ * T_ * C_);
  for (int bad : {V_, V_ + 100, -1, -100}) {
    IV tok = make_tokens(rng);
    tok[B_ * T_ - 1] = bad;
    Buf Tok(tok);
    // a device backend may report it at the next synchronize
    EXPECT_THROW(
        {
          be().embedding_forward(Out->a({B_ * T_, C_}), Tok.i32({B_, T_}), Wte->a({V_, C_}), Wpe->a({T_, C_}), B_, T_,
                                 C_, V_);
          be().synchronize();
        },
        llmt::Error)
        << "token id " << bad << " with V=" << V_;
  }
}

// The backward with a bad id: on a device the forward's report of it is read only at the next
// synchronize, after the backward of the same step has run, so the backward must not write through
// it. dwte sits between two guard regions of V rows each, which must stay zero.
TEST_P(Ops, EmbeddingBackwardTokenOutOfRangeThrowsAndWritesNothingOutside) {
  std::mt19937 rng(24);
  FV r = rand_act(rng, B_ * T_ * C_);
  BufP R = Buf::act(r);
  for (int bad : {V_, V_ + 1, 2 * V_ - 1, -1, -V_}) {
    IV tok = make_tokens(rng);
    tok[B_ * T_ / 2] = bad;
    Buf Tok(tok), Big(FV(3 * V_ * C_, 0.0f));
    Tensor dwte = Big.f32({3 * V_, C_}).view(V_ * C_, {V_, C_});
    EXPECT_THROW(
        {
          be().embedding_backward(dwte, Tensor(nullptr, DType::f32, {T_, C_}), R->a({B_ * T_, C_}),
                                  Tok.i32({B_, T_}), B_, T_, C_);
          be().synchronize();
        },
        llmt::Error)
        << "token id " << bad << " with V=" << V_;
    FV after = Big.read<float>();
    for (int64_t i = 0; i < V_ * C_; i++) {
      ASSERT_EQ(after[i], 0.0f) << "token id " << bad << ": wrote below dwte at element " << i;
      ASSERT_EQ(after[2 * V_ * C_ + i], 0.0f) << "token id " << bad << ": wrote above dwte at element " << i;
    }
  }
}

// ======================= norms =======================

constexpr int64_t NN = 14;  // rows
constexpr int NC = 12;      // channels

TEST_P(Ops, LayerNormForwardMatchesReference) {
  std::mt19937 rng(31);
  // 12 channels: bf16 rows take the scalar kernels on a GPU, f32 rows the 16-byte ones; 40: both vectorised
  for (const int NC : {12, 40}) {
    SCOPED_TRACE(::testing::Message() << NC << " channels");
    FV x = rand_f(rng, NN * NC), w = rand_act(rng, NC), b = rand_act(rng, NC);
    for (int i = 0; i < NN * NC; i++) x[i] = representable(x[i] + 0.3f * (i / NC));  // rows with different means
    FV g1 = rand_act(rng, NN * NC, 5.f, 6.f), g2 = rand_f(rng, NN, 5.f, 6.f), g3 = rand_f(rng, NN, 5.f, 6.f);
    BufP X = Buf::act(x), W = Buf::act(w), Bb = Buf::act(b), Out = Buf::act(g1);
    Buf Mean(g2), Rstd(g3);
    const float eps = 1e-5f;
    be().layernorm_forward(Out->a({NN, NC}), Mean.f32({NN}), Rstd.f32({NN}), X->a({NN, NC}), W->a({NC}), Bb->a({NC}), NN,
                           NC, eps);
    DV mean, rstd;
    DV want = llmt_ref::layernorm(to_d(x), to_d(w), to_d(b), NN, NC, eps, &mean, &rstd);
    EXPECT_TRUE(Close(Out->rf(), want, fwd_tol())) << "out";
    EXPECT_TRUE(Close(Mean.rf(), mean, tol::kF32OpForward)) << "mean (f32 statistics)";
    EXPECT_TRUE(Close(Rstd.rf(), rstd, tol::kF32OpForward)) << "rstd (f32 statistics)";
  }
}

TEST_P(Ops, LayerNormBackwardVsFiniteDifferencesAccumulates) {
  std::mt19937 rng(32);
  // 12 channels: bf16 rows take the scalar kernels on a GPU, f32 rows the 16-byte ones; 40: both vectorised
  for (const int NC : {12, 40}) {
    SCOPED_TRACE(::testing::Message() << NC << " channels");
    FV x = rand_act(rng, NN * NC), w = rand_act(rng, NC), b = rand_act(rng, NC), r = rand_act(rng, NN * NC);
    FV pre_dx = rand_act(rng, NN * NC), pre_dw = rand_f(rng, NC), pre_db = rand_f(rng, NC);
    const float eps = 1e-5f;
    BufP X = Buf::act(x), W = Buf::act(w), Bb = Buf::act(b), Out = Buf::act_bytes(NN * NC), R = Buf::act(r),
         dX = Buf::act(pre_dx);
    Buf Mean(NN * 4), Rstd(NN * 4), dW(pre_dw), dB(pre_db);
    be().layernorm_forward(Out->a({NN, NC}), Mean.f32({NN}), Rstd.f32({NN}), X->a({NN, NC}), W->a({NC}), Bb->a({NC}), NN,
                           NC, eps);
    be().layernorm_backward(dX->a({NN, NC}), dW.f32({NC}), dB.f32({NC}), R->a({NN, NC}), X->a({NN, NC}), W->a({NC}),
                            Mean.f32({NN}), Rstd.f32({NN}), NN, NC);
    DV xd = to_d(x), wd = to_d(w), bd = to_d(b), rd = to_d(r);
    auto L = [&](const DV& X_, const DV& W_, const DV& B_) {
      return dot(llmt_ref::layernorm(X_, W_, B_, NN, NC, eps), rd);
    };
    EXPECT_TRUE(Close(dX->rf(), add_d(pre_dx, fd_grad([&](const DV& v) { return L(v, wd, bd); }, xd)), grad_tol()))
        << "dx (+=)";
    EXPECT_TRUE(Close(dW.rf(), add_d(pre_dw, fd_grad([&](const DV& v) { return L(xd, v, bd); }, wd)), grad_tol()))
        << "dw (+=)";
    EXPECT_TRUE(Close(dB.rf(), add_d(pre_db, fd_grad([&](const DV& v) { return L(xd, wd, v); }, bd)), grad_tol()))
        << "db (+=)";
  }
}

TEST_P(Ops, RmsNormForwardMatchesReference) {
  std::mt19937 rng(33);
  // 12 channels: bf16 rows take the scalar kernels on a GPU, f32 rows the 16-byte ones; 40: both vectorised
  for (const int NC : {12, 40}) {
    SCOPED_TRACE(::testing::Message() << NC << " channels");
    FV x = rand_act(rng, NN * NC), w = rand_act(rng, NC);
    FV g1 = rand_act(rng, NN * NC, 5.f, 6.f), g2 = rand_f(rng, NN, 5.f, 6.f);
    BufP X = Buf::act(x), W = Buf::act(w), Out = Buf::act(g1);
    Buf Rstd(g2);
    const float eps = 1e-6f;
    be().rmsnorm_forward(Out->a({NN, NC}), Rstd.f32({NN}), X->a({NN, NC}), W->a({NC}), NN, NC, eps);
    DV rstd;
    DV want = llmt_ref::rmsnorm(to_d(x), to_d(w), NN, NC, eps, &rstd);
    EXPECT_TRUE(Close(Out->rf(), want, fwd_tol())) << "out";
    EXPECT_TRUE(Close(Rstd.rf(), rstd, tol::kF32OpForward)) << "rstd (f32 statistics)";
  }
}

TEST_P(Ops, RmsNormBackwardVsFiniteDifferencesAccumulates) {
  std::mt19937 rng(34);
  // 12 channels: bf16 rows take the scalar kernels on a GPU, f32 rows the 16-byte ones; 40: both vectorised
  for (const int NC : {12, 40}) {
    SCOPED_TRACE(::testing::Message() << NC << " channels");
    FV x = rand_act(rng, NN * NC), w = rand_act(rng, NC), r = rand_act(rng, NN * NC);
    FV pre_dx = rand_act(rng, NN * NC), pre_dw = rand_f(rng, NC);
    const float eps = 1e-6f;
    BufP X = Buf::act(x), W = Buf::act(w), Out = Buf::act_bytes(NN * NC), R = Buf::act(r), dX = Buf::act(pre_dx);
    Buf Rstd(NN * 4), dW(pre_dw);
    be().rmsnorm_forward(Out->a({NN, NC}), Rstd.f32({NN}), X->a({NN, NC}), W->a({NC}), NN, NC, eps);
    be().rmsnorm_backward(dX->a({NN, NC}), dW.f32({NC}), R->a({NN, NC}), X->a({NN, NC}), W->a({NC}), Rstd.f32({NN}), NN,
                          NC);
    DV xd = to_d(x), wd = to_d(w), rd = to_d(r);
    auto L = [&](const DV& X_, const DV& W_) { return dot(llmt_ref::rmsnorm(X_, W_, NN, NC, eps), rd); };
    EXPECT_TRUE(Close(dX->rf(), add_d(pre_dx, fd_grad([&](const DV& v) { return L(v, wd); }, xd)), grad_tol()))
        << "dx (+=)";
    EXPECT_TRUE(Close(dW.rf(), add_d(pre_dw, fd_grad([&](const DV& v) { return L(xd, v); }, wd)), grad_tol()))
        << "dw (+=)";
  }
}

// Gemma's RMSNorm, (1 + w): w_offset 1 against the reference with 1 + w in double; dw is the plain
// norm's (the offset adds nothing to it), dx goes through 1 + w. Weights near 0, as Gemma's.
TEST_P(Ops, RmsNormWeightOffsetForwardAndBackward) {
  std::mt19937 rng(36);
  const float eps = 1e-6f;
  for (const int NC : {12, 40}) {
    SCOPED_TRACE(::testing::Message() << NC << " channels");
    FV x = rand_act(rng, NN * NC), w = rand_act(rng, NC, -0.1f, 0.1f), r = rand_act(rng, NN * NC);
    FV pre_dx = rand_act(rng, NN * NC), pre_dw = rand_f(rng, NC), junk = rand_act(rng, NN * NC, 5.f, 6.f);
    BufP X = Buf::act(x), W = Buf::act(w), Out = Buf::act(junk), R = Buf::act(r), dX = Buf::act(pre_dx);
    Buf Rstd(NN * 4), dW(pre_dw);
    be().rmsnorm_forward(Out->a({NN, NC}), Rstd.f32({NN}), X->a({NN, NC}), W->a({NC}), NN, NC, eps, 1.0f);
    auto plus1 = [](DV v) {
      for (double& e : v) e += 1.0;
      return v;
    };
    const DV xd = to_d(x), wd = to_d(w), rd = to_d(r);
    EXPECT_TRUE(Close(Out->rf(), llmt_ref::rmsnorm(xd, plus1(wd), NN, NC, eps), fwd_tol())) << "out";
    be().rmsnorm_backward(dX->a({NN, NC}), dW.f32({NC}), R->a({NN, NC}), X->a({NN, NC}), W->a({NC}), Rstd.f32({NN}), NN,
                          NC, 1.0f);
    auto L = [&](const DV& X_, const DV& W_) { return dot(llmt_ref::rmsnorm(X_, plus1(W_), NN, NC, eps), rd); };
    EXPECT_TRUE(Close(dX->rf(), add_d(pre_dx, fd_grad([&](const DV& v) { return L(v, wd); }, xd)), grad_tol()))
        << "dx (+=)";
    EXPECT_TRUE(Close(dW.rf(), add_d(pre_dw, fd_grad([&](const DV& v) { return L(xd, v); }, wd)), grad_tol()))
        << "dw (+=)";
  }
}

// Qwen3's per-head q/k RMSNorm: each q head with wq, each k head with wk, v copied (the reference:
// llmt_ref::rmsnorm over the gathered heads).
DV head_rmsnorm_ref(const DV& x, const DV& wq, const DV& wk, int64_t N, int NH, int NKV, int hs, float eps) {
  const int pieces = NH + 2 * NKV;
  DV out = x;
  for (int part = 0; part < 2; part++) {
    const int h0 = part ? NH : 0, nh = part ? NKV : NH;
    DV g((size_t)(N * nh * hs));
    for (int64_t n = 0; n < N; n++)
      for (int h = 0; h < nh; h++)
        for (int c = 0; c < hs; c++) g[(size_t)((n * nh + h) * hs + c)] = x[(size_t)((n * pieces + h0 + h) * hs + c)];
    DV y = llmt_ref::rmsnorm(g, part ? wk : wq, N * nh, hs, eps);
    for (int64_t n = 0; n < N; n++)
      for (int h = 0; h < nh; h++)
        for (int c = 0; c < hs; c++) out[(size_t)((n * pieces + h0 + h) * hs + c)] = y[(size_t)((n * nh + h) * hs + c)];
  }
  return out;
}

TEST_P(Ops, HeadRmsNormForwardAndBackwardVsFiniteDifferences) {
  std::mt19937 rng(35);
  const int64_t N = 5;
  const int NH = 4, NKV = 2;
  const float eps = 1e-6f;
  for (const int hs : {12, 16}) {
    SCOPED_TRACE(::testing::Message() << "head size " << hs);
    const int64_t row = (int64_t)(NH + 2 * NKV) * hs, n = N * row;
    FV x = rand_act(rng, n), wq = rand_act(rng, hs), wk = rand_act(rng, hs), r = rand_act(rng, n);
    FV pre_dwq = rand_f(rng, hs), pre_dwk = rand_f(rng, hs), junk = rand_act(rng, n);
    BufP X = Buf::act(x), WQ = Buf::act(wq), WK = Buf::act(wk), Out = Buf::act(junk), R = Buf::act(r),
         dX = Buf::act(junk);
    Buf Rstd(N * (NH + NKV) * 4), dWQ(pre_dwq), dWK(pre_dwk);
    be().head_rmsnorm_forward(Out->a({N, row}), Rstd.f32({N * (NH + NKV)}), X->a({N, row}), WQ->a({hs}), WK->a({hs}), N,
                              NH, NKV, hs, eps);
    const DV xd = to_d(x), wqd = to_d(wq), wkd = to_d(wk), rd = to_d(r);
    EXPECT_TRUE(Close(Out->rf(), head_rmsnorm_ref(xd, wqd, wkd, N, NH, NKV, hs, eps), fwd_tol())) << "out";
    auto L = [&](const DV& X_, const DV& Q_, const DV& K_) {
      return dot(head_rmsnorm_ref(X_, Q_, K_, N, NH, NKV, hs, eps), rd);
    };
    const DV want_dx = fd_grad([&](const DV& v) { return L(v, wqd, wkd); }, xd);
    // din (=) apart from dout, then in place (din = dout); dwq and dwk (+=) twice
    be().head_rmsnorm_backward(dX->a({N, row}), dWQ.f32({hs}), dWK.f32({hs}), R->a({N, row}), X->a({N, row}),
                               WQ->a({hs}), WK->a({hs}), Rstd.f32({N * (NH + NKV)}), N, NH, NKV, hs);
    EXPECT_TRUE(Close(dX->rf(), want_dx, grad_tol())) << "din (=)";
    be().head_rmsnorm_backward(R->a({N, row}), dWQ.f32({hs}), dWK.f32({hs}), R->a({N, row}), X->a({N, row}),
                               WQ->a({hs}), WK->a({hs}), Rstd.f32({N * (NH + NKV)}), N, NH, NKV, hs);
    EXPECT_TRUE(Close(R->rf(), want_dx, grad_tol())) << "din in place";
    const DV gq = fd_grad([&](const DV& v) { return L(xd, v, wkd); }, wqd),
             gk = fd_grad([&](const DV& v) { return L(xd, wqd, v); }, wkd);
    auto twice = [](DV g) {
      for (double& v : g) v *= 2.0;
      return g;
    };
    EXPECT_TRUE(Close(dWQ.rf(), add_d(pre_dwq, twice(gq)), grad_tol())) << "dwq (+=)";
    EXPECT_TRUE(Close(dWK.rf(), add_d(pre_dwk, twice(gk)), grad_tol())) << "dwk (+=)";
  }
}

// Gemma 3's q/k norms: head_rmsnorm with w_offset 1 is the reference with 1 + wq and 1 + wk.
TEST_P(Ops, HeadRmsNormWeightOffsetForwardAndBackward) {
  std::mt19937 rng(37);
  const int64_t N = 5;
  const int NH = 4, NKV = 2, hs = 16;
  const float eps = 1e-6f;
  const int64_t row = (int64_t)(NH + 2 * NKV) * hs, n = N * row;
  FV x = rand_act(rng, n), wq = rand_act(rng, hs, -0.1f, 0.1f), wk = rand_act(rng, hs, -0.1f, 0.1f),
     r = rand_act(rng, n), pre_dwq = rand_f(rng, hs), pre_dwk = rand_f(rng, hs), junk = rand_act(rng, n);
  BufP X = Buf::act(x), WQ = Buf::act(wq), WK = Buf::act(wk), Out = Buf::act(junk), R = Buf::act(r),
       dX = Buf::act(junk);
  Buf Rstd(N * (NH + NKV) * 4), dWQ(pre_dwq), dWK(pre_dwk);
  be().head_rmsnorm_forward(Out->a({N, row}), Rstd.f32({N * (NH + NKV)}), X->a({N, row}), WQ->a({hs}), WK->a({hs}), N,
                            NH, NKV, hs, eps, 1.0f);
  auto plus1 = [](DV v) {
    for (double& e : v) e += 1.0;
    return v;
  };
  const DV xd = to_d(x), wqd = to_d(wq), wkd = to_d(wk), rd = to_d(r);
  EXPECT_TRUE(Close(Out->rf(), head_rmsnorm_ref(xd, plus1(wqd), plus1(wkd), N, NH, NKV, hs, eps), fwd_tol())) << "out";
  auto L = [&](const DV& X_, const DV& Q_, const DV& K_) {
    return dot(head_rmsnorm_ref(X_, plus1(Q_), plus1(K_), N, NH, NKV, hs, eps), rd);
  };
  be().head_rmsnorm_backward(dX->a({N, row}), dWQ.f32({hs}), dWK.f32({hs}), R->a({N, row}), X->a({N, row}),
                             WQ->a({hs}), WK->a({hs}), Rstd.f32({N * (NH + NKV)}), N, NH, NKV, hs, 1.0f);
  EXPECT_TRUE(Close(dX->rf(), fd_grad([&](const DV& v) { return L(v, wqd, wkd); }, xd), grad_tol())) << "din";
  EXPECT_TRUE(Close(dWQ.rf(), add_d(pre_dwq, fd_grad([&](const DV& v) { return L(xd, v, wkd); }, wqd)), grad_tol()))
      << "dwq (+=)";
  EXPECT_TRUE(Close(dWK.rf(), add_d(pre_dwk, fd_grad([&](const DV& v) { return L(xd, wqd, v); }, wkd)), grad_tol()))
      << "dwk (+=)";
}

// Long rows: 4104 channels (513 16-byte bf16 chunks: a GPU's vectorised kernels hold several a
// thread) and 20008 (past what they hold: the scalar kernels again), forward against the reference and
// dx against the backward's formula on the forward's own statistics (+=).
TEST_P(Ops, NormsOverLongRows) {
  std::mt19937 rng(36);
  const int64_t N = 3;
  for (const int C : {4104, 20008}) {
    SCOPED_TRACE(::testing::Message() << C << " channels");
    FV x = rand_act(rng, N * C), w = rand_act(rng, C), b = rand_act(rng, C), r = rand_act(rng, N * C);
    FV pre = rand_act(rng, N * C);
    BufP X = Buf::act(x), W = Buf::act(w), Bb = Buf::act(b), R = Buf::act(r), Out = Buf::act_bytes(N * C),
         dLn = Buf::act(pre), dRms = Buf::act(pre);
    Buf Mean(N * 4), Rstd(N * 4), RmsRstd(N * 4), dW(C * 4), dB(C * 4);
    be().layernorm_forward(Out->a({N, C}), Mean.f32({N}), Rstd.f32({N}), X->a({N, C}), W->a({C}), Bb->a({C}), N, C,
                           1e-5f);
    EXPECT_TRUE(Close(Out->rf(), llmt_ref::layernorm(to_d(x), to_d(w), to_d(b), N, C, 1e-5f), fwd_tol())) << "layernorm";
    be().rmsnorm_forward(Out->a({N, C}), RmsRstd.f32({N}), X->a({N, C}), W->a({C}), N, C, 1e-6f);
    EXPECT_TRUE(Close(Out->rf(), llmt_ref::rmsnorm(to_d(x), to_d(w), N, C, 1e-6f), fwd_tol())) << "rmsnorm";
    be().layernorm_backward(dLn->a({N, C}), dW.f32({C}), dB.f32({C}), R->a({N, C}), X->a({N, C}), W->a({C}),
                            Mean.f32({N}), Rstd.f32({N}), N, C);
    be().rmsnorm_backward(dRms->a({N, C}), dW.f32({C}), R->a({N, C}), X->a({N, C}), W->a({C}), RmsRstd.f32({N}), N, C);
    const FV mean = Mean.rf(), rstd = Rstd.rf(), rms = RmsRstd.rf();
    DV want_ln = to_d(pre), want_rms = to_d(pre);
    for (int64_t i = 0; i < N; i++) {
      double s_dn = 0, s_dnn = 0, s_rms = 0;
      for (int c = 0; c < C; c++) {
        const double dn = (double)r[i * C + c] * w[c], n = (x[i * C + c] - mean[i]) * (double)rstd[i];
        s_dn += dn, s_dnn += dn * n, s_rms += dn * x[i * C + c] * rms[i];
      }
      for (int c = 0; c < C; c++) {
        const double dn = (double)r[i * C + c] * w[c], n = (x[i * C + c] - mean[i]) * (double)rstd[i];
        want_ln[i * C + c] += (dn - s_dn / C - n * s_dnn / C) * rstd[i];
        want_rms[i * C + c] += (dn - x[i * C + c] * (double)rms[i] * s_rms / C) * rms[i];
      }
    }
    EXPECT_TRUE(Close(dLn->rf(), want_ln, grad_tol())) << "layernorm dx (+=)";
    EXPECT_TRUE(Close(dRms->rf(), want_rms, grad_tol())) << "rmsnorm dx (+=)";
  }
}

// The weight and bias gradients of the norms and the bias gradient over many rows (on a GPU: column
// sums in chunks of rows, then the chunks in order), against direct sums with the forward's own
// statistics; accumulating (+=), and a second run bitwise the same.
TEST_P(Ops, NormAndBiasGradientsOverManyRows) {
  std::mt19937 rng(35);
  {  // the bias alone over 33000 rows: past 128 chunks of 256 rows
    const int64_t N = 33000, C = 3;
    FV dout = rand_act(rng, N * C), pre = rand_f(rng, C);
    DV want = to_d(pre);
    for (int64_t i = 0; i < N * C; i++) want[i % C] += dout[i];
    BufP D = Buf::act(dout);
    Buf DB(pre);
    be().bias_backward(DB.f32({C}), D->a({N, C}), N, C);
    EXPECT_TRUE(Close(DB.rf(), want, tol::kF32OpForward)) << "bias over 33000 rows (+=)";
  }
  {  // 600 rows: three chunks; 40 columns: a ragged second block of 32
    const int64_t N = 600;
    const int C = 40;
    FV x = rand_act(rng, N * C), w = rand_act(rng, C), b = rand_act(rng, C), r = rand_act(rng, N * C);
    FV pre_dw = rand_f(rng, C), pre_db = rand_f(rng, C);
    BufP X = Buf::act(x), W = Buf::act(w), Bb = Buf::act(b), Out = Buf::act_bytes(N * C), R = Buf::act(r),
         dX = Buf::act_bytes(N * C);
    Buf Mean(N * 4), Rstd(N * 4), RmsRstd(N * 4);
    be().layernorm_forward(Out->a({N, C}), Mean.f32({N}), Rstd.f32({N}), X->a({N, C}), W->a({C}), Bb->a({C}), N, C,
                           1e-5f);
    be().rmsnorm_forward(Out->a({N, C}), RmsRstd.f32({N}), X->a({N, C}), W->a({C}), N, C, 1e-6f);
    FV mean = Mean.rf(), rstd = Rstd.rf(), rms_rstd = RmsRstd.rf();
    DV want_ln_dw = to_d(pre_dw), want_ln_db = to_d(pre_db), want_rms_dw = to_d(pre_dw), want_bias = to_d(pre_db);
    for (int64_t i = 0; i < N; i++)
      for (int c = 0; c < C; c++) {
        const double d = r[i * C + c], xv = x[i * C + c];
        want_ln_dw[c] += d * (xv - mean[i]) * rstd[i];
        want_ln_db[c] += d;
        want_rms_dw[c] += d * xv * rms_rstd[i];
        want_bias[c] += d;
      }
    FV got[4], again[4];
    for (FV* out : {got, again}) {
      Buf LnDw(pre_dw), LnDb(pre_db), RmsDw(pre_dw), Bias(pre_db);
      be().layernorm_backward(dX->a({N, C}), LnDw.f32({C}), LnDb.f32({C}), R->a({N, C}), X->a({N, C}), W->a({C}),
                              Mean.f32({N}), Rstd.f32({N}), N, C);
      be().rmsnorm_backward(dX->a({N, C}), RmsDw.f32({C}), R->a({N, C}), X->a({N, C}), W->a({C}), RmsRstd.f32({N}), N,
                            C);
      be().bias_backward(Bias.f32({C}), R->a({N, C}), N, C);
      out[0] = LnDw.rf(), out[1] = LnDb.rf(), out[2] = RmsDw.rf(), out[3] = Bias.rf();
    }
    EXPECT_TRUE(Close(got[0], want_ln_dw, tol::kF32OpForward)) << "layernorm dw (+=)";
    EXPECT_TRUE(Close(got[1], want_ln_db, tol::kF32OpForward)) << "layernorm db (+=)";
    EXPECT_TRUE(Close(got[2], want_rms_dw, tol::kF32OpForward)) << "rmsnorm dw (+=)";
    EXPECT_TRUE(Close(got[3], want_bias, tol::kF32OpForward)) << "bias (+=)";
    for (int k = 0; k < 4; k++) EXPECT_EQ(got[k], again[k]) << "gradient " << k << " differs in a second run";
  }
}

// ======================= activations =======================

TEST_P(Ops, GeluForwardMatchesTanhReference) {
  std::mt19937 rng(41);
  const int64_t n = 1001;
  FV x = rand_act(rng, n, -4.f, 4.f), g = rand_act(rng, n, 5.f, 6.f);
  BufP X = Buf::act(x), Out = Buf::act(g);
  be().gelu_forward(Out->a({n}), X->a({n}), n);
  EXPECT_TRUE(Close(Out->rf(), llmt_ref::gelu(to_d(x)), fwd_tol()));
}

TEST_P(Ops, GeluBackwardVsFiniteDifferencesOverwritesAndAliases) {
  std::mt19937 rng(42);
  const int64_t n = 257;
  FV x = rand_act(rng, n, -4.f, 4.f), r = rand_act(rng, n), g = rand_act(rng, n, 5.f, 6.f);
  DV rd = to_d(r);
  DV want = fd_grad([&](const DV& v) { return dot(llmt_ref::gelu(v), rd); }, to_d(x));
  {
    BufP X = Buf::act(x), R = Buf::act(r), dX = Buf::act(g);
    be().gelu_backward(dX->a({n}), X->a({n}), R->a({n}), n);
    EXPECT_TRUE(Close(dX->rf(), want, grad_tol())) << "dx (=) over garbage";
  }
  {
    BufP X = Buf::act(x), R = Buf::act(r);
    be().gelu_backward(R->a({n}), X->a({n}), R->a({n}), n);  // dx aliases dout
    EXPECT_TRUE(Close(R->rf(), want, grad_tol())) << "dx aliasing dout";
  }
}

TEST_P(Ops, SwiGLUForwardMatchesReference) {
  std::mt19937 rng(43);
  const int64_t N = 14;
  const int I = 9;
  FV gu = rand_act(rng, N * 2 * I, -3.f, 3.f), g = rand_act(rng, N * I, 5.f, 6.f);
  BufP GU = Buf::act(gu), Out = Buf::act(g);
  be().swiglu_forward(Out->a({N, I}), GU->a({N, 2 * I}), N, I);
  EXPECT_TRUE(Close(Out->rf(), llmt_ref::swiglu(to_d(gu), N, I), fwd_tol()));
}

TEST_P(Ops, SwiGLUBackwardVsFiniteDifferencesOverwrites) {
  std::mt19937 rng(44);
  const int64_t N = 14;
  const int I = 9;
  FV gu = rand_act(rng, N * 2 * I, -3.f, 3.f), r = rand_act(rng, N * I), g = rand_act(rng, N * 2 * I, 5.f, 6.f);
  DV rd = to_d(r);
  DV want = fd_grad([&](const DV& v) { return dot(llmt_ref::swiglu(v, N, I), rd); }, to_d(gu));
  BufP GU = Buf::act(gu), R = Buf::act(r), dGU = Buf::act(g);
  be().swiglu_backward(dGU->a({N, 2 * I}), R->a({N, I}), GU->a({N, 2 * I}), N, I);
  EXPECT_TRUE(Close(dGU->rf(), want, grad_tol())) << "dgate_up (=) over garbage";
}

// GeGLU: the same op with the tanh GELU on the gate (Gemma's gelu_pytorch_tanh); I = 16 takes the
// vectorised kernels on a GPU, 9 the scalar ones
TEST_P(Ops, GeGLUForwardAndBackwardMatchReference) {
  std::mt19937 rng(45);
  const int64_t N = 14;
  for (const int I : {9, 16}) {
    SCOPED_TRACE(::testing::Message() << "I " << I);
    FV gu = rand_act(rng, N * 2 * I, -3.f, 3.f), r = rand_act(rng, N * I), g = rand_act(rng, N * 2 * I, 5.f, 6.f),
       junk = rand_act(rng, N * I, 5.f, 6.f);
    BufP GU = Buf::act(gu), Out = Buf::act(junk), R = Buf::act(r), dGU = Buf::act(g);
    be().swiglu_forward(Out->a({N, I}), GU->a({N, 2 * I}), N, I, llmt::GluAct::gelu_tanh);
    EXPECT_TRUE(Close(Out->rf(), llmt_ref::geglu(to_d(gu), N, I), fwd_tol())) << "out";
    const DV rd = to_d(r);
    const DV want = fd_grad([&](const DV& v) { return dot(llmt_ref::geglu(v, N, I), rd); }, to_d(gu));
    be().swiglu_backward(dGU->a({N, 2 * I}), R->a({N, I}), GU->a({N, 2 * I}), N, I, llmt::GluAct::gelu_tanh);
    EXPECT_TRUE(Close(dGU->rf(), want, grad_tol())) << "dgate_up (=) over garbage";
  }
}

// ======================= dropout =======================

// The keep/drop decision of element (b, t, c): the spec every backend follows.
bool kept(const llmt::Dropout& d, int64_t b, int t, int64_t c) {
  return llmt::dropout_keep(d.key, llmt::dropout_row(d.row0 + b, t), c, d.p);
}

TEST_P(Ops, DropoutMaskStatisticsAndScale) {
  const int B = 3, T = 50, C = 400;  // 60,000 elements
  const int64_t n = (int64_t)B * T * C;
  FV ones(n, 1.0f);
  for (float p : {0.1f, 0.5f}) {
    SCOPED_TRACE(::testing::Message() << "p=" << p);
    llmt::Dropout d{p, 0x1234abcdull, 17};
    BufP X = Buf::act(ones);
    be().dropout(X->a({B * T, C}), B, T, C, d);
    FV got = X->rf();
    const float scale = representable(1.0f / (1.0f - p));
    int64_t kept_n = 0, wrong = 0;
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
          float v = got[((int64_t)b * T + t) * C + c];
          bool k = kept(d, b, t, c);
          kept_n += k;
          wrong += k ? v != scale : v != 0.0f;
        }
    EXPECT_EQ(wrong, 0) << "kept elements must be scaled by 1/(1-p), dropped ones zero, as dropout_keep says";
    // the kept fraction is binomial(n, 1-p): within 5 standard deviations
    double mean = n * (1.0 - p), sd = std::sqrt(n * p * (1.0 - p));
    EXPECT_NEAR((double)kept_n, mean, 5 * sd);
  }
  // p = 0 changes nothing; a different key draws a different mask; the same key the same mask
  BufP X = Buf::act(ones);
  be().dropout(X->a({B * T, C}), B, T, C, llmt::Dropout{0.0f, 1, 0});
  EXPECT_EQ(X->rf(), ones);
  int64_t differ = 0;
  for (int c = 0; c < C; c++) differ += kept({0.5f, 1, 0}, 0, 0, c) != kept({0.5f, 2, 0}, 0, 0, c);
  EXPECT_GT(differ, C / 4);
}

// A sequence's mask depends on which sequence it is (row0 + b) and the position, not on how the
// batch was cut: one batch of 4 equals two batches of 2 whose row0 follow on, even with a shorter
// padded length in one of them.
TEST_P(Ops, DropoutMaskIndependentOfBatchSplit) {
  std::mt19937 rng(45);
  const int C = 33, T = 9, T_short = 6;
  llmt::Dropout d{0.3f, 987654321ull, 40};
  FV x = rand_act(rng, (size_t)4 * T * C);
  BufP whole = Buf::act(x);
  be().dropout(whole->a({4 * T, C}), 4, T, C, d);
  FV w = whole->rf();
  // sequences 2, 3 alone (row0 + 2), cut to T_short tokens
  FV part((size_t)2 * T_short * C);
  for (int b = 0; b < 2; b++)
    for (int t = 0; t < T_short; t++)
      for (int c = 0; c < C; c++) part[((size_t)b * T_short + t) * C + c] = x[((size_t)(b + 2) * T + t) * C + c];
  BufP half = Buf::act(part);
  llmt::Dropout d2 = d;
  d2.row0 = d.row0 + 2;
  be().dropout(half->a({2 * T_short, C}), 2, T_short, C, d2);
  FV h = half->rf();
  for (int b = 0; b < 2; b++)
    for (int t = 0; t < T_short; t++)
      for (int c = 0; c < C; c++)
        ASSERT_EQ(h[((size_t)b * T_short + t) * C + c], w[((size_t)(b + 2) * T + t) * C + c])
            << "sequence " << b + 2 << " position " << t << " channel " << c;
}

// ======================= RoPE and attention =======================

struct AttnCfg {
  int NH, NKV;
};
constexpr int AB = 2, AT = 7, HS = 6;

TEST_P(Ops, RopeForwardAndBackwardVsReference) {
  std::mt19937 rng(51);
  // plain RoPE at two thetas, linear scaling, and llama3 scaling in all three of its bands: theta 500000
  // with original 16 puts HS = 6's frequencies (wavelengths 6.3, 499, 39685) blended, scaled, scaled;
  // theta 10 with original 64 puts them (6.3, 13.5, 29) kept, kept, blended
  struct Case {
    double theta;
    int scaling;
    double factor, low, high, original;
  };
  const Case cases[] = {{10000.0, 0, 1, 1, 4, 8192}, {10.0, 0, 1, 1, 4, 8192}, {10000.0, 1, 4, 1, 4, 8192},
                        {500000.0, 2, 8, 1, 4, 16}, {10.0, 2, 32, 1, 4, 64}};
  for (AttnCfg c : {AttnCfg{4, 2}, AttnCfg{3, 3}, AttnCfg{3, 1}})
    for (const Case& k : cases) {
      const double theta = k.theta;
      llmt_ref::RopeRef ref;
      ref.theta = k.theta, ref.scaling = k.scaling, ref.factor = k.factor, ref.low = k.low, ref.high = k.high;
      ref.original = k.original;
      llmt::RopeSpec spec;
      spec.theta = (float)k.theta;
      spec.scaling = k.scaling;
      spec.factor = (float)k.factor;
      spec.low_freq_factor = (float)k.low;
      spec.high_freq_factor = (float)k.high;
      spec.original_max = (float)k.original;
      SCOPED_TRACE(::testing::Message() << "NH=" << c.NH << " NKV=" << c.NKV << " theta=" << theta
                                        << " scaling=" << k.scaling << " factor=" << k.factor);
      const int R = (c.NH + 2 * c.NKV) * HS;
      const int64_t n = (int64_t)AB * AT * R;
      FV qkv = rand_act(rng, n), r = rand_act(rng, n);
      DV want = llmt_ref::rope(to_d(qkv), AB, AT, c.NH, c.NKV, HS, ref);
      BufP Q = Buf::act(qkv);
      be().rope_forward(Q->a({AB * AT, R}), AB, AT, c.NH, c.NKV, HS, spec);
      FV got = Q->rf();
      EXPECT_TRUE(Close(got, want, fwd_tol())) << "rope_forward";
      for (int64_t row = 0; row < AB * AT; row++)
        for (int j = (c.NH + c.NKV) * HS; j < R; j++)
          ASSERT_EQ(got[row * R + j], qkv[row * R + j]) << "v part changed, row " << row << " col " << j;
      // backward: dqkv = r in place; expect d/dqkv sum(rope(qkv) * r)
      DV rd = to_d(r);
      DV g = fd_grad([&](const DV& v) { return dot(llmt_ref::rope(v, AB, AT, c.NH, c.NKV, HS, ref), rd); },
                     to_d(qkv));
      BufP dQ = Buf::act(r);
      be().rope_backward(dQ->a({AB * AT, R}), AB, AT, c.NH, c.NKV, HS, spec);
      EXPECT_TRUE(Close(dQ->rf(), g, grad_tol())) << "rope_backward";
    }
}

// LongRoPE (Phi-3: frequency i divided by a factor of its own, cos and sin times an attention factor)
// and partial rotary (Phi-4-mini: the first rotary_dim channels of a head rotate, the rest are kept),
// alone and together, forward and backward against the double reference.
TEST_P(Ops, RopeLongropeAndPartialRotaryVsReference) {
  std::mt19937 rng(53);
  constexpr int H = 8;  // head size; rotary_dim 8 (all), 6 (0.75) or 4 (0.5)
  struct Case {
    int scaling, rotary_dim;
    double attn;
    std::vector<double> ext;
  };
  const Case cases[] = {{3, 0, 1.19, {1.0, 1.7, 3.25, 11.5}}, {3, 6, 1.19, {1.05, 2.5, 7.0}},
                        {0, 6, 1.0, {}}, {3, 4, 0.83, {0.9, 19.0}}, {1, 4, 1.0, {}}};
  for (AttnCfg c : {AttnCfg{4, 2}, AttnCfg{3, 1}})
    for (const Case& k : cases) {
      llmt_ref::RopeRef ref;
      ref.theta = 10.0, ref.scaling = k.scaling, ref.factor = 4.0, ref.rotary_dim = k.rotary_dim, ref.attn = k.attn;
      ref.ext = k.ext;
      llmt::RopeSpec spec;
      spec.theta = 10.0f, spec.scaling = k.scaling, spec.factor = 4.0f, spec.rotary_dim = k.rotary_dim;
      spec.attention_factor = (float)k.attn;
      for (size_t i = 0; i < k.ext.size(); i++) spec.ext[i] = (float)k.ext[i];
      SCOPED_TRACE(::testing::Message() << "NH=" << c.NH << " NKV=" << c.NKV << " scaling=" << k.scaling
                                        << " rotary_dim=" << k.rotary_dim);
      const int R = (c.NH + 2 * c.NKV) * H;
      const int64_t n = (int64_t)AB * AT * R;
      FV qkv = rand_act(rng, n), r = rand_act(rng, n);
      DV want = llmt_ref::rope(to_d(qkv), AB, AT, c.NH, c.NKV, H, ref);
      BufP Q = Buf::act(qkv);
      be().rope_forward(Q->a({AB * AT, R}), AB, AT, c.NH, c.NKV, H, spec);
      FV got = Q->rf();
      EXPECT_TRUE(Close(got, want, fwd_tol())) << "rope_forward";
      const int kept_from = k.rotary_dim > 0 ? k.rotary_dim : H;
      for (int64_t row = 0; row < AB * AT; row++)
        for (int j = 0; j < R; j++) {
          if (j < (c.NH + c.NKV) * H && j % H < kept_from) continue;
          ASSERT_EQ(got[row * R + j], qkv[row * R + j]) << "unrotated channel changed, row " << row << " col " << j;
        }
      DV rd = to_d(r);
      DV g = fd_grad([&](const DV& v) { return dot(llmt_ref::rope(v, AB, AT, c.NH, c.NKV, H, ref), rd); },
                     to_d(qkv));
      BufP dQ = Buf::act(r);
      be().rope_backward(dQ->a({AB * AT, R}), AB, AT, c.NH, c.NKV, H, spec);
      EXPECT_TRUE(Close(dQ->rf(), g, grad_tol())) << "rope_backward";
    }
}

// A rotary_dim that is odd, negative or past the head is refused.
TEST_P(Ops, RopeRefusesBadRotaryDims) {
  const int NH = 2, NKV = 1, H = 8, R = (NH + 2 * NKV) * H;
  BufP Q = Buf::act(FV((size_t)2 * R, 0.5f));
  for (int d : {5, 10, -2}) {
    llmt::RopeSpec spec;
    spec.rotary_dim = d;
    EXPECT_THROW(be().rope_forward(Q->a({2, R}), 1, 2, NH, NKV, H, spec), llmt::Error) << d;
  }
}

// RoPE with positions places each row at a position of its own: a row at position t must rotate
// bitwise as row t of a sequence does, and rope_backward with the same positions undo it.
TEST_P(Ops, RopeAtPositionsEqualsRopeAtTheSameRows) {
  std::mt19937 rng(57);
  llmt::RopeSpec spec;
  spec.theta = 500000.0f, spec.scaling = llmt::RopeSpec::llama3, spec.factor = 8, spec.original_max = 16;
  const int NH = 4, NKV = 2, R = (NH + 2 * NKV) * HS, S = 40;  // a sequence of S positions
  FV seq = rand_act(rng, (size_t)S * R);
  BufP Seq = Buf::act(seq);
  be().rope_forward(Seq->a({S, R}), 1, S, NH, NKV, HS, spec);
  FV roped = Seq->rf();
  const IV pos = {0, 39, 5, 5, 17, 1, 38};  // any order, repeats
  const int N = (int)pos.size();
  FV rowsv((size_t)N * R);
  for (int i = 0; i < N; i++) std::copy_n(seq.begin() + (size_t)pos[i] * R, R, rowsv.begin() + (size_t)i * R);
  BufP X = Buf::act(rowsv);
  Buf P(pos);
  be().rope_forward(X->a({N, R}), 1, N, NH, NKV, HS, spec, P.i32({N}));
  FV got = X->rf();
  for (int i = 0; i < N; i++)
    for (int j = 0; j < R; j++)
      ASSERT_EQ(got[(size_t)i * R + j], roped[(size_t)pos[i] * R + j]) << "row " << i << " at position " << pos[i];
  be().rope_backward(X->a({N, R}), 1, N, NH, NKV, HS, spec, P.i32({N}));
  FV back = X->rf();
  double worst = 0;
  for (size_t e = 0; e < back.size(); e++) worst = std::max(worst, (double)std::fabs(back[e] - rowsv[e]));
  EXPECT_LT(worst, is_bf16() ? 2e-2 : 1e-5) << "rope_backward at the same positions undoes the rotation";
}

// A KV cache filled a chunk at a time (a prompt, then one token per call) must give each new row
// what causal attention over the whole sequence gives it; with left padding, what attention over the
// sequence without its padding gives, and zeros on the padding's rows.
TEST_P(Ops, AttentionKvMatchesWholeSequenceAttention) {
  std::mt19937 rng(58);
  const int B = 3, T = 9, cap = 11;
  // windows: none, shorter than the prompt chunk, and one longer than any sequence (which changes nothing)
  for (int window : {0, 3, 20})
  for (AttnCfg c : {AttnCfg{4, 2}, AttnCfg{3, 3}, AttnCfg{3, 1}}) {
    SCOPED_TRACE(::testing::Message() << "NH=" << c.NH << " NKV=" << c.NKV << " window " << window);
    const int R = (c.NH + 2 * c.NKV) * HS, Q = c.NH * HS;
    const IV starts = {0, 3, 8};  // sequence b's first real token
    FV qkv = rand_act(rng, (size_t)B * T * R, -1.5f, 1.5f);
    BufP K = Buf::act(FV((size_t)B * c.NKV * cap * HS, 0.0f)), V = Buf::act(FV((size_t)B * c.NKV * cap * HS, 0.0f));
    Buf Starts(starts);
    FV got((size_t)B * T * Q);
    for (int p0 = 0; p0 < T;) {
      const int Tn = p0 == 0 ? 5 : 1;
      FV chunk((size_t)B * Tn * R), garbage = rand_act(rng, (size_t)B * Tn * Q, 5.f, 6.f);
      for (int b = 0; b < B; b++)
        std::copy_n(qkv.begin() + ((size_t)b * T + p0) * R, (size_t)Tn * R, chunk.begin() + (size_t)b * Tn * R);
      BufP X = Buf::act(chunk), Out = Buf::act(garbage);
      be().attention_kv(Out->a({B * Tn, Q}), K->a({B, c.NKV, cap, HS}), V->a({B, c.NKV, cap, HS}), X->a({B * Tn, R}),
                        Starts.i32({B}), B, Tn, p0, cap, c.NH, c.NKV, HS, window);
      FV o = Out->rf();
      for (int b = 0; b < B; b++)
        std::copy_n(o.begin() + (size_t)b * Tn * Q, (size_t)Tn * Q, got.begin() + ((size_t)b * T + p0) * Q);
      p0 += Tn;
    }
    FV kc = K->rf(), vc = V->rf();
    for (int b = 0; b < B; b++) {
      const int s0 = starts[b], L = T - s0;
      DV one(qkv.begin() + ((size_t)b * T + s0) * R, qkv.begin() + ((size_t)b * T + T) * R);
      DV want = llmt_ref::attention(one, 1, L, c.NH, c.NKV, HS, nullptr, nullptr, window);
      FV mine(got.begin() + ((size_t)b * T + s0) * Q, got.begin() + ((size_t)b * T + T) * Q);
      EXPECT_TRUE(Close(mine, want, fwd_tol())) << "sequence " << b << " from its first real token " << s0;
      for (size_t e = (size_t)b * T * Q; e < ((size_t)b * T + s0) * Q; e++)
        ASSERT_EQ(got[e], 0.0f) << "a padding row of sequence " << b << " must be zeros";
      for (int t = 0; t < T; t++)  // the cache holds every token's k and v exactly, padding too
        for (int kvh = 0; kvh < c.NKV; kvh++)
          for (int j = 0; j < HS; j++) {
            const size_t at = (((size_t)b * c.NKV + kvh) * cap + t) * HS + j, row = ((size_t)b * T + t) * R;
            ASSERT_EQ(kc[at], qkv[row + (size_t)(c.NH + kvh) * HS + j]) << "k cache b " << b << " t " << t;
            ASSERT_EQ(vc[at], qkv[row + (size_t)(c.NH + c.NKV + kvh) * HS + j]) << "v cache b " << b << " t " << t;
          }
    }
  }
}

// dropout on attention probabilities as the op's contract says: 1/(1-p) where kept, 0 where dropped
llmt_ref::DropFn attn_drop(const llmt::Dropout& d) {
  if (!d.active()) return nullptr;
  return [d](int b, int h, int t, int u) {
    bool keep = llmt::dropout_keep(d.key, llmt::dropout_row(d.row0 + b, t), ((int64_t)h << llmt::kDropoutPosBits) + u, d.p);
    return keep ? 1.0 / (1.0 - d.p) : 0.0;
  };
}

TEST_P(Ops, AttentionForwardMatchesReference) {
  std::mt19937 rng(52);
  for (AttnCfg c : {AttnCfg{3, 3}, AttnCfg{4, 2}, AttnCfg{3, 1}})
    for (float p : {0.0f, 0.25f}) {
      SCOPED_TRACE(::testing::Message() << "NH=" << c.NH << " NKV=" << c.NKV << " dropout " << p);
      const int R = (c.NH + 2 * c.NKV) * HS;
      llmt::Dropout d{p, 77, 5};
      FV qkv = rand_act(rng, (size_t)AB * AT * R, -1.5f, 1.5f);
      FV g1 = rand_act(rng, (size_t)AB * AT * c.NH * HS, 5.f, 6.f), g2 = rand_f(rng, (size_t)AB * c.NH * AT, 5.f, 6.f);
      BufP Q = Buf::act(qkv), Out = Buf::act(g1);
      Buf Lse(g2);
      be().attention_forward(Out->a({AB * AT, c.NH * HS}), Lse.f32({AB, c.NH, AT}), Q->a({AB * AT, R}), AB, AT, c.NH,
                             c.NKV, HS, d);
      DV lse;
      DV want = llmt_ref::attention(to_d(qkv), AB, AT, c.NH, c.NKV, HS, &lse, attn_drop(d));
      EXPECT_TRUE(Close(Out->rf(), want, fwd_tol())) << "out (=)";
      EXPECT_TRUE(Close(Lse.rf(), lse, tol::kF32OpForward + (is_bf16() ? tol::kBf16OpForward / 4 : 0.0)))
          << "lse (=): the log-sum-exp of each row's scaled scores";
    }
}

// The head sizes of real models, over several 64-row tiles with a ragged last one: on a GPU in bf16
// these run the tensor-core kernel (kernels/cuda/flash_attention.cu), elsewhere the plain one. Its
// backward (the plain kernel, from the lse this forward kept) against the same forward's reference.
TEST_P(Ops, AttentionForwardHeadSizes64And128OverTiles) {
  std::mt19937 rng(54);
  struct Case {
    int B, T, NH, NKV, hs;
  };
  for (Case c : {Case{2, 130, 4, 2, 64}, Case{1, 70, 2, 1, 128}, Case{1, 64, 2, 2, 64}})
    for (float p : {0.0f, 0.25f}) {
      SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " NH=" << c.NH << " NKV=" << c.NKV
                                        << " hs=" << c.hs << " dropout " << p);
      const int R = (c.NH + 2 * c.NKV) * c.hs;
      const int64_t rows = (int64_t)c.B * c.T;
      llmt::Dropout d{p, 91, 2};
      FV qkv = rand_act(rng, (size_t)(rows * R), -1.5f, 1.5f);
      FV g1 = rand_act(rng, (size_t)(rows * c.NH * c.hs), 5.f, 6.f), g2 = rand_f(rng, (size_t)c.B * c.NH * c.T, 5.f, 6.f);
      BufP Q = Buf::act(qkv), Out = Buf::act(g1);
      Buf Lse(g2);
      const int64_t launches = be().counters().launches;
      be().attention_forward(Out->a({rows, c.NH * c.hs}), Lse.f32({c.B, c.NH, c.T}), Q->a({rows, R}), c.B, c.T, c.NH,
                             c.NKV, c.hs, d);
      if (stand_in_cudnn(GetParam()) && p == 0.0f) {
        EXPECT_EQ(be().counters().launches - launches, 1) << "one cuDNN graph";
      }
      DV lse;
      DV want = llmt_ref::attention(to_d(qkv), c.B, c.T, c.NH, c.NKV, c.hs, &lse, attn_drop(d));
      EXPECT_TRUE(Close(Out->rf(), want, fwd_tol())) << "out (=)";
      EXPECT_TRUE(Close(Lse.rf(), lse, tol::kF32OpForward + (is_bf16() ? tol::kBf16OpForward / 4 : 0.0)))
          << "lse (=): the log-sum-exp of each row's scaled scores";
      // bitwise repeatable
      FV first = Out->rf();
      be().attention_forward(Out->a({rows, c.NH * c.hs}), Lse.f32({c.B, c.NH, c.T}), Q->a({rows, R}), c.B, c.T, c.NH,
                             c.NKV, c.hs, d);
      EXPECT_EQ(Out->rf(), first) << "a second forward differs";
    }
}

// The backward at the same shapes, against the analytic reference (itself checked against finite
// differences at a small shape first): on a GPU in bf16 the tensor-core backward, elsewhere the
// plain one. dqkv is overwritten (garbage before), and a second run repeats it bit for bit.
TEST_P(Ops, AttentionBackwardHeadSizes64And128OverTiles) {
  std::mt19937 rng(55);
  {
    const int B = 1, T = 5, NH = 2, NKV = 1, hs = 4, R = (NH + 2 * NKV) * hs;
    llmt::Dropout d{0.25f, 17, 1};
    DV qkv = to_d(rand_f(rng, (size_t)B * T * R, -1.5f, 1.5f)), g = to_d(rand_f(rng, (size_t)B * T * NH * hs));
    DV fd = fd_grad([&](const DV& v) { return dot(llmt_ref::attention(v, B, T, NH, NKV, hs, nullptr, attn_drop(d)), g); },
                    qkv);
    FV analytic;
    for (double x : llmt_ref::attention_backward(qkv, g, B, T, NH, NKV, hs, attn_drop(d))) analytic.push_back((float)x);
    ASSERT_TRUE(Close(analytic, fd, tol::kF32OpBackward)) << "the reference backward against finite differences";
  }
  struct Case {
    int B, T, NH, NKV, hs;
  };
  for (Case c : {Case{2, 130, 4, 2, 64}, Case{1, 70, 2, 1, 128}, Case{1, 64, 2, 2, 64}})
    for (float p : {0.0f, 0.25f}) {
      SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " NH=" << c.NH << " NKV=" << c.NKV
                                        << " hs=" << c.hs << " dropout " << p);
      const int R = (c.NH + 2 * c.NKV) * c.hs;
      const int64_t rows = (int64_t)c.B * c.T;
      llmt::Dropout d{p, 93, 1};
      FV qkv = rand_act(rng, (size_t)(rows * R), -1.5f, 1.5f), g = rand_act(rng, (size_t)(rows * c.NH * c.hs));
      BufP Q = Buf::act(qkv), Out = Buf::act_bytes(g.size()), dOut = Buf::act(g);
      BufP dQ = Buf::act(rand_act(rng, qkv.size(), 5.f, 6.f));
      Buf Lse((size_t)c.B * c.NH * c.T * 4);
      be().attention_forward(Out->a({rows, c.NH * c.hs}), Lse.f32({c.B, c.NH, c.T}), Q->a({rows, R}), c.B, c.T, c.NH,
                             c.NKV, c.hs, d);
      auto backward = [&] {
        be().attention_backward(dQ->a({rows, R}), dOut->a({rows, c.NH * c.hs}), Q->a({rows, R}),
                                Out->a({rows, c.NH * c.hs}), Lse.f32({c.B, c.NH, c.T}), c.B, c.T, c.NH, c.NKV, c.hs, d);
      };
      const int64_t launches = be().counters().launches;
      backward();
      if (stand_in_cudnn(GetParam()) && p == 0.0f) {
        EXPECT_EQ(be().counters().launches - launches, 1) << "one cuDNN graph (flash takes three)";
      }
      DV want = llmt_ref::attention_backward(to_d(qkv), to_d(g), c.B, c.T, c.NH, c.NKV, c.hs, attn_drop(d));
      EXPECT_TRUE(Close(dQ->rf(), want, grad_tol())) << "dqkv (=)";
      FV first = dQ->rf();
      backward();
      EXPECT_EQ(dQ->rf(), first) << "a second backward differs";
    }
}

// Packed documents (doc_start): each document of a row must come out as if it ran alone. The
// reference runs every document through the plain double reference by itself. Documents of one
// token, boundaries on and off the 64-row tiles, rows whose first tiles are all another document's:
// on a GPU (and the emulator) in bf16 the tensor-core kernels, elsewhere the plain ones.
TEST_P(Ops, AttentionPackedDocumentsEqualEachDocumentAlone) {
  std::mt19937 rng(59);
  struct Case {
    int T, NH, NKV, hs;
    std::vector<std::vector<int>> starts;  // each row's document starts (the first is 0)
  };
  const Case cases[] = {{130, 4, 2, 64, {{0, 50, 51}, {0, 64, 100, 129}}},
                        {70, 2, 1, 128, {{0, 3}}},
                        {13, 3, 1, 6, {{0, 4, 5, 9}, {0}, {0, 12}}}};
  // windows: none, a few keys (inside most documents), and one longer than some documents and
  // shorter than others: the band meets the document mask
  for (int window : {0, 3, 37})
  for (const Case& c : cases) {
    const int B = (int)c.starts.size(), R = (c.NH + 2 * c.NKV) * c.hs, Q = c.NH * c.hs;
    SCOPED_TRACE(::testing::Message() << "T=" << c.T << " hs=" << c.hs << " rows " << B << " window " << window);
    const int64_t rows = (int64_t)B * c.T;
    IV doc((size_t)rows);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < c.T; t++) {
        int d0 = 0;
        for (int st : c.starts[b]) if (st <= t) d0 = st;
        doc[(size_t)b * c.T + t] = d0;
      }
    FV qkv = rand_act(rng, (size_t)(rows * R), -1.5f, 1.5f), g = rand_act(rng, (size_t)(rows * Q));
    // the reference: every document alone
    DV want_out((size_t)rows * Q), want_lse((size_t)B * c.NH * c.T), want_dqkv((size_t)rows * R);
    for (int b = 0; b < B; b++)
      for (size_t k = 0; k < c.starts[b].size(); k++) {
        const int s0 = c.starts[b][k], e = k + 1 < c.starts[b].size() ? c.starts[b][k + 1] : c.T, L = e - s0;
        const size_t r0 = (size_t)b * c.T + s0;
        DV sub(qkv.begin() + r0 * R, qkv.begin() + (r0 + L) * R), gsub(g.begin() + r0 * Q, g.begin() + (r0 + L) * Q);
        DV lse;
        DV out = llmt_ref::attention(sub, 1, L, c.NH, c.NKV, c.hs, &lse, nullptr, window);
        DV dq = llmt_ref::attention_backward(sub, gsub, 1, L, c.NH, c.NKV, c.hs, nullptr, window);
        std::copy(out.begin(), out.end(), want_out.begin() + r0 * Q);
        std::copy(dq.begin(), dq.end(), want_dqkv.begin() + r0 * R);
        for (int h = 0; h < c.NH; h++)
          for (int i = 0; i < L; i++) want_lse[((size_t)b * c.NH + h) * c.T + s0 + i] = lse[(size_t)h * L + i];
      }
    BufP X = Buf::act(qkv), Out = Buf::act(rand_act(rng, (size_t)rows * Q, 5.f, 6.f)), dOut = Buf::act(g);
    BufP dX = Buf::act(rand_act(rng, qkv.size(), 5.f, 6.f));
    Buf Lse((size_t)B * c.NH * c.T * 4), Doc(doc);
    int64_t count = 0;
    for (const auto& row : c.starts) count += (int64_t)row.size();
    const llmt::PackedDocs docs{Doc.i32({rows}), count};
    be().attention_forward(Out->a({rows, Q}), Lse.f32({B, c.NH, c.T}), X->a({rows, R}), B, c.T, c.NH, c.NKV, c.hs,
                           llmt::Dropout{}, docs, window);
    EXPECT_TRUE(Close(Out->rf(), want_out, fwd_tol())) << "out";
    EXPECT_TRUE(Close(Lse.rf(), want_lse, tol::kF32OpForward + (is_bf16() ? tol::kBf16OpForward / 4 : 0.0))) << "lse";
    be().attention_backward(dX->a({rows, R}), dOut->a({rows, Q}), X->a({rows, R}), Out->a({rows, Q}),
                            Lse.f32({B, c.NH, c.T}), B, c.T, c.NH, c.NKV, c.hs, llmt::Dropout{}, docs, window);
    EXPECT_TRUE(Close(dX->rf(), want_dqkv, grad_tol())) << "dqkv";
  }
}

// A sliding window (transformers' sliding_window: query t sees keys t - W < u <= t) of one key, of
// fewer keys than a 64-row tile, across tiles, of exactly T and past T (where it masks nothing),
// with GQA and dropout, forward and backward against the double reference: on a GPU (and the
// emulator) in bf16 the tensor-core kernels or cuDNN, elsewhere the plain ones.
TEST_P(Ops, AttentionSlidingWindowMatchesReference) {
  std::mt19937 rng(60);
  {  // the reference's backward with a window, against finite differences of its forward
    const int B = 1, T = 7, NH = 2, NKV = 1, hs = 4, R = (NH + 2 * NKV) * hs, W = 3;
    llmt::Dropout d{0.25f, 19, 1};
    DV qkv = to_d(rand_f(rng, (size_t)B * T * R, -1.5f, 1.5f)), g = to_d(rand_f(rng, (size_t)B * T * NH * hs));
    DV fd = fd_grad(
        [&](const DV& v) { return dot(llmt_ref::attention(v, B, T, NH, NKV, hs, nullptr, attn_drop(d), W), g); }, qkv);
    FV analytic;
    for (double x : llmt_ref::attention_backward(qkv, g, B, T, NH, NKV, hs, attn_drop(d), W))
      analytic.push_back((float)x);
    ASSERT_TRUE(Close(analytic, fd, tol::kF32OpBackward)) << "the reference backward against finite differences";
    DV full = llmt_ref::attention(qkv, B, T, NH, NKV, hs), band = llmt_ref::attention(qkv, B, T, NH, NKV, hs, nullptr,
                                                                                       nullptr, W);
    ASSERT_NE(full, band) << "a window shorter than the sequence changes the output";
    ASSERT_EQ(full, llmt_ref::attention(qkv, B, T, NH, NKV, hs, nullptr, nullptr, T)) << "a window of T changes nothing";
  }
  struct Case {
    int B, T, NH, NKV, hs;
    std::vector<int> windows;
  };
  // (at T = 130, a window of 18 puts warp 1's first row of the second query tile exactly 63 keys past
  // the first key tile's start: the tile its band must not skip)
  const Case cases[] = {{2, 130, 4, 2, 64, {1, 18, 40, 65, 130, 200}}, {1, 70, 2, 1, 128, {16, 70}},
                        {2, 13, 3, 1, 6, {1, 4, 13, 20}}};
  for (const Case& c : cases)
    for (int window : c.windows)
      for (float p : {0.0f, 0.25f}) {
        if (p > 0.0f && window != c.windows[1]) continue;  // dropout with one window a shape
        SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " NH=" << c.NH << " NKV=" << c.NKV
                                          << " hs=" << c.hs << " window " << window << " dropout " << p);
        const int R = (c.NH + 2 * c.NKV) * c.hs, Q = c.NH * c.hs;
        const int64_t rows = (int64_t)c.B * c.T;
        llmt::Dropout d{p, 97, 4};
        FV qkv = rand_act(rng, (size_t)(rows * R), -1.5f, 1.5f), g = rand_act(rng, (size_t)(rows * Q));
        BufP X = Buf::act(qkv), Out = Buf::act(rand_act(rng, (size_t)rows * Q, 5.f, 6.f)), dOut = Buf::act(g);
        BufP dX = Buf::act(rand_act(rng, qkv.size(), 5.f, 6.f));
        Buf Lse(rand_f(rng, (size_t)c.B * c.NH * c.T, 5.f, 6.f));
        const int64_t launches = be().counters().launches;
        be().attention_forward(Out->a({rows, Q}), Lse.f32({c.B, c.NH, c.T}), X->a({rows, R}), c.B, c.T, c.NH, c.NKV,
                               c.hs, d, llmt::PackedDocs(), window);
        if (stand_in_cudnn(GetParam()) && p == 0.0f && c.hs % 8 == 0) {
          EXPECT_EQ(be().counters().launches - launches, 1) << "one cuDNN graph, the window its left bound";
        }
        DV lse;
        DV want = llmt_ref::attention(to_d(qkv), c.B, c.T, c.NH, c.NKV, c.hs, &lse, attn_drop(d), window);
        EXPECT_TRUE(Close(Out->rf(), want, fwd_tol())) << "out (=)";
        EXPECT_TRUE(Close(Lse.rf(), lse, tol::kF32OpForward + (is_bf16() ? tol::kBf16OpForward / 4 : 0.0)))
            << "lse (=)";
        be().attention_backward(dX->a({rows, R}), dOut->a({rows, Q}), X->a({rows, R}), Out->a({rows, Q}),
                                Lse.f32({c.B, c.NH, c.T}), c.B, c.T, c.NH, c.NKV, c.hs, d, llmt::PackedDocs(), window);
        DV want_d = llmt_ref::attention_backward(to_d(qkv), to_d(g), c.B, c.T, c.NH, c.NKV, c.hs, attn_drop(d), window);
        EXPECT_TRUE(Close(dX->rf(), want_d, grad_tol())) << "dqkv (=)";
      }
}

TEST_P(Ops, AttentionBackwardVsFiniteDifferencesMhaGqaDropout) {
  std::mt19937 rng(53);
  for (AttnCfg c : {AttnCfg{3, 3}, AttnCfg{4, 2}, AttnCfg{3, 1}})
    for (float p : {0.0f, 0.25f}) {
      SCOPED_TRACE(::testing::Message() << "NH=" << c.NH << " NKV=" << c.NKV << " dropout " << p);
      const int R = (c.NH + 2 * c.NKV) * HS;
      llmt::Dropout d{p, 99, 3};
      FV qkv = rand_act(rng, (size_t)AB * AT * R, -1.5f, 1.5f), r = rand_act(rng, (size_t)AB * AT * c.NH * HS);
      FV g1 = rand_act(rng, qkv.size(), 5.f, 6.f);
      BufP Q = Buf::act(qkv), Out = Buf::act_bytes(r.size()), dOut = Buf::act(r), dQ = Buf::act(g1);
      Buf Lse((size_t)AB * c.NH * AT * 4);
      be().attention_forward(Out->a({AB * AT, c.NH * HS}), Lse.f32({AB, c.NH, AT}), Q->a({AB * AT, R}), AB, AT, c.NH,
                             c.NKV, HS, d);
      be().attention_backward(dQ->a({AB * AT, R}), dOut->a({AB * AT, c.NH * HS}), Q->a({AB * AT, R}),
                              Out->a({AB * AT, c.NH * HS}), Lse.f32({AB, c.NH, AT}), AB, AT, c.NH, c.NKV, HS, d);
      DV rd = to_d(r);
      DV want = fd_grad(
          [&](const DV& v) { return dot(llmt_ref::attention(v, AB, AT, c.NH, c.NKV, HS, nullptr, attn_drop(d)), rd); },
          to_d(qkv));
      EXPECT_TRUE(Close(dQ->rf(), want, grad_tol())) << "dqkv (=) over garbage";
    }
}

// max|a - b| / max|b|: how far a case's scores move the reference, to show a test of them can fail
double rel_diff(const DV& a, const DV& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); i++) d = std::max(d, std::fabs(a[i] - b[i])), m = std::max(m, std::fabs(b[i]));
  return m > 0 ? d / m : d;
}

// Gemma's scores (AttnScores): a scale other than 1/sqrt(hs) and the soft cap softcap tanh(s /
// softcap), a large cap (50, Gemma 2's) with a scale that lets it bite and a small one (2) that bites
// hard, alone and with windows, packed documents, GQA and dropout: forward out and lse and the
// backward's dqkv against the double reference on every backend case (the CPU; emulated, the plain
// and tensor-core kernels, and cuDNN's stand-in, which leaves a soft cap to the flash kernel).
TEST_P(Ops, AttentionScaleAndSoftcapMatchReference) {
  std::mt19937 rng(64);
  {  // the reference's backward with a cap, against finite differences of its forward
    const int B = 1, T = 7, NH = 2, NKV = 1, hs = 4, R = (NH + 2 * NKV) * hs;
    const llmt_ref::Scores sc{0.9, 1.5};
    llmt::Dropout d{0.25f, 23, 1};
    DV qkv = to_d(rand_f(rng, (size_t)B * T * R, -1.5f, 1.5f)), g = to_d(rand_f(rng, (size_t)B * T * NH * hs));
    DV fd = fd_grad(
        [&](const DV& v) { return dot(llmt_ref::attention(v, B, T, NH, NKV, hs, nullptr, attn_drop(d), 3, sc), g); },
        qkv);
    FV analytic;
    for (double x : llmt_ref::attention_backward(qkv, g, B, T, NH, NKV, hs, attn_drop(d), 3, sc))
      analytic.push_back((float)x);
    ASSERT_TRUE(Close(analytic, fd, tol::kF32OpBackward)) << "the reference backward against finite differences";
  }
  struct Case {
    int B, T, NH, NKV, hs;
    bool packed;
  };
  struct Sc {
    float scale, softcap;  // scale in units of 1/sqrt(hs), 0 the default
  };
  const Case cases[] = {{2, 130, 4, 2, 64, false}, {1, 70, 2, 1, 128, false}, {2, 13, 3, 1, 6, false},
                        {2, 130, 4, 2, 64, true}, {2, 13, 3, 1, 6, true}};
  for (const Case& c : cases)
    // the cap of 50 at 12/sqrt(hs): scores of about 7 standard, so that it bites
    for (Sc sc : {Sc{0.7f, 0.0f}, Sc{0.0f, 2.0f}, Sc{12.0f, 50.0f}})
      for (int window : {0, 17})
        for (float p : {0.0f, 0.25f}) {
          if (p > 0.0f && (window == 0 || c.packed)) continue;  // dropout with the window, unpacked
          SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " NH=" << c.NH << " NKV=" << c.NKV
                                            << " hs=" << c.hs << (c.packed ? " packed" : "") << " scale " << sc.scale
                                            << "/sqrt(hs) softcap " << sc.softcap << " window " << window
                                            << " dropout " << p);
          const int R = (c.NH + 2 * c.NKV) * c.hs, Q = c.NH * c.hs;
          const int64_t rows = (int64_t)c.B * c.T;
          const float scale = sc.scale / std::sqrt((float)c.hs);
          const llmt::AttnScores scores{scale, sc.softcap};
          const llmt_ref::Scores ref_sc{scale, sc.softcap};
          llmt::Dropout d{p, 101, 2};
          FV qkv = rand_act(rng, (size_t)(rows * R), -1.5f, 1.5f), g = rand_act(rng, (size_t)(rows * Q));
          // packed: row b's documents start at 0, T/3 + b and 2T/3 (each document alone in the reference)
          IV doc((size_t)rows, 0);
          std::vector<std::vector<int>> starts((size_t)c.B, std::vector<int>{0});
          if (c.packed)
            for (int b = 0; b < c.B; b++) {
              starts[(size_t)b] = {0, c.T / 3 + b, 2 * c.T / 3};
              for (int t = 0; t < c.T; t++)
                for (int st : starts[(size_t)b]) if (st <= t) doc[(size_t)b * c.T + t] = st;
            }
          DV want_out((size_t)rows * Q), want_lse((size_t)c.B * c.NH * c.T), want_d((size_t)rows * R), plain_out;
          for (int b = 0; b < c.B; b++)
            for (size_t k = 0; k < starts[(size_t)b].size(); k++) {
              const int s0 = starts[(size_t)b][k];
              const int e = k + 1 < starts[(size_t)b].size() ? starts[(size_t)b][k + 1] : c.T, L = e - s0;
              const size_t r0 = (size_t)b * c.T + s0;
              DV sub(qkv.begin() + r0 * R, qkv.begin() + (r0 + L) * R);
              DV gsub(g.begin() + r0 * Q, g.begin() + (r0 + L) * Q);
              const llmt_ref::DropFn dropf = attn_drop(d);
              llmt_ref::DropFn drop;
              if (dropf) drop = [&](int, int h, int t, int u) { return dropf(b, h, s0 + t, s0 + u); };
              DV lse;
              DV out = llmt_ref::attention(sub, 1, L, c.NH, c.NKV, c.hs, &lse, drop, window, ref_sc);
              DV dq = llmt_ref::attention_backward(sub, gsub, 1, L, c.NH, c.NKV, c.hs, drop, window, ref_sc);
              std::copy(out.begin(), out.end(), want_out.begin() + r0 * Q);
              std::copy(dq.begin(), dq.end(), want_d.begin() + r0 * R);
              for (int h = 0; h < c.NH; h++)
                for (int i = 0; i < L; i++) want_lse[((size_t)b * c.NH + h) * c.T + s0 + i] = lse[(size_t)h * L + i];
            }
          if (!c.packed) {  // the scores must move the result by more than the tolerance: the test can fail
            llmt_ref::Scores without = ref_sc;
            (sc.softcap > 0.0f ? without.softcap : without.scale) = 0.0;
            DV other = llmt_ref::attention(to_d(qkv), c.B, c.T, c.NH, c.NKV, c.hs, nullptr, attn_drop(d), window,
                                           without);
            ASSERT_GT(rel_diff(other, want_out), 2 * fwd_tol()) << "the scale or cap changes the output";
          }
          BufP X = Buf::act(qkv), Out = Buf::act(rand_act(rng, (size_t)rows * Q, 5.f, 6.f)), dOut = Buf::act(g);
          BufP dX = Buf::act(rand_act(rng, qkv.size(), 5.f, 6.f));
          Buf Lse(rand_f(rng, (size_t)c.B * c.NH * c.T, 5.f, 6.f)), Doc(doc);
          const llmt::PackedDocs docs =
              c.packed ? llmt::PackedDocs{Doc.i32({rows}), (int64_t)c.B * 3} : llmt::PackedDocs();
          const int64_t launches = be().counters().launches;
          be().attention_forward(Out->a({rows, Q}), Lse.f32({c.B, c.NH, c.T}), X->a({rows, R}), c.B, c.T, c.NH, c.NKV,
                                 c.hs, d, docs, window, scores);
          if (stand_in_cudnn(GetParam()) && p == 0.0f && c.hs % 8 == 0 && sc.softcap == 0.0f && !c.packed) {
            EXPECT_EQ(be().counters().launches - launches, 1) << "one cuDNN graph, the scale its attn_scale";
          }
          EXPECT_TRUE(Close(Out->rf(), want_out, fwd_tol())) << "out (=)";
          EXPECT_TRUE(Close(Lse.rf(), want_lse, tol::kF32OpForward + (is_bf16() ? tol::kBf16OpForward / 4 : 0.0)))
              << "lse (=): the log-sum-exp of the scaled, capped scores";
          be().attention_backward(dX->a({rows, R}), dOut->a({rows, Q}), X->a({rows, R}), Out->a({rows, Q}),
                                  Lse.f32({c.B, c.NH, c.T}), c.B, c.T, c.NH, c.NKV, c.hs, d, docs, window, scores);
          EXPECT_TRUE(Close(dX->rf(), want_d, grad_tol())) << "dqkv (=)";
        }
}

// The KV cache's decode with Gemma's scores: a prompt chunk, then a token a call, against the
// reference over the whole sequence with the same scale and cap (and a window).
TEST_P(Ops, AttentionKvWithScaleAndSoftcap) {
  std::mt19937 rng(65);
  const int B = 2, T = 9, cap = 10, NH = 4, NKV = 2, R = (NH + 2 * NKV) * HS, Q = NH * HS;
  for (int window : {0, 4})
    for (auto [scale, softcap] : {std::pair<float, float>{0.9f, 0.0f}, {0.0f, 1.0f}, {1.2f, 3.0f}}) {
      SCOPED_TRACE(::testing::Message() << "scale " << scale << " softcap " << softcap << " window " << window);
      FV qkv = rand_act(rng, (size_t)B * T * R, -1.5f, 1.5f);
      BufP K = Buf::act(FV((size_t)B * NKV * cap * HS, 0.0f)), V = Buf::act(FV((size_t)B * NKV * cap * HS, 0.0f));
      Buf Starts(IV{0, 0});
      FV got((size_t)B * T * Q);
      for (int p0 = 0; p0 < T;) {
        const int Tn = p0 == 0 ? 5 : 1;
        FV chunk((size_t)B * Tn * R);
        for (int b = 0; b < B; b++)
          std::copy_n(qkv.begin() + ((size_t)b * T + p0) * R, (size_t)Tn * R, chunk.begin() + (size_t)b * Tn * R);
        BufP X = Buf::act(chunk), Out = Buf::act(rand_act(rng, (size_t)B * Tn * Q, 5.f, 6.f));
        be().attention_kv(Out->a({B * Tn, Q}), K->a({B, NKV, cap, HS}), V->a({B, NKV, cap, HS}), X->a({B * Tn, R}),
                          Starts.i32({B}), B, Tn, p0, cap, NH, NKV, HS, window, llmt::AttnScores{scale, softcap});
        FV o = Out->rf();
        for (int b = 0; b < B; b++)
          std::copy_n(o.begin() + (size_t)b * Tn * Q, (size_t)Tn * Q, got.begin() + ((size_t)b * T + p0) * Q);
        p0 += Tn;
      }
      const llmt_ref::Scores sc{scale, softcap};
      DV want = llmt_ref::attention(to_d(qkv), B, T, NH, NKV, HS, nullptr, nullptr, window, sc);
      llmt_ref::Scores without = sc;
      (softcap > 0.0f ? without.softcap : without.scale) = 0.0;
      ASSERT_GT(rel_diff(llmt_ref::attention(to_d(qkv), B, T, NH, NKV, HS, nullptr, nullptr, window, without), want),
                2 * fwd_tol())
          << "the scale or cap changes the output";
      EXPECT_TRUE(Close(got, want, fwd_tol()));
    }
}

// ======================= cross-entropy =======================

TEST_P(Ops, CrossEntropyLossAndGradientVsFiniteDifferencesWithIgnored) {
  std::mt19937 rng(61);
  const int64_t N = 14;
  const int V = 19;
  const float grad_scale = 0.37f;
  FV logits = rand_act(rng, N * V, -3.f, 3.f), garbage = rand_act(rng, N * V, 5.f, 6.f);
  IV tg(N);
  std::uniform_int_distribution<int> d(0, V - 1);
  for (auto& t : tg) t = d(rng);
  tg[0] = 0;
  tg[1] = V - 1;
  tg[2] = tg[5] = tg[13] = llmt::kIgnoreIndex;
  DV ld = to_d(logits);
  double want_loss = llmt_ref::cross_entropy(ld, tg, N, V);
  DV want_grad = fd_grad([&](const DV& v) { return grad_scale * llmt_ref::cross_entropy(v, tg, N, V); }, ld);
  const double before = 1.25;  // loss_sum accumulates (+=)
  auto loss_of = [&](Buf& s) { return s.read<double>()[0] - before; };

  {  // separate dlogits pre-filled with garbage
    BufP L = Buf::act(logits), dL = Buf::act(garbage);
    Buf Tg(tg), S(std::vector<double>{before});
    be().cross_entropy(S.f64({1}), dL->a({N, V}), L->a({N, V}), Tg.i32({N}), N, V, grad_scale);
    EXPECT_NEAR(loss_of(S), want_loss, tol::kF32OpForward * std::fabs(want_loss)) << "loss sum over non-ignored rows";
    FV got = dL->rf();
    EXPECT_TRUE(Close(got, want_grad, grad_tol())) << "dlogits (=)";
    for (int64_t n : {2, 5, 13})
      for (int j = 0; j < V; j++) ASSERT_EQ(got[n * V + j], 0.f) << "ignored row " << n << " must be zero";
    EXPECT_EQ(L->rf(), logits) << "logits changed although dlogits is a separate buffer";
  }
  {  // dlogits aliasing logits
    BufP L = Buf::act(logits);
    Buf Tg(tg), S(std::vector<double>{before});
    be().cross_entropy(S.f64({1}), L->a({N, V}), L->a({N, V}), Tg.i32({N}), N, V, grad_scale);
    EXPECT_NEAR(loss_of(S), want_loss, tol::kF32OpForward * std::fabs(want_loss)) << "aliased";
    EXPECT_TRUE(Close(L->rf(), want_grad, grad_tol())) << "dlogits aliasing logits";
  }
  {  // no dlogits: loss only
    BufP L = Buf::act(logits);
    Buf Tg(tg), S(std::vector<double>{before});
    be().cross_entropy(S.f64({1}), null_act({N, V}), L->a({N, V}), Tg.i32({N}), N, V, grad_scale);
    EXPECT_NEAR(loss_of(S), want_loss, tol::kF32OpForward * std::fabs(want_loss)) << "loss only";
    EXPECT_EQ(L->rf(), logits) << "logits changed with dlogits.data == nullptr";
  }
  {  // every row ignored: loss 0 and zero gradient
    IV all(N, llmt::kIgnoreIndex);
    BufP L = Buf::act(logits), dL = Buf::act(garbage);
    Buf Tg(all), S(std::vector<double>{before});
    be().cross_entropy(S.f64({1}), dL->a({N, V}), L->a({N, V}), Tg.i32({N}), N, V, grad_scale);
    EXPECT_EQ(loss_of(S), 0.0);
    for (float v : dL->rf()) ASSERT_EQ(v, 0.f) << "all rows ignored: dlogits must be zero";
  }
}

// Rows of V logits ld elements apart (the padded logits, Backend::vocab_pad): the loss and dlogits
// (in place) as the dense rows give, the padding never written. ld = 64 and 56 are 16-byte rows in
// both dtypes (the CUDA kernel's vector loads, with a scalar tail at V = 37 and 50).
TEST_P(Ops, CrossEntropyOverPaddedRows) {
  std::mt19937 rng(63);
  const int64_t N = 6;
  const float grad_scale = 0.5f, pad = 7.0f;
  for (auto [V, ld] : {std::pair<int, int64_t>{19, 32}, {37, 64}, {50, 56}}) {
    SCOPED_TRACE(::testing::Message() << "V=" << V << " ld=" << ld);
    FV dense = rand_act(rng, N * V, -3.f, 3.f), padded((size_t)(N * ld), pad);
    for (int64_t i = 0; i < N; i++)
      for (int j = 0; j < V; j++) padded[(size_t)(i * ld + j)] = dense[(size_t)(i * V + j)];
    IV tg(N);
    for (int64_t i = 0; i < N; i++) tg[(size_t)i] = (int)((i * 7 + 3) % V);
    tg[2] = llmt::kIgnoreIndex;
    const DV dd = to_d(dense);
    const double want_loss = llmt_ref::cross_entropy(dd, tg, N, V);
    const DV want_grad = fd_grad([&](const DV& v) { return grad_scale * llmt_ref::cross_entropy(v, tg, N, V); }, dd);
    BufP L = Buf::act(padded);
    Buf Tg(tg), S(std::vector<double>{0.0});
    be().cross_entropy(S.f64({1}), L->a({N, ld}), L->a({N, ld}), Tg.i32({N}), N, V, grad_scale, ld);
    EXPECT_NEAR(S.read<double>()[0], want_loss, tol::kF32OpForward * std::fabs(want_loss));
    const FV got = L->rf();
    FV got_dense((size_t)(N * V));
    for (int64_t i = 0; i < N; i++)
      for (int64_t j = 0; j < ld; j++) {
        if (j < V) got_dense[(size_t)(i * V + j)] = got[(size_t)(i * ld + j)];
        else ASSERT_EQ(got[(size_t)(i * ld + j)], pad) << "padding written at row " << i << " column " << j;
      }
    EXPECT_TRUE(Close(got_dense, want_grad, grad_tol()));
  }
}

// Gemma 2's final_logit_softcapping folded into the loss: the loss over cap tanh(logits / cap) and
// dlogits with respect to the logits before the cap (finite differences of the capped reference),
// over dense and padded rows, separate and in place; the cap must move both by more than the
// tolerance. logit_softcap caps in place without touching the padding.
TEST_P(Ops, CrossEntropyWithLogitSoftcap) {
  std::mt19937 rng(66);
  const int64_t N = 6;
  const float grad_scale = 0.7f, pad = 7.0f;
  for (float cap : {30.0f, 5.0f})
    for (auto [V, ld] : {std::pair<int, int64_t>{19, 19}, {37, 64}}) {
      SCOPED_TRACE(::testing::Message() << "cap " << cap << " V=" << V << " ld=" << ld);
      FV dense = rand_act(rng, N * V, -4.f * cap / 5.f, 4.f * cap / 5.f), padded((size_t)(N * ld), pad);
      for (int64_t i = 0; i < N; i++)
        for (int j = 0; j < V; j++) padded[(size_t)(i * ld + j)] = dense[(size_t)(i * V + j)];
      IV tg(N);
      for (int64_t i = 0; i < N; i++) tg[(size_t)i] = (int)((i * 5 + 2) % V);
      tg[3] = llmt::kIgnoreIndex;
      const DV dd = to_d(dense);
      const double want_loss = llmt_ref::cross_entropy(dd, tg, N, V, cap);
      const DV want_grad =
          fd_grad([&](const DV& v) { return grad_scale * llmt_ref::cross_entropy(v, tg, N, V, cap); }, dd);
      const DV plain_grad = fd_grad([&](const DV& v) { return grad_scale * llmt_ref::cross_entropy(v, tg, N, V); }, dd);
      ASSERT_GT(std::fabs(llmt_ref::cross_entropy(dd, tg, N, V) - want_loss), 100 * tol::kF32OpForward * want_loss)
          << "the cap changes the loss";
      ASSERT_GT(rel_diff(plain_grad, want_grad), 2 * grad_tol()) << "the cap changes the gradient";
      for (bool in_place : {false, true}) {
        BufP L = Buf::act(padded), dL = Buf::act(FV(padded.size(), pad));
        Buf Tg(tg), S(std::vector<double>{0.5});
        be().cross_entropy(S.f64({1}), (in_place ? L : dL)->a({N, ld}), L->a({N, ld}), Tg.i32({N}), N, V, grad_scale,
                           ld, cap);
        EXPECT_NEAR(S.read<double>()[0] - 0.5, want_loss, tol::kF32OpForward * std::fabs(want_loss)) << "loss";
        const FV got = (in_place ? L : dL)->rf();
        FV got_dense((size_t)(N * V));
        for (int64_t i = 0; i < N; i++)
          for (int64_t j = 0; j < ld; j++) {
            if (j < V) got_dense[(size_t)(i * V + j)] = got[(size_t)(i * ld + j)];
            else ASSERT_EQ(got[(size_t)(i * ld + j)], pad) << "padding written at row " << i << " column " << j;
          }
        EXPECT_TRUE(Close(got_dense, want_grad, grad_tol())) << (in_place ? "dlogits in place" : "dlogits apart");
      }
      {  // the op alone: capped in place, the padding kept
        BufP L = Buf::act(padded);
        be().logit_softcap(L->a({N, ld}), N, V, cap, ld);
        const FV got = L->rf();
        FV got_dense((size_t)(N * V));
        DV want((size_t)(N * V));
        for (int64_t i = 0; i < N; i++)
          for (int64_t j = 0; j < ld; j++) {
            if (j >= V) {
              ASSERT_EQ(got[(size_t)(i * ld + j)], pad) << "padding written at row " << i << " column " << j;
              continue;
            }
            got_dense[(size_t)(i * V + j)] = got[(size_t)(i * ld + j)];
            want[(size_t)(i * V + j)] = cap * std::tanh(dd[(size_t)(i * V + j)] / cap);
          }
        ASSERT_GT(rel_diff(dd, want), 2 * fwd_tol()) << "the cap changes the logits";
        EXPECT_TRUE(Close(got_dense, want, fwd_tol())) << "logit_softcap";
      }
    }
}

// The LM head's three matmuls over padded logits rows: logits = x W^T written with ld_out, and
// dW += dlogits^T x and dx = dlogits W reading dlogits with ld_a. Padding is neither read nor written.
TEST_P(Ops, MatmulOverPaddedRows) {
  std::mt19937 rng(17);
  const int64_t R = 9, V = 19, C = 8, ld = 32;
  const float pad = 7.0f;
  FV x = rand_act(rng, R * C), w = rand_act(rng, V * C), dl = rand_act(rng, R * V), pre = rand_f(rng, V * C);
  FV dl_padded((size_t)(R * ld), pad), out_padded((size_t)(R * ld), pad);
  for (int64_t i = 0; i < R; i++)
    for (int64_t j = 0; j < V; j++) dl_padded[(size_t)(i * ld + j)] = dl[(size_t)(i * V + j)];
  BufP X = Buf::act(x), W = Buf::act(w), DLp = Buf::act(dl_padded), Out = Buf::act(out_padded), dX = Buf::act(x);
  Buf dW(pre);
  be().matmul(Out->a({R, ld}), X->a({R, C}), W->a({V, C}), null_act({V}), R, V, C, false, true, false, 0, ld);
  be().matmul(dW.f32({V, C}), DLp->a({R, ld}), X->a({R, C}), null_act({C}), V, C, R, true, false, true, ld, 0);
  be().matmul(dX->a({R, C}), DLp->a({R, ld}), W->a({V, C}), null_act({C}), R, C, V, false, false, false, ld, 0);
  DV logits, dw = to_d(pre), dx;
  llmt_ref::matmul(logits, to_d(x), to_d(w), nullptr, R, V, C, false, true, false);
  llmt_ref::matmul(dw, to_d(dl), to_d(x), nullptr, V, C, R, true, false, true);
  llmt_ref::matmul(dx, to_d(dl), to_d(w), nullptr, R, C, V, false, false, false);
  const FV got = Out->rf();
  FV got_dense((size_t)(R * V));
  for (int64_t i = 0; i < R; i++)
    for (int64_t j = 0; j < ld; j++) {
      if (j < V) got_dense[(size_t)(i * V + j)] = got[(size_t)(i * ld + j)];
      else ASSERT_EQ(got[(size_t)(i * ld + j)], pad) << "padding written at row " << i << " column " << j;
    }
  EXPECT_TRUE(Close(got_dense, logits, fwd_tol())) << "logits";
  EXPECT_TRUE(Close(dW.rf(), dw, tol::kF32OpForward + (is_bf16() ? tol::kBf16OpForward / 4 : 0))) << "dW (+=)";
  EXPECT_TRUE(Close(dX->rf(), dx, fwd_tol())) << "dx";
  EXPECT_THROW(be().matmul(Out->a({R, ld}), X->a({R, C}), W->a({V, C}), null_act({V}), R, V, C, false, true, false, 0,
                           V - 1),
               llmt::Error)
      << "a row stride below the row";
}

TEST_P(Ops, CrossEntropyTargetOutOfRangeThrows) {
  std::mt19937 rng(62);
  const int64_t N = 5;
  const int V = 19;
  FV logits = rand_act(rng, N * V);
  for (int bad : {V, V + 7, -1, -99, -101}) {
    IV tg = {0, 3, llmt::kIgnoreIndex, 7, bad};
    BufP L = Buf::act(logits), dL = Buf::act_bytes(N * V);
    Buf Tg(tg), S(8);
    EXPECT_THROW(
        {
          be().cross_entropy(S.f64({1}), dL->a({N, V}), L->a({N, V}), Tg.i32({N}), N, V, 1.f);
          be().synchronize();
        },
        llmt::Error)
        << "target " << bad << " with dlogits";
    EXPECT_THROW(
        {
          be().cross_entropy(S.f64({1}), null_act({N, V}), L->a({N, V}), Tg.i32({N}), N, V, 1.f);
          be().synchronize();
        },
        llmt::Error)
        << "target " << bad << " loss only";
  }
}

// ======================= optimizer and reductions =======================

TEST_P(Ops, AdamWThreeStepsMatchTorchAdamWAndWriteTheComputeCopy) {
  std::mt19937 rng(71);
  const int64_t n = 37;
  // beta2 and eps away from the defaults so that a hard-coded constant or eps in the wrong place shows:
  // with |g*grad_scale| ~ 0.25, eps = 1e-3 moves the update by ~0.5%, far above the tolerance.
  // A large weight decay (lr * wd = 0.05 of p a step) so that decaying the wrong elements shows.
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-3f, wd = 5.0f, gs = 0.5f;
  // one call over "tensors" that decay ([3, 11), [11, 14) as a separate span, [20, 36)) and that do not
  llmt::DecaySpans spans;
  spans.count = 3;
  spans.begin[0] = 3, spans.end[0] = 11, spans.begin[1] = 11, spans.end[1] = 14, spans.begin[2] = 20, spans.end[2] = 36;
  DV wd_of(n, 0.0);
  for (int64_t i = 0; i < n; i++) wd_of[i] = spans.decays(i) ? wd : 0.0;
  FV p = rand_f(rng, n), m(n, 0.f), v(n, 0.f);
  DV pd = to_d(p), md(n, 0.0), vd(n, 0.0);
  Buf P(p), M(m), Vb(v), PC((size_t)n * 2);
  for (int t = 1; t <= 3; t++) {
    SCOPED_TRACE(::testing::Message() << "step " << t);
    FV g = rand_f(rng, n);
    Buf G(g);
    FV p_before = P.rf();
    DV pd_before = pd;
    be().adamw(P.f32({n}), is_bf16() ? PC.bf16({n}) : Tensor(), G.f32({n}), M.f32({n}), Vb.f32({n}), n, lr, b1, b2, eps,
               wd, spans, t, gs);
    llmt_ref::adamw(pd, to_d(g), md, vd, lr, b1, b2, eps, wd_of, t, gs);
    FV got = P.rf();
    EXPECT_TRUE(Close(got, pd, tol::kF32OpForward)) << "p";
    EXPECT_TRUE(Close(M.rf(), md, tol::kF32OpForward)) << "m";
    EXPECT_TRUE(Close(Vb.rf(), vd, tol::kF32OpForward)) << "v";
    // the update itself, from the same starting point, relative to its own size
    FV upd(n);
    DV want_upd(n);
    for (int64_t i = 0; i < n; i++) {
      upd[i] = got[i] - p_before[i];
      want_upd[i] = pd[i] - pd_before[i];
    }
    EXPECT_TRUE(Close(upd, want_upd, tol::kF32OpBackward)) << "p_new - p_old";
    if (is_bf16()) {  // the compute copy is the master's rounding, bit for bit
      std::vector<uint16_t> pc = PC.read<uint16_t>();
      for (int64_t i = 0; i < n; i++) ASSERT_EQ(pc[i], llmt::f32_to_bf16(got[i])) << "compute copy " << i;
    }
  }
}

TEST_P(Ops, SumSquaresAccumulatesInDouble) {
  std::mt19937 rng(72);
  for (int64_t n : {1, 7, 1001, 100003}) {
    FV x = rand_f(rng, n, -2.f, 2.f);
    double want = 0.5;  // out += the sum
    for (float f : x) want += (double)f * f;
    Buf X(x), S(std::vector<double>{0.5});
    be().sum_squares(S.f64({1}), X.f32({n}), n);
    EXPECT_NEAR(S.read<double>()[0], want, tol::kF32OpForward * want) << "n=" << n;
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

TEST_P(Ops, ConvertF32ToBf16RoundsToNearestEven) {
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

TEST_P(Ops, ConvertF32ToBf16NaNStaysNaN) {
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

TEST_P(Ops, ConvertRandomRoundTripsAgainstDistanceReference) {
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
  for (int64_t i = 0; i < n; i++) ASSERT_EQ(bits(back[i]), (uint32_t)out[i] << 16) << "bf16 -> f32 at " << i;
}

TEST_P(Ops, ConvertBf16ToF32KeepsSpecials) {
  std::vector<uint16_t> h = {0x0000, 0x8000, 0x3f80, 0xbf81, 0x7f80, 0xff80, 0x7fc1, 0x0001, 0x7f7f};
  const int64_t n = (int64_t)h.size();
  Buf I(h), O((size_t)n * 4);
  be().convert(O.f32({n}), I.bf16({n}), n);
  FV out = O.rf();
  for (int64_t i = 0; i < n; i++) EXPECT_EQ(bits(out[i]), (uint32_t)h[i] << 16) << "bf16 0x" << std::hex << h[i];
}

// ======================= argument checks =======================

// Bad arguments are refused by the op's one entry (engine/backend/backend.cpp), the same on every
// backend, with a message naming the backend, the op, the argument and what was expected, and
// before anything runs: the op is not counted.
// Runs f and expects an llmt::Error whose message holds every one of `parts` (as tests/test_util.h's,
// which this file cannot include: llmt_simt_asan_tests builds it without LLMT_SOURCE_DIR).
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const llmt::Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "\"" << p << "\" not in: " << msg;
    return;
  }
  ADD_FAILURE() << "expected an llmt::Error";
}

TEST_P(Ops, BadArgumentsAreRefusedByTheEntry) {
  const std::string name = be().name();
  const DType other = is_bf16() ? DType::f32 : DType::bf16;
  const int64_t n = 64;
  // act buffers of 2n elements: room for n f32 values too
  BufP X = Buf::act_bytes(2 * n), Y = Buf::act_bytes(2 * n), Z = Buf::act_bytes(2 * n), Big = Buf::act_bytes(8 * n);
  const int64_t ops_before = be().counters().ops;
  // an act tensor in the wrong dtype
  expect_error([&] { be().gelu_forward(Tensor(X->p(), other, {n}), Y->a({n}), n); },
               {name + " gelu_forward: out is " + llmt::dtype_name(other), "the backend computes in " +
                std::string(llmt::dtype_name(act_dtype()))});
  expect_error([&] { be().matmul(Z->f32({8, 8}), Tensor(X->p(), other, {8, 8}), Y->a({8, 8}), null_act({8}), 8, 8, 8,
                                 false, false, false); },
               {name + " matmul: a is " + llmt::dtype_name(other)});
  // the fixed dtypes: f32 gradients and statistics, i32 ids, f64 scalars
  expect_error([&] { be().bias_backward(Tensor(X->p(), DType::bf16, {8}), Y->a({8, 8}), 8, 8); },
               {name + " bias_backward: dbias is bf16, expected f32"});
  expect_error([&] { be().embedding_forward(Big->a({4, 8}), X->f32({4}), Y->a({4, 8}), null_act({4, 8}), 2, 2, 8, 4); },
               {name + " embedding_forward: tokens is f32, expected i32"});
  expect_error([&] { be().sum_squares(X->f32({1}), Y->f32({n}), n); },
               {name + " sum_squares: out is f32, expected f64"});
  // a tensor too small for the sizes given, and one with no data
  expect_error([&] { be().layernorm_forward(Big->a({5, 8}), X->f32({5}), Y->f32({5}), Z->a({2, 8}), Z->a({8}),
                                            Z->a({8}), 5, 8, 1e-5f); },
               {name + " layernorm_forward: x holds 16 elements ([2, 8]), needs 40"});
  // 2 tokens of [q (1 head) | k (1) | v (1)] of 8: 48 elements; Z holds 64, X as many
  expect_error([&] { be().head_rmsnorm_forward(Z->a({2, 24}), Y->f32({4}), Z->a({2, 24}), Z->a({8}), Z->a({8}), 2, 1,
                                               1, 8, 1e-6f); },
               {name + " head_rmsnorm_forward: out must not be in"});
  expect_error([&] { be().head_rmsnorm_forward(Z->a({2, 24}), Y->f32({4}), X->a({2, 16}), Z->a({8}), Z->a({8}), 2, 1,
                                               1, 8, 1e-6f); },
               {name + " head_rmsnorm_forward: in holds 32 elements", "needs 48"});
  expect_error([&] { be().add(X->a({n}), Y->a({n}), Z->a({n / 2}), n); },
               {name + " add: b holds 32 elements", "needs 64"});
  expect_error([&] { be().matmul(Z->a({8, 8}), null_act({8, 8}), Y->a({8, 8}), null_act({8}), 8, 8, 8, false, false,
                                 false); },
               {name + " matmul: a has no data"});
  expect_error([&] { be().matmul_residual(X->a({8, 8}), Tensor((char*)X->p() + 8 * llmt::dtype_size(act_dtype()),
                                                                act_dtype(), {8, 8}), Y->a({8, 8}), Z->a({8, 8}),
                                          null_act({8}), 8, 8, 8); },
               {name + " matmul_residual: out and residual overlap"});
  expect_error([&] { be().matmul_gelu(X->a({8, 8}), Y->a({8, 8}), Z->a({8, 8}), Big->a({8, 9}), null_act({8}), 8, 8,
                                      9); },
               {name + " matmul_gelu: a holds 64 elements", "needs 72"});
  expect_error([&] { be().matmul_dgelu(X->a({8, 8}), Y->a({8, 8}), Z->a({8, 8}), Tensor(Big->p(), other, {8, 8}), 8,
                                       8, 8); },
               {name + " matmul_dgelu: pre is " + llmt::dtype_name(other)});
  // sizes out of range: heads that do not group, an odd head size, a step t of 0
  const int B = 1, T = 2, hs = 2;
  expect_error([&] { be().attention_forward(Big->a({B * T, 3 * hs}), X->f32({B * 3 * T}), Big->a({B * T, 7 * hs}), B, T,
                                            3, 2, hs, llmt::Dropout{}); },
               {name + " attention_forward: 3 heads do not group over 2 kv heads"});
  expect_error([&] { be().attention_backward(Big->a({B * T, 8 * hs}), Y->a({B * T, 3 * hs}), Big->a({B * T, 8 * hs}),
                                             Z->a({B * T, 3 * hs}), X->f32({B * 3 * T}), B, T, 3, 2, hs,
                                             llmt::Dropout{}); },
               {name + " attention_backward: 3 heads do not group over 2 kv heads"});
  expect_error([&] { be().rope_forward(Big->a({B * T, 4 * 3}), B, T, 2, 1, 3, llmt::RopeSpec{}); },
               {name + " rope_forward: head size 3 is odd"});
  expect_error([&] { be().rope_forward(Big->a({2, 8 * hs}), 1, 2, 2, 1, hs, llmt::RopeSpec{}, X->f32({2})); },
               {name + " rope_forward: positions is f32, expected i32"});
  expect_error([&] { be().attention_forward(Big->a({B * T, 2 * hs}), X->f32({B * 2 * T}), Big->a({B * T, 4 * hs}), B, T,
                                            2, 1, hs, llmt::Dropout{}, llmt::PackedDocs{Y->i32({1}), 1}); },
               {name + " attention_forward: doc_start holds 1 elements"});
  expect_error([&] { be().attention_forward(Big->a({B * T, 2 * hs}), X->f32({B * 2 * T}), Big->a({B * T, 4 * hs}), B, T,
                                            2, 1, hs, llmt::Dropout{}, llmt::PackedDocs(), -1); },
               {name + " attention_forward: sliding window of -1 keys, expected 0 (none) or more"});
  expect_error([&] { be().attention_backward(Big->a({B * T, 4 * hs}), Y->a({B * T, 2 * hs}), Big->a({B * T, 4 * hs}),
                                             Y->a({B * T, 2 * hs}), X->f32({B * 2 * T}), B, T, 2, 1, hs, llmt::Dropout{},
                                             llmt::PackedDocs(), 0, llmt::AttnScores{-0.5f, 0.0f}); },
               {name + " attention_backward: attention scale -0.5, expected > 0 (or 0: 1/sqrt(" + std::to_string(hs) +
                "))"});
  expect_error([&] { be().attention_kv(Y->a({2, 2 * hs}), Z->a({1, 1, 4, hs}), Z->a({1, 1, 4, hs}), Big->a({2, 4 * hs}),
                                       X->i32({1}), 1, 2, 0, 4, 2, 1, hs, 0, llmt::AttnScores{0.0f, NAN}); },
               {name + " attention_kv: attention soft cap nan, expected > 0 (or 0: none)"});
  // a row of 2 tokens holds 1 or 2 documents, never 3
  expect_error([&] { be().attention_forward(Big->a({B * T, 2 * hs}), X->f32({B * 2 * T}), Big->a({B * T, 4 * hs}), B, T,
                                            2, 1, hs, llmt::Dropout{}, llmt::PackedDocs{Y->i32({B * T}), 3}); },
               {name + " attention_forward: 3 packed documents in 1 rows of 2 tokens, expected 1 to 2"});
  // a KV cache of 4 positions holding 3 cannot take 2 more
  expect_error([&] { be().attention_kv(Y->a({2, 2 * hs}), Z->a({1, 1, 4, hs}), Z->a({1, 1, 4, hs}), Big->a({2, 4 * hs}),
                                       X->i32({1}), 1, 2, 3, 4, 2, 1, hs); },
               {name + " attention_kv: 3 cached and 2 new tokens exceed the cache's 4 positions"});
  expect_error([&] { be().adamw(X->f32({n}), Tensor(), Y->f32({n}), Z->f32({n}), Big->f32({n}), n, 1e-3f, 0.9f, 0.999f,
                                1e-8f, 0.f, llmt::DecaySpans::all(n), 0, 1.f); },
               {name + " adamw: step t (1-based) = 0, expected at least 1"});
  llmt::DecaySpans beyond = llmt::DecaySpans::all(n + 1);
  expect_error([&] { be().adamw(X->f32({n}), Tensor(), Y->f32({n}), Z->f32({n}), Big->f32({n}), n, 1e-3f, 0.9f, 0.999f,
                                1e-8f, 0.1f, beyond, 1, 1.f); },
               {name + " adamw: decay span 0", "beyond n"});
  expect_error([&] { be().dropout(X->a({n}), 1, 1, n, llmt::Dropout{1.0f, 7, 0}); },
               {name + " dropout: p = 1, expected 0 <= p < 1"});
  EXPECT_EQ(be().counters().ops, ops_before) << "a refused op was counted (it ran)";
}

// The counters llmt bench reports: every op that runs counts once; on the CPU each is one launch.
// (The CUDA backend's launches are counted where kernels launch: tests/cuda/simt_test.cpp.)
TEST_P(Ops, CountersCountOpsAndHostSyncs) {
  const int64_t n = 256;
  FV h(n, 0.5f);
  BufP A = Buf::act(h), Bv = Buf::act(h);
  Buf S(8);
  const llmt::BackendCounters c0 = be().counters();
  be().add(A->a({n}), A->a({n}), Bv->a({n}), n);
  be().scale(A->a({n}), 2.f, n);
  be().dropout(A->a({n}), 1, 1, n, llmt::Dropout{});  // p = 0: nothing runs, nothing is counted
  be().synchronize();
  double back = 0;
  be().copy_to_host(&back, S.p(), sizeof(back));
  const llmt::BackendCounters c1 = be().counters();
  EXPECT_EQ(c1.ops - c0.ops, 2);
  EXPECT_EQ(c1.host_syncs - c0.host_syncs, 2) << "synchronize and copy_to_host";
  EXPECT_EQ(c1.launches - c0.launches, 2) << "one launch per op on the CPU; add and scale are one kernel each";
}

// ======================= elementwise =======================

TEST_P(Ops, ElementwiseAddAccumulateScale) {
  std::mt19937 rng(91);
  const int64_t n = 1003;
  FV a = rand_act(rng, n), b = rand_act(rng, n), g = rand_act(rng, n, 5.f, 6.f);
  DV sum(n);
  for (int64_t i = 0; i < n; i++) sum[i] = (double)a[i] + b[i];
  {
    BufP A = Buf::act(a), Bb = Buf::act(b), O = Buf::act(g);
    be().add(O->a({n}), A->a({n}), Bb->a({n}), n);
    EXPECT_TRUE(Close(O->rf(), sum, fwd_tol())) << "add (=)";
    EXPECT_EQ(A->rf(), a);
    EXPECT_EQ(Bb->rf(), b);
  }
  {
    BufP A = Buf::act(a), Bb = Buf::act(b);
    be().add(A->a({n}), A->a({n}), Bb->a({n}), n);
    EXPECT_TRUE(Close(A->rf(), sum, fwd_tol())) << "add, out aliasing a";
  }
  {
    BufP A = Buf::act(a), Bb = Buf::act(b);
    be().add(Bb->a({n}), A->a({n}), Bb->a({n}), n);
    EXPECT_TRUE(Close(Bb->rf(), sum, fwd_tol())) << "add, out aliasing b";
  }
  {
    BufP D = Buf::act(a), S = Buf::act(b);
    be().accumulate(D->a({n}), S->a({n}), n);
    EXPECT_TRUE(Close(D->rf(), sum, fwd_tol())) << "accumulate (+=)";
    EXPECT_EQ(S->rf(), b) << "accumulate changed src";
  }
  {  // an f32 gradient shard += a gradient in the act dtype (the FSDP store's accumulation)
    Buf D(a);
    BufP S = Buf::act(b);
    be().accumulate(D.f32({n}), S->a({n}), n);
    EXPECT_TRUE(Close(D.rf(), sum, tol::kF32OpForward)) << "accumulate f32 += act";
  }
  {
    BufP X = Buf::act(a);
    const float s = -0.731f;
    be().scale(X->a({n}), s, n);
    DV want(n);
    for (int64_t i = 0; i < n; i++) want[i] = (double)a[i] * s;
    EXPECT_TRUE(Close(X->rf(), want, fwd_tol())) << "scale";
  }
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Backends, Ops, ::testing::Range(0, (int)backend_cases().size()), case_name);
