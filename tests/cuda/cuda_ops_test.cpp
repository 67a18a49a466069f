// Every CUDA kernel in kernels/cuda/cuda_kernels.h against its CPU twin (make_cpu_backend), on fresh
// random inputs (the seed is printed; LLMT_TEST_SEED=<n> repeats a run), with odd sizes so that the
// scalar tails run, and with pointers one element off 16-byte alignment so that the scalar paths run.
//   fp32 ops: relative error under 1e-5 (per element, with the tensor's rms as a floor, so that values
//             which cancel to near zero are judged against the tensor's scale);
//   bf16 conversion: bit for bit; bf16 ops: exact (add, accumulate, scale: the CPU's fp32 result
//             rounded), else relative error under 5e-3 against the CPU's fp32 result (one rounding).
// Without a GPU every test skips. Built into llmt_cuda_tests (not ctest); run by scripts/gpu_selftest.sh.
// The file is not named test_*.cpp: the llmt_tests glob (tests/*/test_*.cpp) would take it in too,
// and that binary does not link llmt_cuda.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/mma_probe.h"

namespace llmt {
namespace {

constexpr int64_t kN = 1000003;  // odd: exercises every vector loop's tail
constexpr double kTolF32 = 1e-5;
// bf16 ops against the CPU's fp32 result: one rounding to bf16 is at most 2^-8 relative.
constexpr double kTolBf16 = 5e-3;

// ---- device buffers ----

template <typename T>
class DeviceBuf {
 public:
  explicit DeviceBuf(size_t n) : n_(n) { p_ = static_cast<T*>(cuda::device_alloc(n * sizeof(T))); }
  explicit DeviceBuf(const std::vector<T>& host) : DeviceBuf(host.size()) { upload(host); }
  ~DeviceBuf() {
    try {
      cuda::device_free(p_);
    } catch (...) {
    }
  }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;

  T* get() const { return p_; }
  void upload(const std::vector<T>& host) { cuda::copy_to_device(p_, host.data(), host.size() * sizeof(T)); }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    cuda::device_synchronize();
    cuda::copy_to_host(host.data(), p_, n_ * sizeof(T));
    return host;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// ---- comparisons ----

// max_i |got - want| / (|want| + rms(want)); a NaN on one side only is an infinite error.
double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double ss = 0.0;
  for (float w : want)
    if (std::isfinite(w)) ss += (double)w * w;
  const double rms = want.empty() ? 0.0 : std::sqrt(ss / (double)want.size());
  double worst = 0.0;
  for (size_t i = 0; i < want.size(); i++) {
    const bool gn = std::isnan(got[i]), wn = std::isnan(want[i]);
    if (gn || wn) {
      if (gn != wn) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (got[i] == want[i]) continue;  // covers equal infinities
    const double denom = std::fabs((double)want[i]) + rms;
    const double e = denom > 0 ? std::fabs((double)got[i] - (double)want[i]) / denom
                               : std::numeric_limits<double>::infinity();
    if (!(e <= worst)) worst = e;
  }
  return worst;
}

// The number of elements whose bits differ.
template <typename T>
int64_t count_bit_mismatches(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return -1;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); i++) bad += std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
  return bad;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); i++) out[i] = f32_to_bf16(x[i]);
  return out;
}
std::vector<float> to_f32(const std::vector<uint16_t>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); i++) out[i] = bf16_to_f32(x[i]);
  return out;
}

// ---- the fixture ----

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device, skipping: " << cuda_device_description(0)
                   << ". These tests need a GPU; scripts/gpu_selftest.sh runs them on one.";
    cpu_ = make_cpu_backend(2);
    const char* env = std::getenv("LLMT_TEST_SEED");
    seed_ = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    rng_.seed(seed_);
    std::printf("[ seed     ] LLMT_TEST_SEED=%llu\n", (unsigned long long)seed_);
  }

  // Uniform in [lo, hi), never a zero-filled buffer.
  std::vector<float> uniform(int64_t n, float lo = -3.0f, float hi = 3.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> x((size_t)n);
    for (float& v : x) v = d(rng_);
    return x;
  }
  // A bf16-representable version of uniform(): what a bf16 tensor could hold.
  std::vector<float> uniform_bf16_values(int64_t n, float lo = -3.0f, float hi = 3.0f) {
    return to_f32(to_bf16(uniform(n, lo, hi)));
  }

  std::unique_ptr<Backend> cpu_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

