// llmt_matmul_bench: the matmuls of one GPT-2 124M training step (batch 4 x 64 tokens) through each
// candidate CPU library, to choose the CPU backend's fp32 and bf16 matmul by measurement
// (docs/performance.md). A benchmark, run by hand; never a test.
//
//   build/bin/llmt_matmul_bench [--threads 2] [--reps 7] [--tokens 256]
//   (built by the tests' CMake; OpenBLAS's column is there when libopenblas-openmp-dev is installed)
//
// Candidates: OpenBLAS cblas_sgemm (f32); oneDNN's BLAS-like dnnl_sgemm (f32); its matmul primitive in f32, and in bf16 with bf16
// out (forward, dX) or f32 accumulated out (dW), as a bf16 training step uses them. (OpenBLAS's
// cblas_sbgemm is declared by Debian's headers but not built into its library: no bf16 there.) Each shape: 2 warm-up calls, the median of --reps timed calls,
// checked at a few points against a double dot product first.
#ifdef LLMT_BENCH_OPENBLAS
#include <cblas.h>
#endif
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace {

struct Shape {
  const char* name;
  int64_t M, N, K;
  bool ta, tb, accumulate;
  int per_step;
};

std::vector<Shape> step_shapes(int64_t tok) {
  const int64_t C = 768, V = 50257;
  struct Mat { const char* name; int64_t out, in; int per_step; };
  const Mat mats[] = {{"qkv", 3 * C, C, 12}, {"attn-proj", C, C, 12}, {"fc", 4 * C, C, 12},
                      {"fc-proj", C, 4 * C, 12}, {"lm-head", V, C, 1}};
  std::vector<Shape> s;
  for (const Mat& m : mats) {
    s.push_back({m.name, tok, m.out, m.in, false, true, false, m.per_step});   // forward: x W^T
    s.push_back({m.name, tok, m.in, m.out, false, false, false, m.per_step});  // dX = dY W
    s.push_back({m.name, m.out, m.in, tok, true, false, true, m.per_step});    // dW += dY^T X
  }
  return s;
}
const char* pass_of(const Shape& s) { return s.accumulate ? "dW" : s.tb ? "fwd" : "dX"; }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double time_ms(const std::function<void()>& f, int reps) {
  for (int i = 0; i < 2; i++) f();
  std::vector<double> t;
  for (int i = 0; i < reps; i++) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(t);
}

// out[M,N] = op(a) op(b) in double at a few points, for a sanity check of every library.
double check(const Shape& s, const std::vector<float>& a, const std::vector<float>& b, const std::function<float(int64_t)>& got,
             const std::vector<float>& before) {
  double worst = 0.0;
  for (int p = 0; p < 5; p++) {
    int64_t i = (p * 7919) % s.M, j = (p * 104729) % s.N;
    double want = s.accumulate ? before[(size_t)(i * s.N + j)] : 0.0, scale = 0.0;
    for (int64_t k = 0; k < s.K; k++) {
      double x = s.ta ? a[(size_t)(k * s.M + i)] : a[(size_t)(i * s.K + k)];
      double y = s.tb ? b[(size_t)(j * s.K + k)] : b[(size_t)(k * s.N + j)];
      want += x * y;
      scale += std::fabs(x * y);
    }
    worst = std::max(worst, std::fabs(got(i * s.N + j) - want) / scale);
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 7;
  int64_t tokens = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoll(argv[i + 1]);
  }
  omp_set_num_threads(threads);
#ifdef LLMT_BENCH_OPENBLAS
  openblas_set_num_threads(threads);
  const char* openblas = openblas_get_config();
#else
  const char* openblas = "OpenBLAS not built in";
#endif
  const dnnl_version_t* dv = dnnl_version();
  std::printf("# %s; oneDNN %d.%d.%d (cpu isa hint %s); %d threads; %lld tokens; median of %d\n", openblas,
              dv->major, dv->minor, dv->patch, std::getenv("DNNL_MAX_CPU_ISA") ? std::getenv("DNNL_MAX_CPU_ISA") : "max",
              threads, (long long)tokens, reps);
  std::printf("%-10s %-4s %-18s %8s %8s %8s %8s   (GFLOP/s)\n", "matrix", "pass", "M x N x K", "openblas",
              "dnnl-sgemm", "dnnl-f32", "dnnl-bf16");
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  double total[4] = {0, 0, 0, 0}, flops_total = 0.0;
  for (const Shape& s : step_shapes(tokens)) {
    std::vector<float> a((size_t)(s.M * s.K)), b((size_t)(s.K * s.N)), c((size_t)(s.M * s.N)), before;
    for (auto& x : a) x = d(rng);
    for (auto& x : b) x = d(rng);
    for (auto& x : c) x = d(rng);
    before = c;
    std::vector<uint16_t> a16(a.size()), b16(b.size()), c16(c.size());
    for (size_t i = 0; i < a.size(); i++) a16[i] = llmt::f32_to_bf16(a[i]), a[i] = llmt::bf16_to_f32(a16[i]);
    for (size_t i = 0; i < b.size(); i++) b16[i] = llmt::f32_to_bf16(b[i]), b[i] = llmt::bf16_to_f32(b16[i]);
    const float beta = s.accumulate ? 1.f : 0.f;
    double ms[4], err[4];

    // OpenBLAS f32; with beta = 1 the output keeps accumulating over the repetitions, which costs the same
#ifdef LLMT_BENCH_OPENBLAS
    const int lda = s.ta ? (int)s.M : (int)s.K, ldb = s.tb ? (int)s.K : (int)s.N;
    const auto ta = s.ta ? CblasTrans : CblasNoTrans, tb = s.tb ? CblasTrans : CblasNoTrans;
    c = before;
    cblas_sgemm(CblasRowMajor, ta, tb, (int)s.M, (int)s.N, (int)s.K, 1.f, a.data(), lda, b.data(), ldb, beta, c.data(),
                (int)s.N);
    err[0] = check(s, a, b, [&](int64_t i) { return c[(size_t)i]; }, before);
    ms[0] = time_ms([&] { cblas_sgemm(CblasRowMajor, ta, tb, (int)s.M, (int)s.N, (int)s.K, 1.f, a.data(), lda, b.data(),
                                      ldb, beta, c.data(), (int)s.N); }, reps);
#else
    err[0] = 0.0, ms[0] = NAN;
#endif
    // oneDNN's BLAS-like sgemm (row-major)
    auto dnnl_gemm = [&] {
      dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K, 1.f, a.data(), s.ta ? s.M : s.K, b.data(),
                 s.tb ? s.K : s.N, beta, c.data(), s.N);
    };
    c = before;
    dnnl_gemm();
    err[3] = check(s, a, b, [&](int64_t i) { return c[(size_t)i]; }, before);
    ms[3] = time_ms(dnnl_gemm, reps);

    // oneDNN matmul primitive: transposes are strides; accumulation is a sum post-op
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    auto run_dnnl = [&](dt in_t, dt out_t, void* ap, void* bp, void* cp) {
      dnnl::memory::desc ad({s.M, s.K}, in_t, s.ta ? tag::ba : tag::ab), bd({s.K, s.N}, in_t, s.tb ? tag::ba : tag::ab),
          cd({s.M, s.N}, out_t, tag::ab);
      dnnl::primitive_attr attr;
      if (s.accumulate) {
        dnnl::post_ops po;
        po.append_sum(1.f);
        attr.set_post_ops(po);
      }
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), attr, eng);
      dnnl::matmul mm(pd);
      dnnl::memory am(ad, eng, ap), bm(bd, eng, bp), cm(cd, eng, cp);
      auto go = [=]() mutable {
        mm.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
        strm.wait();
      };
      return std::make_pair(go, std::string(pd.impl_info_str()));
    };
    c = before;
    auto f32 = run_dnnl(dt::f32, dt::f32, a.data(), b.data(), c.data());
    f32.first();
    err[1] = check(s, a, b, [&](int64_t i) { return c[(size_t)i]; }, before);
    ms[1] = time_ms(f32.first, reps);
    std::string impl;
    if (s.accumulate) {  // dW: bf16 inputs, f32 gradient accumulated
      c = before;
      auto bf = run_dnnl(dt::bf16, dt::f32, a16.data(), b16.data(), c.data());
      bf.first();
      err[2] = check(s, a, b, [&](int64_t i) { return c[(size_t)i]; }, before);
      ms[2] = time_ms(bf.first, reps);
      impl = bf.second;
    } else {  // forward and dX: bf16 out
      auto bf = run_dnnl(dt::bf16, dt::bf16, a16.data(), b16.data(), c16.data());
      bf.first();
      std::vector<float> zero(c.size(), 0.f);
      err[2] = check(s, a, b, [&](int64_t i) { return llmt::bf16_to_f32(c16[(size_t)i]); }, zero);
      ms[2] = time_ms(bf.first, reps);
      impl = bf.second;
    }
    double flops = 2.0 * s.M * s.N * s.K;
    std::printf("%-10s %-4s %5lldx%5lldx%5lld %8.0f %8.0f %8.0f %8.0f   err %.1e %.1e %.1e %.1e  [%s]\n", s.name,
                pass_of(s), (long long)s.M, (long long)s.N, (long long)s.K, flops / ms[0] / 1e6, flops / ms[3] / 1e6,
                flops / ms[1] / 1e6, flops / ms[2] / 1e6, err[0], err[3], err[1], err[2], impl.c_str());
    for (int k = 0; k < 4; k++) total[k] += s.per_step * ms[k];
    flops_total += s.per_step * flops;
  }
  std::printf("step (%.1f GFLOP): openblas %.0f ms, dnnl-sgemm %.0f ms, dnnl-f32 %.0f ms, dnnl-bf16 %.0f ms\n",
              flops_total / 1e9, total[0], total[3], total[1], total[2]);
  return 0;
}