Tensor f32t(std::vector<float>& v) { return f32_tensor(v.data(), {(int64_t)v.size()}); }
Tensor bf16t(std::vector<uint16_t>& v) { return Tensor(v.data(), DType::bf16, {(int64_t)v.size()}); }

// ---- device info and errors ----

TEST_F(CudaOps, DeviceDescription) {
  std::string d = cuda_device_description(0);
  std::printf("[ device   ] %s\n", d.c_str());
  EXPECT_NE(d.find("compute capability"), std::string::npos) << d;
  EXPECT_NE(cuda_device_description(cuda_device_count()).find("not available"), std::string::npos);
}

TEST_F(CudaOps, ErrorsThrowLlmtError) {
  try {
    void* p = cuda::device_alloc((size_t)1 << 60);
    cuda::device_free(p);
    FAIL() << "a 1 EiB allocation succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaMalloc"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cuda::scale_f32(nullptr, 1.0f, -1), Error);
  EXPECT_THROW(cuda::adamw(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0, nullptr,
                           nullptr, 0, 1.0f),
               Error);
  // The device still works after the failures above.
  std::vector<float> x = uniform(1000);
  DeviceBuf<float> dx(x);
  EXPECT_EQ(count_bit_mismatches(dx.download(), x), 0);
}

// ---- conversion ----

TEST_F(CudaOps, ConvertF32ToBf16BitExact) {
  // Random bit patterns: every exponent, denormals, infinities, NaNs; plus exact ties (low half 0x8000).
  std::vector<float> x((size_t)kN);
  std::uniform_int_distribution<uint32_t> bits;
  for (size_t i = 0; i < x.size(); i++) {
    uint32_t u = bits(rng_);
    if (i % 7 == 0) u = (u & 0xffff0000u) | 0x8000u;
    std::memcpy(&x[i], &u, 4);
  }
  std::vector<uint16_t> want((size_t)kN);
  cpu_->convert(bf16t(want), f32t(x), kN);
  for (size_t i = 0; i < x.size(); i += 9973) ASSERT_EQ(want[i], f32_to_bf16(x[i])) << i;

  DeviceBuf<float> dx(x);
  DeviceBuf<uint16_t> dy((size_t)kN);
  cuda::convert_f32_to_bf16(dy.get(), dx.get(), kN);
  EXPECT_EQ(count_bit_mismatches(dy.download(), want), 0);

  // Off 16-byte alignment: the scalar path.
  DeviceBuf<uint16_t> dy2((size_t)kN);
  cuda::convert_f32_to_bf16(dy2.get() + 1, dx.get() + 1, kN - 1);
  std::vector<uint16_t> got2 = dy2.download();
  EXPECT_EQ(got2[0], 0);
  EXPECT_EQ(std::memcmp(got2.data() + 1, want.data() + 1, (kN - 1) * 2), 0);

  // Tiny sizes: only the tail runs.
  for (int64_t n : {1, 3, 7}) {
    DeviceBuf<uint16_t> dt((size_t)n);
    cuda::convert_f32_to_bf16(dt.get(), dx.get(), n);
    std::vector<uint16_t> got = dt.download();
    EXPECT_EQ(std::memcmp(got.data(), want.data(), n * 2), 0) << "n=" << n;
  }
}

TEST_F(CudaOps, ConvertBf16ToF32BitExact) {
  // Every bf16 bit pattern, in random order, repeated to an odd length.
  std::vector<uint16_t> x((size_t)kN);
  for (size_t i = 0; i < x.size(); i++) x[i] = (uint16_t)(i * 40503u);  // odd multiplier: a permutation mod 2^16
  std::shuffle(x.begin(), x.end(), rng_);
  std::vector<float> want((size_t)kN);
  cpu_->convert(f32t(want), bf16t(x), kN);

  DeviceBuf<uint16_t> dx(x);
  DeviceBuf<float> dy((size_t)kN);
  cuda::convert_bf16_to_f32(dy.get(), dx.get(), kN);
  EXPECT_EQ(count_bit_mismatches(dy.download(), want), 0);

  DeviceBuf<float> dy2((size_t)kN);
  cuda::convert_bf16_to_f32(dy2.get() + 1, dx.get() + 1, kN - 1);
  std::vector<float> got2 = dy2.download();
  EXPECT_EQ(std::memcmp(got2.data() + 1, want.data() + 1, (kN - 1) * 4), 0);
}

// ---- elementwise ----

TEST_F(CudaOps, AddAccumulateScaleF32) {
  std::vector<float> a = uniform(kN), b = uniform(kN);
  const float s = 0.37f;
  for (int off : {0, 1}) {  // 1: pointers off 16-byte alignment
    SCOPED_TRACE("offset " + std::to_string(off));
    const int64_t n = kN - off;
    std::vector<float> want_add(a), want_acc(a), want_scale(a);
    cpu_->add(f32_tensor(want_add.data() + off, {n}), f32_tensor(a.data() + off, {n}),
              f32_tensor(b.data() + off, {n}), n);
    cpu_->accumulate(f32_tensor(want_acc.data() + off, {n}), f32_tensor(b.data() + off, {n}), n);
    cpu_->scale(f32_tensor(want_scale.data() + off, {n}), s, n);

    DeviceBuf<float> da(a), db(b), dout(a);
    cuda::add_f32(dout.get() + off, da.get() + off, db.get() + off, n);
    EXPECT_LT(rel_error(dout.download(), want_add), kTolF32) << "add";
    cuda::add_f32(da.get() + off, da.get() + off, db.get() + off, n);  // out aliases a
    EXPECT_LT(rel_error(da.download(), want_add), kTolF32) << "add, out aliasing a";

    DeviceBuf<float> dacc(a);
    cuda::accumulate_f32(dacc.get() + off, db.get() + off, n);
    EXPECT_LT(rel_error(dacc.download(), want_acc), kTolF32) << "accumulate";

    DeviceBuf<float> dsc(a);
    cuda::scale_f32(dsc.get() + off, s, n);
    EXPECT_LT(rel_error(dsc.download(), want_scale), kTolF32) << "scale";
  }
}

TEST_F(CudaOps, AddAccumulateScaleBf16) {
  // bf16 in, fp32 math, one rounding out: exactly the CPU's fp32 result rounded.
  std::vector<float> a = uniform_bf16_values(kN), b = uniform_bf16_values(kN);
  const float s = 0.37f;
  std::vector<float> sum(a), scaled(a);
  cpu_->add(f32t(sum), f32t(a), f32t(b), kN);
  cpu_->scale(f32t(scaled), s, kN);
  const std::vector<uint16_t> want_sum = to_bf16(sum), want_scaled = to_bf16(scaled);
  for (int off : {0, 1}) {
    SCOPED_TRACE("offset " + std::to_string(off));
    const int64_t n = kN - off;
    auto check = [&](const DeviceBuf<uint16_t>& d, const std::vector<uint16_t>& want, const char* what) {
      std::vector<uint16_t> got = d.download();
      EXPECT_EQ(std::memcmp(got.data() + off, want.data() + off, n * 2), 0) << what;
    };
    DeviceBuf<uint16_t> da(to_bf16(a)), db(to_bf16(b)), dout((size_t)kN);
    cuda::add_bf16(dout.get() + off, da.get() + off, db.get() + off, n);
    check(dout, want_sum, "add");
    cuda::accumulate_bf16(da.get() + off, db.get() + off, n);
    check(da, want_sum, "accumulate");
    DeviceBuf<uint16_t> dsc(to_bf16(a));
    cuda::scale_bf16(dsc.get() + off, s, n);
    check(dsc, want_scaled, "scale");
  }
}

// ---- GELU ----

TEST_F(CudaOps, GeluF32) {
  std::vector<float> x = uniform(kN, -6.0f, 6.0f), dout = uniform(kN);
  for (int off : {0, 1}) {
    SCOPED_TRACE("offset " + std::to_string(off));
    const int64_t n = kN - off;
    std::vector<float> want_y(x), want_dx(dout);
    cpu_->gelu_forward(f32_tensor(want_y.data() + off, {n}), f32_tensor(x.data() + off, {n}), n);
    cpu_->gelu_backward(f32_tensor(want_dx.data() + off, {n}), f32_tensor(x.data() + off, {n}),
                        f32_tensor(dout.data() + off, {n}), n);

    DeviceBuf<float> dx(x), dy(x), dd(dout), ddx(dout);
    cuda::gelu_forward_f32(dy.get() + off, dx.get() + off, n);
    EXPECT_LT(rel_error(dy.download(), want_y), kTolF32) << "gelu_forward";
    cuda::gelu_backward_f32(ddx.get() + off, dx.get() + off, dd.get() + off, n);
    EXPECT_LT(rel_error(ddx.download(), want_dx), kTolF32) << "gelu_backward";
    cuda::gelu_backward_f32(dd.get() + off, dx.get() + off, dd.get() + off, n);  // dx aliases dout
    EXPECT_LT(rel_error(dd.download(), want_dx), kTolF32) << "gelu_backward, dx aliasing dout";
  }
}

TEST_F(CudaOps, GeluBf16) {
  std::vector<float> x = uniform_bf16_values(kN, -6.0f, 6.0f), dout = uniform_bf16_values(kN);
  std::vector<float> y((size_t)kN), dx((size_t)kN);
  cpu_->gelu_forward(f32t(y), f32t(x), kN);
  cpu_->gelu_backward(f32t(dx), f32t(x), f32t(dout), kN);

  DeviceBuf<uint16_t> bx(to_bf16(x)), bd(to_bf16(dout)), by((size_t)kN), bdx((size_t)kN);
  cuda::gelu_forward_bf16(by.get(), bx.get(), kN);
  cuda::gelu_backward_bf16(bdx.get(), bx.get(), bd.get(), kN);
  EXPECT_LT(rel_error(to_f32(by.download()), y), kTolBf16) << "gelu_forward";
  EXPECT_LT(rel_error(to_f32(bdx.download()), dx), kTolBf16) << "gelu_backward";
}

// ---- SwiGLU ----

struct SwigluShape {
  int64_t N;
  int I;
};

TEST_F(CudaOps, SwigluF32) {
  // I % 4 != 0: scalar path; I % 4 == 0: 128-bit path. Both about a million outputs.
  for (SwigluShape sh : {SwigluShape{1001, 999}, SwigluShape{333, 3004}, SwigluShape{1, 7}}) {
    SCOPED_TRACE("N=" + std::to_string(sh.N) + " I=" + std::to_string(sh.I));
    const int64_t nout = sh.N * sh.I;
    std::vector<float> gu = uniform(2 * nout, -8.0f, 8.0f), dout = uniform(nout);
    std::vector<float> want_y((size_t)nout), want_dgu((size_t)(2 * nout));
    cpu_->swiglu_forward(f32t(want_y), f32t(gu), sh.N, sh.I);
    cpu_->swiglu_backward(f32t(want_dgu), f32t(dout), f32t(gu), sh.N, sh.I);

    DeviceBuf<float> dgu(gu), dd(dout), dy((size_t)nout), ddgu(uniform(2 * nout));  // (=): old contents ignored
    cuda::swiglu_forward_f32(dy.get(), dgu.get(), sh.N, sh.I);
    cuda::swiglu_backward_f32(ddgu.get(), dd.get(), dgu.get(), sh.N, sh.I);
    EXPECT_LT(rel_error(dy.download(), want_y), kTolF32) << "swiglu_forward";
    EXPECT_LT(rel_error(ddgu.download(), want_dgu), kTolF32) << "swiglu_backward";
  }
}

TEST_F(CudaOps, SwigluBf16) {
  for (SwigluShape sh : {SwigluShape{1001, 999}, SwigluShape{333, 3008}}) {  // scalar path; 8-wide path
    SCOPED_TRACE("N=" + std::to_string(sh.N) + " I=" + std::to_string(sh.I));
    const int64_t nout = sh.N * sh.I;
    std::vector<float> gu = uniform_bf16_values(2 * nout, -8.0f, 8.0f), dout = uniform_bf16_values(nout);
    std::vector<float> y((size_t)nout), dgu((size_t)(2 * nout));
    cpu_->swiglu_forward(f32t(y), f32t(gu), sh.N, sh.I);
    cpu_->swiglu_backward(f32t(dgu), f32t(dout), f32t(gu), sh.N, sh.I);

    DeviceBuf<uint16_t> bgu(to_bf16(gu)), bd(to_bf16(dout)), by((size_t)nout), bdgu((size_t)(2 * nout));
    cuda::swiglu_forward_bf16(by.get(), bgu.get(), sh.N, sh.I);
    cuda::swiglu_backward_bf16(bdgu.get(), bd.get(), bgu.get(), sh.N, sh.I);
    EXPECT_LT(rel_error(to_f32(by.download()), y), kTolBf16) << "swiglu_forward";
    EXPECT_LT(rel_error(to_f32(bdgu.download()), dgu), kTolBf16) << "swiglu_backward";
  }
}

// ---- AdamW ----

TEST_F(CudaOps, AdamW) {
  const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 5.0f, grad_scale = 0.5f;
  for (int off : {0, 1}) {
    SCOPED_TRACE("offset " + std::to_string(off));
    const int64_t n = kN - off;
    // decay spans whose edges fall inside the kernel's 4-element vectors: elements outside them
    // take no decay (a large wd, so that decaying the wrong ones shows)
    DecaySpans spans;
    spans.count = 2;
    spans.begin[0] = 5, spans.end[0] = n / 2 + 1, spans.begin[1] = n / 2 + 3, spans.end[1] = n - 7;
    std::vector<float> p = uniform(kN), m = uniform(kN, -0.1f, 0.1f), v = uniform(kN, 1e-4f, 1e-2f);
    DeviceBuf<float> dp(p), dm(m), dv(v);
    DeviceBuf<uint16_t> dpb((size_t)kN);
    for (int t : {1, 2, 7}) {  // successive steps, as the trainer calls it
      SCOPED_TRACE("t=" + std::to_string(t));
      std::vector<float> g = uniform(kN);
      cpu_->adamw(f32_tensor(p.data() + off, {n}), Tensor(), f32_tensor(g.data() + off, {n}), f32_tensor(m.data() + off, {n}),
                  f32_tensor(v.data() + off, {n}), n, lr, beta1, beta2, eps, wd, spans, t, grad_scale);
      DeviceBuf<float> dg(g);
      uint16_t* pb = t == 2 ? nullptr : dpb.get() + off;  // the bf16 copy is optional
      cuda::adamw(dp.get() + off, pb, dg.get() + off, dm.get() + off, dv.get() + off, n, lr, beta1, beta2, eps, wd,
                  spans.count, spans.begin, spans.end, t, grad_scale);
      std::vector<float> gp = dp.download();
      EXPECT_LT(rel_error(gp, p), kTolF32) << "p";
      EXPECT_LT(rel_error(dm.download(), m), kTolF32) << "m";
      EXPECT_LT(rel_error(dv.download(), v), kTolF32) << "v";
      if (pb) {
        std::vector<uint16_t> gpb = dpb.download(), want = to_bf16(gp);
        EXPECT_EQ(std::memcmp(gpb.data() + off, want.data() + off, n * 2), 0) << "p_bf16 is not bf16(p)";
      }
      // Keep the CPU and GPU states identical for the next step, so only one step's error is measured.
      p = gp;
      m = dm.download();
      v = dv.download();
    }
  }
}

// ---- sum of squares ----

double cpu_sum_squares(Backend& cpu, const float* x, int64_t n) {
  double s = 0.0;
  cpu.sum_squares(Tensor(&s, DType::f64, {1}), Tensor((void*)x, DType::f32, {n}), n);
  return s;
}

TEST_F(CudaOps, SumSquares) {
  std::vector<float> x = uniform(kN);
  DeviceBuf<float> dx(x);
  DeviceBuf<double> dout(2), dpart((size_t)cuda::kSumSquaresPartials);
  auto gpu = [&](int off, int64_t n, bool acc) {
    cuda::sum_squares_f32(dout.get(), dpart.get(), dx.get() + off, n, acc);
    return dout.download()[0];
  };
  for (int off : {0, 1}) {
    for (int64_t n : {kN - off, (int64_t)1, (int64_t)7, (int64_t)4099}) {
      SCOPED_TRACE("offset " + std::to_string(off) + " n=" + std::to_string(n));
      const double want = cpu_sum_squares(*cpu_, x.data() + off, n);
      const double got = gpu(off, n, false);
      EXPECT_LT(std::fabs(got - want) / want, 1e-9) << "got " << got << " want " << want;
      const double again = gpu(off, n, false);
      EXPECT_EQ(std::memcmp(&got, &again, 8), 0) << "not deterministic: " << got << " then " << again;
    }
  }
  // accumulate: (+=) onto what out holds.
  const double a = cpu_sum_squares(*cpu_, x.data(), 1000);
  const double b = cpu_sum_squares(*cpu_, x.data() + 1000, kN - 1000);
  cuda::sum_squares_f32(dout.get(), dpart.get(), dx.get(), 1000, false);
  cuda::sum_squares_f32(dout.get(), dpart.get(), dx.get() + 1000, kN - 1000, true);
  EXPECT_LT(std::fabs(dout.download()[0] - (a + b)) / (a + b), 1e-9);
  // n == 0: out (=) 0, or unchanged with accumulate.
  const double before = dout.download()[0];
  EXPECT_EQ(gpu(0, 0, true), before);
  EXPECT_EQ(gpu(0, 0, false), 0.0);
}

// ---- the backend's counters (llmt bench's launches_per_step and host_syncs_per_step) ----

// A known sequence of ops through the CUDA backend: each kernel launch counts once (sum_squares is
// two kernels, a same-dtype convert a copy and no kernel, a matmul one launch whether native or
// cuBLASLt), and each wait of the host once.
TEST_F(CudaOps, BackendCountsLaunchesAndHostSyncs) {
  std::unique_ptr<Backend> be = make_cuda_backend(0, DType::f32, false);
  const int64_t n = 64;
  std::vector<void*> p;
  for (int i = 0; i < 4; i++) p.push_back(be->alloc(n * 8));
  Tensor a(p[0], DType::f32, {8, 8}), b(p[1], DType::f32, {8, 8}), c(p[2], DType::f32, {8, 8});
  Tensor s(p[3], DType::f64, {1});
  be->sum_squares(s, a.view(0, {n}), n);  // its scratch buffer is made (and waited for) here, not below
  std::unique_ptr<Event> e = be->make_event();
  const BackendCounters c0 = be->counters();
  be->add(c.view(0, {n}), a.view(0, {n}), b.view(0, {n}), n);                // 1 kernel
  be->sum_squares(s, a.view(0, {n}), n);                                     // 2
  be->convert(Tensor(p[3], DType::bf16, {n}), a.view(0, {n}), n);            // 1
  be->convert(c.view(0, {n}), a.view(0, {n}), n);                            // 0: a copy
  be->matmul(c, a, b, Tensor(), 8, 8, 8, false, false, false);               // 1
  be->zero(p[1], n * 4);                                                     // 0: a memset
  be->synchronize();                                                         // 1 host sync
  float h[4];
  be->copy_to_host(h, p[2], sizeof(h));                                      // 1
  be->record(*e);
  e->synchronize();                                                          // 1
  const BackendCounters c1 = be->counters();
  EXPECT_EQ(c1.ops - c0.ops, 6);
  EXPECT_EQ(c1.launches - c0.launches, 5);
  EXPECT_EQ(c1.host_syncs - c0.host_syncs, 3);
  for (void* q : p) be->release(q);
}

// ---- tensor cores (kernels/cuda/mma.cuh): the PTX ISA's fragment layouts ----
// The same tests run on the emulator (ctest) and on silicon (the GPU self-test's layout step), so a
// layout the emulator got wrong is caught by the hardware. Products of bf16 values are exact in f32;
// the bound allows for the order (and width) of the tensor core's sum of 16 products and c.

// a[16 x 16], b[16 x 8] bf16 values; c[16 x 8]; d = a @ b + c in double.
std::vector<double> mma_reference(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c,
                                  std::vector<double>* scale) {
  std::vector<double> d(128);
  scale->assign(128, 0.0);
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 8; j++) {
      double s = c[i * 8 + j], m = std::fabs(c[i * 8 + j]);
      for (int k = 0; k < 16; k++) {
        s += (double)a[i * 16 + k] * b[k * 8 + j];
        m += std::fabs((double)a[i * 16 + k] * b[k * 8 + j]);
      }
      d[(size_t)(i * 8 + j)] = s;
      (*scale)[(size_t)(i * 8 + j)] = m;
    }
  return d;
}

TEST_F(CudaOps, MmaM16n8k16Bf16FragmentsMatchProduct) {
  for (int rep = 0; rep < 4; rep++) {
    const std::vector<float> a = uniform_bf16_values(256), b = uniform_bf16_values(128), c = uniform(128);
    DeviceBuf<uint16_t> da(to_bf16(a)), db(to_bf16(b));
    DeviceBuf<float> dc(c), dd(128);
    std::vector<double> scale;
    const std::vector<double> want = mma_reference(a, b, c, &scale);
    for (int how = 0; how < 2; how++) {
      SCOPED_TRACE(how == 0 ? "fragments from the layout formulas" : "fragments by ldmatrix (x4, x2.trans)");
      if (how == 0) cuda::mma_probe_fragments(dd.get(), da.get(), db.get(), dc.get());
      else cuda::mma_probe_ldmatrix(dd.get(), da.get(), db.get(), dc.get());
      const std::vector<float> got = dd.download();
      for (int i = 0; i < 128; i++)
        ASSERT_LE(std::fabs(got[(size_t)i] - want[(size_t)i]), 4e-6 * scale[(size_t)i] + 1e-30)
            << "D[" << i / 8 << "][" << i % 8 << "]: got " << got[(size_t)i] << ", want " << want[(size_t)i];
    }
  }
}

TEST_F(CudaOps, LdmatrixX1X2X4AndTransGiveTheDocumentedElements) {
  // element (j, r, c) of the n matrices holds a distinct id, so each register names what it loaded
  std::vector<uint16_t> m(4 * 64);
  for (int i = 0; i < 4 * 64; i++) m[(size_t)i] = (uint16_t)(0x1000 + i);
  DeviceBuf<uint16_t> dm(m);
  DeviceBuf<uint32_t> dout(32 * 4);
  for (int n : {1, 2, 4})
    for (bool trans : {false, true}) {
      SCOPED_TRACE("x" + std::to_string(n) + (trans ? ".trans" : ""));
      cuda::ldmatrix_probe(dout.get(), dm.get(), n, trans);
      const std::vector<uint32_t> got = dout.download();
      for (int l = 0; l < 32; l++)
        for (int j = 0; j < n; j++)
          for (int e = 0; e < 2; e++) {
            const int r = trans ? 2 * (l % 4) + e : l / 4, c = trans ? l / 4 : 2 * (l % 4) + e;
            const uint16_t want = m[(size_t)(j * 64 + r * 8 + c)];
            const uint16_t have = (uint16_t)(got[(size_t)(l * 4 + j)] >> (16 * e));
            ASSERT_EQ(have, want) << "lane " << l << " register " << j << " half " << e;
          }
    }
}

}  // namespace
}  // namespace llmt
