// The CPU backend: matmuls through oneDNN (fp32: dnnl_sgemm and the matmul primitive; bf16 with
// fp32 accumulation: the matmul primitive, with AVX512-BF16 and AMX code where the CPU has them, or
// the operands widened to fp32 where that is faster, per shape class: bf16_matmul_choice.h),
// OpenMP across rows, heads or channels elsewhere. Every op follows the contract written in engine/backend/backend.h.
// Work is split so that no two threads write the same element: results do not depend on timing,
// only on the thread count (which fixes how partial sums are grouped), the CPU's instruction set
// (which fixes oneDNN's kernels) and, in bf16, the kernel chosen per matmul shape class (timed once
// per CPU model, library and thread count, then read from its cache file).
#include "kernels/cpu/cpu_backend.h"

#include <unistd.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <set>
#include <tuple>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/log.h"
#include "kernels/cpu/bf16_matmul_choice.h"
#include "kernels/cpu/cpu_moe.h"

namespace llmt {

namespace {

const float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

// ---- element access: arithmetic in fp32, bf16 widened on load and rounded once on store ----
inline float ld(const float* p, int64_t i) { return p[i]; }
inline float ld(const uint16_t* p, int64_t i) { return bf16_to_f32(p[i]); }
inline void st(float* p, int64_t i, float v) { p[i] = v; }
inline void st(uint16_t* p, int64_t i, float v) { p[i] = f32_to_bf16(v); }

// exp(x) in a form loops vectorize (std::exp is a scalar library call): x = n ln2 + r with
// |r| <= ln2 / 2, e^r by Cephes' degree-6 polynomial, 2^n built in the exponent bits. Within 2 ulp
// of expf for x in [-87, 88]; outside, x is clamped there (e^-87 = 1.6e-38 stands in for 0 and
// underflows nothing that matters; e^88 = 1.7e38); NaN stays NaN.
inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer held in the low bits
  float t = x * 1.44269504088896341f + shifter;
  float n = t - shifter;
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // ln2 split in two (Cody and Waite)
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  uint32_t ti, bits;
  std::memcpy(&ti, &t, 4);
  bits = (ti - 0x4B400000u + 127u) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}
// tanh through exp: 1 - 2 / (e^2x + 1); absolute error ~1e-7 (relative error grows near 0, where
// GELU adds 1 to it)
inline float tanh_approx(float x) { return 1.0f - 2.0f / (exp_approx(2.0f * x) + 1.0f); }

// Calls f with a value of the element type that stores `t` (float for f32, uint16_t for bf16).
template <class F>
void by_dtype(DType t, const char* op, F&& f) {
  if (t == DType::f32) f(float{});
  else if (t == DType::bf16) f(uint16_t{});
  else fail("cpu %s: %s tensors are not supported", op, dtype_name(t));
}

// Everything has run when the host gets here; the wait is counted all the same (host_syncs counts
// the places a program waits, the same on every backend).
struct CpuEvent : Event {
  explicit CpuEvent(int64_t& host_syncs) : host_syncs_(host_syncs) {}
  void synchronize() override { host_syncs_++; }
  int64_t& host_syncs_;
};

class CpuBackend : public Backend {
 public:
  CpuBackend(int threads, DType compute) : compute_(compute), engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
    LLMT_CHECK(compute == DType::f32 || compute == DType::bf16, "cpu backend: compute dtype must be f32 or bf16, got %s",
               dtype_name(compute));
    // More threads than CPUs only slows OpenMP down, and a huge count crashes libgomp (100000: SIGSEGV).
    const int cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    LLMT_CHECK(threads <= cpus, "--threads %d: this node has %d CPUs; give at most %d (0: the node's cores shared by "
               "its ranks)", threads, cpus, cpus);
    nthreads_ = threads > 0 ? threads : omp_get_max_threads();
    if (compute == DType::bf16) start_bf16_matmul_choice();
  }
  std::string name() const override { return "cpu"; }
  int threads() const override { return nthreads_; }
  DType compute_dtype() const override { return compute_; }
  bool is_host_memory() const override { return true; }
  void* native_stream() override { return nullptr; }
  std::unique_ptr<Event> make_event() override { return std::make_unique<CpuEvent>(counters_.host_syncs); }
  void record(Event&) override {}
  void wait(Event&) override {}

  // ---- memory ----
  void* alloc(size_t bytes) override {
    counters_.allocs++;
    size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    LLMT_CHECK(p != nullptr, "cpu backend: out of memory allocating %zu bytes", bytes);
    std::memset(p, 0, rounded);
    return p;
  }
  void release(void* p) override { std::free(p); }
  void zero_impl(void* p, size_t bytes) override {
    chunked(bytes, [&](size_t at, size_t n) { std::memset((char*)p + at, 0, n); });
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    counters_.host_syncs++;
    std::memcpy(dst, src, bytes);
  }
  void copy_impl(void* dst, const void* src, size_t bytes) override {
    const char *s = (const char*)src, *d = (const char*)dst;
    if (d + bytes <= s || s + bytes <= d)  // no overlap: the threads' pieces are independent
      chunked(bytes, [&](size_t at, size_t n) { std::memcpy((char*)dst + at, s + at, n); });
    else
      std::memmove(dst, src, bytes);
  }
  void synchronize() override { counters_.host_syncs++; }
  BackendCounters counters() const override {
    BackendCounters c = counters_;
    c.launches = c.ops;  // each op is one parallel region (or one oneDNN call)
    return c;
  }

  // ---- dense ----
  void matmul_impl(Tensor out, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N, int64_t K, bool trans_a,
                   bool trans_b, bool accumulate, int64_t ld_a, int64_t ld_out) override {
    const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
    if (ld_a != a_cols || ld_out != N) {  // strided (the CPU pads no logits: tests only): dense copies around it
      std::vector<char> da((size_t)(a_rows * a_cols) * dtype_size(a.dtype)), dout((size_t)(M * N) * dtype_size(out.dtype));
      copy_rows(da.data(), a_cols, a.data, ld_a, a_rows, a_cols, dtype_size(a.dtype));
      if (accumulate) copy_rows(dout.data(), N, out.data, ld_out, M, N, dtype_size(out.dtype));
      matmul_impl(Tensor(dout.data(), out.dtype, {M, N}), Tensor(da.data(), a.dtype, {a_rows, a_cols}), b, bias, M, N,
                  K, trans_a, trans_b, accumulate, a_cols, N);
      copy_rows(out.data, ld_out, dout.data(), N, M, N, dtype_size(out.dtype));
      return;
    }
    if (a.dtype == DType::bf16 && bf16_kernel({M, N, K, trans_a, trans_b, accumulate, out.dtype}) == Bf16Kernel::fp32)
      return matmul_widened(out, a, b, bias, M, N, K, trans_a, trans_b, accumulate);
    matmul_native(out, a, b, bias, M, N, K, trans_a, trans_b, accumulate);
  }
  // rows x cols elements of `size` bytes from src (row stride src_ld) to dst (row stride dst_ld)
  static void copy_rows(void* dst, int64_t dst_ld, const void* src, int64_t src_ld, int64_t rows, int64_t cols,
                        size_t size) {
    for (int64_t r = 0; r < rows; r++)
      std::memcpy((char*)dst + (size_t)(r * dst_ld) * size, (const char*)src + (size_t)(r * src_ld) * size,
                  (size_t)cols * size);
  }
  // a and b of one dtype (bf16 with the bf16 primitive), out of theirs or f32
  void matmul_native(Tensor out, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N, int64_t K, bool trans_a,
                     bool trans_b, bool accumulate) {
    // fp32: oneDNN's BLAS-like sgemm, except a x b^T (the forward's shape), where its matmul primitive
    // is as fast or faster; on a GPT-2 step's shapes this pair beats either alone by 15%
    // (docs/performance.md). LoRA's rank-r products, measured apart (docs/performance.md, "LoRA"):
    // a x b^T with a thin K into a wide out (h B^T, K = r) is sgemm's, a x b with a thin N from a
    // wide K (dy B, N = r) the primitive's. Same arithmetic either way: fp32 products, fp32 sums.
    const bool thin_k_wide_n = K <= 64 && N >= 2048, thin_n_wide_k = !trans_a && !trans_b && N <= 64 && K >= 2048;
    if (a.dtype == DType::f32 && out.dtype == DType::f32 && (trans_a || !trans_b || thin_k_wide_n) && !thin_n_wide_k) {
      float* o = (float*)out.data;
      float beta = accumulate ? 1.0f : 0.0f;
      if (bias.data) {  // out (=|+=) bias broadcast over rows, then the product added on top
        const float* bb = (const float*)bias.data;
#pragma omp parallel for num_threads(nthreads_)
        for (int64_t i = 0; i < M; i++)
          for (int64_t j = 0; j < N; j++) o[i * N + j] = (accumulate ? o[i * N + j] : 0.0f) + bb[j];
        beta = 1.0f;
      }
      omp_set_num_threads(nthreads_);
      dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, 1.0f, (const float*)a.data,
                                    trans_a ? M : K, (const float*)b.data, trans_b ? K : N, beta, o, N);
      LLMT_CHECK(st == dnnl_success, "cpu matmul: dnnl_sgemm failed (%d) for %lld x %lld x %lld", (int)st,
                 (long long)M, (long long)N, (long long)K);
      return;
    }
    MatmulKey key{M, N, K, trans_a, trans_b, accumulate, bias.data != nullptr, a.dtype, out.dtype};
    auto it = matmuls_.find(key);
    if (it == matmuls_.end()) it = matmuls_.emplace(key, make_matmul(key)).first;
    Matmul& m = it->second;
    omp_set_num_threads(nthreads_);  // oneDNN's OpenMP runtime uses the calling thread's setting
    std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, dnnl::memory(m.a, engine_, a.data)},
                                                  {DNNL_ARG_WEIGHTS, dnnl::memory(m.b, engine_, b.data)},
                                                  {DNNL_ARG_DST, dnnl::memory(m.out, engine_, out.data)}};
    if (bias.data) args[DNNL_ARG_BIAS] = dnnl::memory(m.bias, engine_, bias.data);
    m.prim.execute(stream_, args);
    stream_.wait();
  }
  // bf16 a, b (and bias) widened to fp32, the fp32 matmul, a bf16 out rounded once: the bf16
  // primitive's arithmetic (exact products, fp32 sums), in another order. An operand inside parameters
  // a store holds (a weight) is widened once, at its first use, and its copy kept until they are
  // released: widened again at every use (forward, backward, recompute, each micro-batch), GPT-2's
  // weights made --bf16 slower than fp32 on a CPU without bf16 instructions.
  void matmul_widened(Tensor out, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N, int64_t K, bool trans_a,
                      bool trans_b, bool accumulate) {
    const bool round_out = out.dtype == DType::bf16;
    struct Widen {
      const uint16_t* src;
      float* dst;
      int64_t n;
    } todo[4];
    int count = 0;
    // t's fp32 copy: a held weight's own (to be made when new), else this call's scratch
    auto place = [&](const Tensor& t, int64_t n, std::vector<float>& scratch) -> float* {
      if (!t.data) return nullptr;
      bool made = false;
      float* w = held_copy(t.data, n, &made);
      if (!w) {
        scratch.resize((size_t)n);
        w = scratch.data();
        made = true;
      }
      if (made) todo[count++] = {(const uint16_t*)t.data, w, n};
      return w;
    };
    float* wa = place(a, M * K, wa_);
    float* wb = place(b, K * N, wb_);
    float* wbias = place(bias, N, wbias_);
    float* wout = nullptr;
    if (round_out) {
      wout_.resize((size_t)(M * N));
      wout = wout_.data();
      if (accumulate) todo[count++] = {(const uint16_t*)out.data, wout, M * N};
    }
    // every conversion in one parallel region: a region's start and end cost more than a small one
#pragma omp parallel num_threads(nthreads_) if (count > 0)
    for (int k = 0; k < count; k++) {
#pragma omp for nowait
      for (int64_t i = 0; i < todo[k].n; i++) todo[k].dst[i] = bf16_to_f32(todo[k].src[i]);
    }
    Tensor ta(wa, DType::f32, {M * K}), tb(wb, DType::f32, {K * N});
    Tensor tbias = wbias ? Tensor(wbias, DType::f32, {N}) : Tensor();
    if (!round_out) return matmul_native(out, ta, tb, tbias, M, N, K, trans_a, trans_b, accumulate);
    Tensor tout(wout, DType::f32, {M * N});
    matmul_native(tout, ta, tb, tbias, M, N, K, trans_a, trans_b, accumulate);
    convert_impl(out, tout, M * N);
  }
  // Parameters a store holds (params_held .. params_released), bf16 only, with an fp32 mirror of
  // them: the widened copy of each tensor a matmul has read, made at its first use (`made`, by
  // address and length). AdamW writing into held parameters writes the mirror too, so a weight is
  // widened once for as long as it is held, optimizer steps included. A released mirror's memory
  // is kept for the next region of its size: fresh pages every step cost more than the widening.
  struct HeldParams {
    const char* begin = nullptr;
    size_t bytes = 0;
    std::unique_ptr<float[]> mirror;  // bytes / 2 floats, made at the first widened use
    std::set<std::pair<const void*, int64_t>> made;
  };
  void params_held(const Tensor& params) override {
    if (params.dtype == DType::bf16 && params.data) held_.push_back({(const char*)params.data, params.nbytes(), {}, {}});
  }
  void params_released(const void* data) override {
    for (size_t i = 0; i < held_.size(); i++) {
      if (held_[i].begin != data) continue;
      if (held_[i].mirror) spare_.emplace(held_[i].bytes, std::move(held_[i].mirror));
      held_.erase(held_.begin() + (long)i);
      return;
    }
  }
  HeldParams* held_region(const void* p, int64_t n) {
    const char* c = (const char*)p;
    for (HeldParams& h : held_)
      if (c >= h.begin && c + 2 * n <= h.begin + h.bytes) return &h;
    return nullptr;
  }
  // The fp32 copy of the n bf16 values at p when they lie inside held parameters (*made: new, to be
  // filled by the caller), else nullptr.
  float* held_copy(const void* p, int64_t n, bool* made) {
    HeldParams* h = held_region(p, n);
    if (!h) return nullptr;
    if (!h->mirror) {
      auto spare = spare_.find(h->bytes);
      if (spare == spare_.end()) {
        h->mirror.reset(new float[h->bytes / 2]);
      } else {
        h->mirror = std::move(spare->second);
        spare_.erase(spare);
      }
    }
    *made = h->made.insert({p, n}).second;
    return h->mirror.get() + ((const char*)p - h->begin) / 2;
  }
  // Where AdamW writes n bf16 values at pc: the held mirror's floats to write beside them, or nullptr
  float* held_mirror_for(const uint16_t* pc, int64_t n) {
    HeldParams* h = held_region(pc, n);
    return h && h->mirror ? h->mirror.get() + ((const char*)pc - h->begin) / 2 : nullptr;
  }
  // The kernel for a bf16 matmul (kernels/cpu/bf16_matmul_choice.h): timed per shape class on
  // first sight, or cached, or forced; fp32 where oneDNN has no bf16 kernel for this CPU.
  void start_bf16_matmul_choice() {
    clear_cpu_bf16_matmul_choices();
    has_bf16_kernel_ = true;
    try {
      using dt = dnnl::memory::data_type;
      dnnl::memory::desc x({16, 16}, dt::bf16, dnnl::memory::format_tag::ab);
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(x, x, x), engine_);
    } catch (const dnnl::error&) {
      has_bf16_kernel_ = false;  // oneDNN 2.x needs AVX-512 for bf16
      log_warn("cpu backend: oneDNN has no bf16 matmul on this CPU; bf16 matmuls run in fp32 on widened operands "
               "(same results, no bf16 speed-up)");
    }
    const std::string key = strformat("%s | %s | %d threads", cpu_identity().c_str(), cpu_library_version().c_str(),
                                      nthreads_);
    const std::string mode = bf16_matmul_mode_from_env();  // checked even where it cannot apply
    bf16_choice_ = has_bf16_kernel_ ? std::make_unique<Bf16MatmulChoice>(mode, default_matmul_cache_dir(), key)
                                    : std::make_unique<Bf16MatmulChoice>("fp32", "", key, "oneDNN has no bf16 matmul on "
                                                                         "this CPU");
  }
  Bf16Kernel bf16_kernel(const MatmulShape& s) {
    return bf16_choice_->pick(s, [&](Bf16Kernel k, Tensor o, Tensor x, Tensor y, const MatmulShape& p) {
      if (k == Bf16Kernel::bf16) matmul_native(o, x, y, Tensor(), p.M, p.N, p.K, p.trans_a, p.trans_b, p.accumulate);
      else matmul_widened(o, x, y, Tensor(), p.M, p.N, p.K, p.trans_a, p.trans_b, p.accumulate);
    });
  }

  // residual copied into out, then the matmul accumulated onto it: one rounding of the sum
  void matmul_residual_impl(Tensor out, Tensor residual, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N,
                            int64_t K) override {
    copy_impl(out.data, residual.data, (size_t)(M * N) * dtype_size(out.dtype));
    matmul_impl(out, a, b, bias, M, N, K, false, true, true, K, N);
  }
  // The matmul and GELU one after the other: the same arithmetic as the two ops called apart.
  void matmul_gelu_impl(Tensor out, Tensor pre, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N,
                        int64_t K) override {
    matmul_impl(pre, a, b, bias, M, N, K, false, true, false, K, N);
    gelu_forward_impl(out, pre, M * N);
  }
  void matmul_dgelu_impl(Tensor dpre, Tensor dout, Tensor b, Tensor pre, int64_t M, int64_t N, int64_t K) override {
    matmul_impl(dpre, dout, b, Tensor(), M, N, K, false, false, false, K, N);
    gelu_backward_impl(dpre, pre, dpre, M * N);
  }
  void bias_backward_impl(Tensor dbias, Tensor dout, int64_t M, int64_t N) override {
    float* db = dbias.f32();
    by_dtype(dout.dtype, "bias_backward", [&](auto tag) {
      using A = decltype(tag);
      const A* d = (const A*)dout.data;
      // Each thread owns a block of columns and walks every row.
#pragma omp parallel num_threads(nthreads_)
      {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int64_t per = (N + nt - 1) / nt, j0 = std::min<int64_t>(N, id * per), j1 = std::min<int64_t>(N, j0 + per);
        for (int64_t i = 0; i < M; i++)
          for (int64_t j = j0; j < j1; j++) db[j] += ld(d, i * N + j);
      }
    });
  }

  // ---- embeddings ----
  void embedding_forward_impl(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int B, int T, int C, int V) override {
    const int32_t* tok = tokens.i32();
    for (int64_t i = 0; i < (int64_t)B * T; i++)
      LLMT_CHECK(tok[i] >= 0 && tok[i] < V, "embedding: token id %d at position %lld is outside the vocabulary [0, %d)",
                 tok[i], (long long)i, V);
    by_dtype(out.dtype, "embedding_forward", [&](auto tag) {
      using A = decltype(tag);
      A* o = (A*)out.data;
      const A* te = (const A*)wte.data;
      const A* pe = wpe.data ? (const A*)wpe.data : nullptr;
#pragma omp parallel for num_threads(nthreads_)
      for (int64_t i = 0; i < (int64_t)B * T; i++) {
        const int64_t e = (int64_t)tok[i] * C, p = (i % T) * C;
        for (int c = 0; c < C; c++) st(o, i * C + c, ld(te, e + c) + (pe ? ld(pe, p + c) : 0.0f));
      }
    });
  }

  void embedding_backward_impl(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int B, int T, int C) override {
    float* dte = dwte.f32();
    float* dpe = dwpe.data ? dwpe.f32() : nullptr;
    const int32_t* tok = tokens.i32();
    for (int64_t i = 0; i < (int64_t)B * T; i++)  // before anything is written
      LLMT_CHECK(tok[i] >= 0 && tok[i] < dwte.shape[0],
                 "embedding: token id %d at position %lld is outside the vocabulary [0, %lld)", tok[i], (long long)i,
                 (long long)dwte.shape[0]);
    by_dtype(dout.dtype, "embedding_backward", [&](auto tag) {
      using A = decltype(tag);
      const A* d = (const A*)dout.data;
      // Split over channels: two tokens with the same id never race.
#pragma omp parallel num_threads(nthreads_)
      {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int per = (C + nt - 1) / nt, c0 = std::min(C, id * per), c1 = std::min(C, c0 + per);
        for (int64_t i = 0; i < (int64_t)B * T; i++) {
          float* e = dte + (int64_t)tok[i] * C;
          for (int c = c0; c < c1; c++) e[c] += ld(d, i * C + c);
          if (dpe) {
            float* p = dpe + (i % T) * C;
            for (int c = c0; c < c1; c++) p[c] += ld(d, i * C + c);
          }
        }
      }
    });
  }

  // ---- norms ----
  void layernorm_forward_impl(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b, int64_t N, int C,
                              float eps) override {
    float* mu = mean.f32();
    float* rs = rstd.f32();
    by_dtype(x.dtype, "layernorm_forward", [&](auto tag) {
      using A = decltype(tag);
      A* o = (A*)out.data;
      const A *X = (const A*)x.data, *W = (const A*)w.data, *Bb = (const A*)b.data;
#pragma omp parallel num_threads(nthreads_)
      {
        std::vector<float> xf((size_t)C);
#pragma omp for
        for (int64_t i = 0; i < N; i++) {
          float m = 0.0f;
          float* __restrict xx = xf.data();
#pragma omp simd reduction(+ : m)
          for (int c = 0; c < C; c++) m += (xx[c] = ld(X, i * C + c));
          m /= C;
          float var = 0.0f;
#pragma omp simd reduction(+ : var)
          for (int c = 0; c < C; c++) var += (xx[c] - m) * (xx[c] - m);
          var /= C;
          float r = 1.0f / std::sqrt(var + eps);
          for (int c = 0; c < C; c++) st(o, i * C + c, (xf[c] - m) * r * ld(W, c) + ld(Bb, c));
          mu[i] = m;
          rs[i] = r;
        }
      }
    });
  }

  void layernorm_backward_impl(Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w, Tensor mean,
                               Tensor rstd, int64_t N, int C) override {
    float* DW = dw.f32();
    float* DB = db.f32();
    const float* mu = mean.f32();
    const float* rs = rstd.f32();
    // Weight and bias gradients: per-thread partial sums over rows, reduced in thread order.
    std::vector<float> partial((size_t)nthreads_ * 2 * C, 0.0f);
    by_dtype(x.dtype, "layernorm_backward", [&](auto tag) {
      using A = decltype(tag);
      A* DX = (A*)dx.data;
      const A *D = (const A*)dout.data, *X = (const A*)x.data, *W = (const A*)w.data;
#pragma omp parallel num_threads(nthreads_)
      {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        float* pw = partial.data() + (size_t)id * 2 * C;
        float* pb = pw + C;
        std::vector<float> nf((size_t)C), df((size_t)C);
        int64_t per = (N + nt - 1) / nt, i0 = std::min<int64_t>(N, id * per), i1 = std::min<int64_t>(N, i0 + per);
        for (int64_t i = i0; i < i1; i++) {
          float m = mu[i], r = rs[i];
          float mean_dn = 0.0f, mean_dn_n = 0.0f;  // means of dnorm and dnorm * norm over the row
#pragma omp simd reduction(+ : mean_dn, mean_dn_n)
          for (int c = 0; c < C; c++) {
            float n = nf[c] = (ld(X, i * C + c) - m) * r;
            float di = df[c] = ld(D, i * C + c);
            float dn = di * ld(W, c);
            mean_dn += dn;
            mean_dn_n += dn * n;
            pw[c] += di * n;
            pb[c] += di;
          }
          mean_dn /= C;
          mean_dn_n /= C;
          for (int c = 0; c < C; c++)
            st(DX, i * C + c, ld(DX, i * C + c) + (df[c] * ld(W, c) - mean_dn - nf[c] * mean_dn_n) * r);
        }
      }
    });
    for (int t = 0; t < nthreads_; t++) {
      const float* pw = partial.data() + (size_t)t * 2 * C;
      for (int c = 0; c < C; c++) {
        DW[c] += pw[c];
        DB[c] += pw[C + c];
      }
    }
  }

  void rmsnorm_forward_impl(Tensor out, Tensor rstd, Tensor x, Tensor w, int64_t N, int C, float eps,
                            float w_offset) override {
    float* rs = rstd.f32();
    by_dtype(x.dtype, "rmsnorm_forward", [&](auto tag) {
      using A = decltype(tag);
      A* o = (A*)out.data;
      const A *X = (const A*)x.data, *W = (const A*)w.data;
#pragma omp parallel for num_threads(nthreads_)
      for (int64_t i = 0; i < N; i++) {
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++) {
          float v = ld(X, i * C + c);
          ss += v * v;
        }
        float r = 1.0f / std::sqrt(ss / C + eps);
        for (int c = 0; c < C; c++) st(o, i * C + c, ld(X, i * C + c) * r * (w_offset + ld(W, c)));
        rs[i] = r;
      }
    });
  }

  void rmsnorm_backward_impl(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, int64_t N,
                             int C, float w_offset) override {
    float* DW = dw.f32();
    const float* rs = rstd.f32();
    std::vector<float> partial((size_t)nthreads_ * C, 0.0f);
    by_dtype(x.dtype, "rmsnorm_backward", [&](auto tag) {
      using A = decltype(tag);
      A* DX = (A*)dx.data;
      const A *D = (const A*)dout.data, *X = (const A*)x.data, *W = (const A*)w.data;
#pragma omp parallel num_threads(nthreads_)
      {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        float* pw = partial.data() + (size_t)id * C;
        int64_t per = (N + nt - 1) / nt, i0 = std::min<int64_t>(N, id * per), i1 = std::min<int64_t>(N, i0 + per);
        for (int64_t i = i0; i < i1; i++) {
          float r = rs[i];
          float mean_dn_n = 0.0f;  // mean of dnorm * norm over the row
#pragma omp simd reduction(+ : mean_dn_n)
          for (int c = 0; c < C; c++) {
            float n = ld(X, i * C + c) * r, di = ld(D, i * C + c);
            mean_dn_n += di * (w_offset + ld(W, c)) * n;
            pw[c] += di * n;
          }
          mean_dn_n /= C;
          for (int c = 0; c < C; c++)
            st(DX, i * C + c,
               ld(DX, i * C + c) +
                   (ld(D, i * C + c) * (w_offset + ld(W, c)) - ld(X, i * C + c) * r * mean_dn_n) * r);
        }
      }
    });
    for (int t = 0; t < nthreads_; t++)
      for (int c = 0; c < C; c++) DW[c] += partial[(size_t)t * C + c];
  }

  // Each token's row: NH q heads, then NKV k heads, each normalised over its hs values; the NKV v
  // heads copied.
  void head_rmsnorm_forward_impl(Tensor out, Tensor rstd, Tensor in, Tensor wq, Tensor wk, int64_t N, int NH, int NKV,
                                 int hs, float eps, float w_offset) override {
    float* rs = rstd.f32();
    const int heads = NH + NKV;
    const int64_t row = (int64_t)(NH + 2 * NKV) * hs;
    by_dtype(in.dtype, "head_rmsnorm_forward", [&](auto tag) {
      using A = decltype(tag);
      A* o = (A*)out.data;
      const A *X = (const A*)in.data, *WQ = (const A*)wq.data, *WK = (const A*)wk.data;
#pragma omp parallel for num_threads(nthreads_)
      for (int64_t n = 0; n < N; n++) {
        for (int h = 0; h < heads; h++) {
          const int64_t i0 = n * row + (int64_t)h * hs;
          const A* W = h < NH ? WQ : WK;
          float ss = 0.0f;
          for (int c = 0; c < hs; c++) {
            const float v = ld(X, i0 + c);
            ss += v * v;
          }
          const float r = 1.0f / std::sqrt(ss / hs + eps);
          for (int c = 0; c < hs; c++) st(o, i0 + c, ld(X, i0 + c) * r * (w_offset + ld(W, c)));
          rs[n * heads + h] = r;
        }
        for (int64_t i = n * row + (int64_t)heads * hs; i < (n + 1) * row; i++) o[i] = X[i];
      }
    });
  }

  void head_rmsnorm_backward_impl(Tensor din, Tensor dwq, Tensor dwk, Tensor dout, Tensor in, Tensor wq, Tensor wk,
                                  Tensor rstd, int64_t N, int NH, int NKV, int hs, float w_offset) override {
    const float* rs = rstd.f32();
    const int heads = NH + NKV;
    const int64_t row = (int64_t)(NH + 2 * NKV) * hs;
    // per thread: [dwq | dwk] partial sums, added in thread order (deterministic for a thread count)
    std::vector<float> partial((size_t)nthreads_ * 2 * hs, 0.0f);
    by_dtype(in.dtype, "head_rmsnorm_backward", [&](auto tag) {
      using A = decltype(tag);
      A* DX = (A*)din.data;
      const A *D = (const A*)dout.data, *X = (const A*)in.data, *WQ = (const A*)wq.data, *WK = (const A*)wk.data;
#pragma omp parallel num_threads(nthreads_)
      {
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        float* pw = partial.data() + (size_t)id * 2 * hs;
        const int64_t per = (N + nt - 1) / nt, n0 = std::min<int64_t>(N, id * per), n1 = std::min<int64_t>(N, n0 + per);
        std::vector<float> d((size_t)hs);
        for (int64_t n = n0; n < n1; n++) {
          for (int h = 0; h < heads; h++) {
            const int64_t i0 = n * row + (int64_t)h * hs;
            const A* W = h < NH ? WQ : WK;
            float* pwh = pw + (h < NH ? 0 : hs);
            const float r = rs[n * heads + h];
            float mean_dn_n = 0.0f;  // mean of dnorm * norm over the head
            for (int c = 0; c < hs; c++) {
              const float nv = ld(X, i0 + c) * r;
              d[(size_t)c] = ld(D, i0 + c);  // read before din (which may be dout) is written
              mean_dn_n += d[(size_t)c] * (w_offset + ld(W, c)) * nv;
              pwh[c] += d[(size_t)c] * nv;
            }
            mean_dn_n /= hs;
            for (int c = 0; c < hs; c++)
              st(DX, i0 + c, (d[(size_t)c] * (w_offset + ld(W, c)) - ld(X, i0 + c) * r * mean_dn_n) * r);
          }
          if (DX != D)
            for (int64_t i = n * row + (int64_t)heads * hs; i < (n + 1) * row; i++) DX[i] = D[i];
        }
      }
    });
    float *DWQ = dwq.f32(), *DWK = dwk.f32();
    for (int t = 0; t < nthreads_; t++)
      for (int c = 0; c < hs; c++) {
        DWQ[c] += partial[(size_t)t * 2 * hs + c];
        DWK[c] += partial[(size_t)t * 2 * hs + hs + c];
      }
  }

  // ---- activations ----
  void gelu_forward_impl(Tensor out, Tensor x, int64_t n) override {
    by_dtype(x.dtype, "gelu_forward", [&](auto tag) {
      using A = decltype(tag);
      A* o = (A*)out.data;
      const A* X = (const A*)x.data;
#pragma omp parallel for simd num_threads(nthreads_)
      for (int64_t i = 0; i < n; i++) {
        float v = ld(X, i);
        st(o, i, 0.5f * v * (1.0f + tanh_approx(kGeluScale * (v + 0.044715f * v * v * v))));
      }
    });
  }

  void gelu_backward_impl(Tensor dx, Tensor x, Tensor dout, int64_t n) override {
    by_dtype(x.dtype, "gelu_backward", [&](auto tag) {
      using A = decltype(tag);
      A* DX = (A*)dx.data;
      const A *X = (const A*)x.data, *D = (const A*)dout.data;
#pragma omp parallel for simd num_threads(nthreads_)
      for (int64_t i = 0; i < n; i++) {
        float v = ld(X, i);
        float t = tanh_approx(kGeluScale * (v + 0.044715f * v * v * v));
        float dt = (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
        st(DX, i, ld(D, i) * (0.5f * (1.0f + t) + 0.5f * v * dt));
      }
    });
  }

  // GeGLU's gate activation, the tanh GELU (as gelu_forward_impl), and its derivative
  static float gelu_and_grad(float g, float* dact) {
    const float t = tanh_approx(kGeluScale * (g + 0.044715f * g * g * g));
    *dact = 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * 0.044715f * g * g);
    return 0.5f * g * (1.0f + t);
  }

  void swiglu_forward_impl(Tensor out, Tensor gate_up, int64_t N, int I, GluAct act) override {
    by_dtype(out.dtype, "swiglu_forward", [&](auto tag) {
      using A = decltype(tag);
      A* o = (A*)out.data;
      const A* gu = (const A*)gate_up.data;
#pragma omp parallel for num_threads(nthreads_)
      for (int64_t i = 0; i < N; i++) {
        const int64_t g = i * 2 * I, u = g + I;
        for (int j = 0; j < I; j++) {
          float gj = ld(gu, g + j), da;
          const float a = act == GluAct::silu ? gj / (1.0f + exp_approx(-gj)) : gelu_and_grad(gj, &da);
          st(o, i * I + j, a * ld(gu, u + j));
        }
      }
    });
  }

  void swiglu_backward_impl(Tensor dgate_up, Tensor dout, Tensor gate_up, int64_t N, int I, GluAct act) override {
    by_dtype(dout.dtype, "swiglu_backward", [&](auto tag) {
      using A = decltype(tag);
      A* dgu = (A*)dgate_up.data;
      const A *D = (const A*)dout.data, *gu = (const A*)gate_up.data;
#pragma omp parallel for num_threads(nthreads_)
      for (int64_t i = 0; i < N; i++) {
        const int64_t g = i * 2 * I, u = g + I;
        for (int j = 0; j < I; j++) {
          float gj = ld(gu, g + j), uj = ld(gu, u + j), dj = ld(D, i * I + j);
          if (act == GluAct::gelu_tanh) {
            float da;
            const float a = gelu_and_grad(gj, &da);
            st(dgu, u + j, dj * a);
            st(dgu, g + j, dj * uj * da);
            continue;
          }
          float s = 1.0f / (1.0f + exp_approx(-gj));
          st(dgu, u + j, dj * gj * s);
          st(dgu, g + j, dj * uj * s * (1.0f + gj * (1.0f - s)));
        }
      }
    });
  }

  void dropout_impl(Tensor x, int B, int T, int C, const Dropout& d) override {
    if (!d.active()) return;
    const float keep_scale = 1.0f / (1.0f - d.p);
    // dropout_keep's test as one integer compare (the bits are integers, so bits >= p 2^24 exactly
    // when bits >= ceil(p 2^24)), which lets the row's hashes vectorise
    const uint32_t threshold = (uint32_t)std::ceil((double)d.p * 16777216.0);
    by_dtype(x.dtype, "dropout", [&](auto tag) {
      using A = decltype(tag);
      A* X = (A*)x.data;
#pragma omp parallel for num_threads(nthreads_)
      for (int64_t i = 0; i < (int64_t)B * T; i++) {
        const int64_t row = dropout_row(d.row0 + i / T, (int)(i % T));
        A* xr = X + i * C;
#pragma omp simd
        for (int c = 0; c < C; c++)
          st(xr, c, dropout_bits(d.key, row, c) >= threshold ? ld(xr, c) * keep_scale : 0.0f);
      }
    });
  }

  // ---- attention ----
  // cos/sin of pos * inv_freq[i] for pos < T, i < d/2 (d the rotated channels), computed in fp32 the
  // way transformers does, times the attention factor (longrope; 1 otherwise).
  static void rope_table(std::vector<float>& cs, std::vector<float>& sn, int T, int hs, const RopeSpec& rope) {
    int half = rope_dim(rope, hs) / 2;
    cs.resize((size_t)T * half);
    sn.resize((size_t)T * half);
    for (int i = 0; i < half; i++) {
      const float inv_freq = rope_inv_freq(rope, i, hs);
      for (int t = 0; t < T; t++) {
        float angle = (float)t * inv_freq;
        cs[(size_t)t * half + i] = (float)std::cos((double)angle) * rope.attention_factor;
        sn[(size_t)t * half + i] = (float)std::sin((double)angle) * rope.attention_factor;
      }
    }
  }

  // Rotates the q and k heads of each of N rows by +angle (forward) or -angle (backward); row i is at
  // position pos[i], or i % T without pos (B sequences of T tokens). Channels past rope_dim are kept.
  void rope_apply(Tensor qkv, int64_t N, int T, const int32_t* pos, int NH, int NKV, int hs, const RopeSpec& rope,
                  float sign) {
    if (pos) {  // the table covers every position asked for
      T = 0;
      for (int64_t i = 0; i < N; i++) {
        LLMT_CHECK(pos[i] >= 0, "cpu rope: row %lld has position %d, expected >= 0", (long long)i, pos[i]);
        T = std::max(T, pos[i] + 1);
      }
    }
    std::vector<float> cs, sn;
    rope_table(cs, sn, T, hs, rope);
    const int half = rope_dim(rope, hs) / 2;
    const int64_t row = (int64_t)(NH + 2 * NKV) * hs;
    by_dtype(qkv.dtype, "rope", [&](auto tag) {
      using A = decltype(tag);
      A* X = (A*)qkv.data;
#pragma omp parallel for num_threads(nthreads_)
      for (int64_t i = 0; i < N; i++) {
        const int t = pos ? pos[i] : (int)(i % T);
        const float* c = cs.data() + (size_t)t * half;
        const float* s = sn.data() + (size_t)t * half;
        for (int h = 0; h < NH + NKV; h++) {  // q heads then k heads, contiguous in the row
          const int64_t x = i * row + (int64_t)h * hs;
          for (int j = 0; j < half; j++) {
            float x1 = ld(X, x + j), x2 = ld(X, x + j + half), sj = sign * s[j];
            st(X, x + j, x1 * c[j] - x2 * sj);
            st(X, x + j + half, x2 * c[j] + x1 * sj);
          }
        }
      }
    });
  }
  void rope_forward_impl(Tensor qkv, int B, int T, int NH, int NKV, int hs, const RopeSpec& rope,
                         Tensor positions) override {
    rope_apply(qkv, (int64_t)B * T, T, positions.data ? positions.i32() : nullptr, NH, NKV, hs, rope, 1.0f);
  }
  void rope_backward_impl(Tensor dqkv, int B, int T, int NH, int NKV, int hs, const RopeSpec& rope,
                          Tensor positions) override {
    // the map's transpose: the rotation by -angle, times the same attention factor
    rope_apply(dqkv, (int64_t)B * T, T, positions.data ? positions.i32() : nullptr, NH, NKV, hs, rope, -1.0f);
  }

  // The new tokens' k and v into the cache, then each query row over its cached keys: scores, their
  // maximum, the exponentials' sum and the weighted values, all in fp32.
  void attention_kv_impl(Tensor out, Tensor k_cache, Tensor v_cache, Tensor qkv, Tensor key_start, int B, int Tn,
                         int p0, int cap, int NH, int NKV, int hs, int window, const AttnScores& scores) override {
    const int64_t row = (int64_t)(NH + 2 * NKV) * hs;
    const int group = NH / NKV;
    const float scale = scores.scale, softcap = scores.softcap;
    const int32_t* ks = key_start.i32();
    by_dtype(qkv.dtype, "attention_kv", [&](auto tag) {
      using A = decltype(tag);
      const A* X = (const A*)qkv.data;
      A *K = (A*)k_cache.data, *V = (A*)v_cache.data, *O = (A*)out.data;
      for (int b = 0; b < B; b++)
        for (int i = 0; i < Tn; i++)
          for (int kvh = 0; kvh < NKV; kvh++) {
            const int64_t src = ((int64_t)b * Tn + i) * row, dst = (((int64_t)b * NKV + kvh) * cap + p0 + i) * hs;
            std::memcpy(K + dst, X + src + (int64_t)(NH + kvh) * hs, sizeof(A) * hs);
            std::memcpy(V + dst, X + src + (int64_t)(NH + NKV + kvh) * hs, sizeof(A) * hs);
          }
#pragma omp parallel num_threads(nthreads_)
      {
        std::vector<float> q((size_t)hs), acc((size_t)hs), s((size_t)cap);
#pragma omp for collapse(3) schedule(static)
        for (int b = 0; b < B; b++)
          for (int h = 0; h < NH; h++)
            for (int i = 0; i < Tn; i++) {
              const int kvh = h / group, last = p0 + i;
              const int first = std::max(std::max(0, ks[b]), window > 0 ? last - window + 1 : 0);
              const int64_t cache0 = ((int64_t)b * NKV + kvh) * cap * hs;
              const int64_t o = ((int64_t)b * Tn + i) * NH * hs + (int64_t)h * hs;
              for (int j = 0; j < hs; j++) acc[j] = 0.0f;
              if (first <= last) {
                for (int j = 0; j < hs; j++) q[j] = ld(X, ((int64_t)b * Tn + i) * row + (int64_t)h * hs + j) * scale;
                float maxv = -INFINITY;
                for (int t2 = first; t2 <= last; t2++) {
                  float d = 0.0f;
                  for (int j = 0; j < hs; j++) d += q[j] * ld(K, cache0 + (int64_t)t2 * hs + j);
                  if (softcap > 0.0f) d = softcap * std::tanh(d / softcap);
                  s[t2] = d;
                  maxv = std::max(maxv, d);
                }
                float sum = 0.0f;
                for (int t2 = first; t2 <= last; t2++) sum += (s[t2] = exp_approx(s[t2] - maxv));
                const float inv = 1.0f / sum;
                for (int t2 = first; t2 <= last; t2++) {
                  const float p = s[t2] * inv;
                  for (int j = 0; j < hs; j++) acc[j] += p * ld(V, cache0 + (int64_t)t2 * hs + j);
                }
              }
              for (int j = 0; j < hs; j++) st(O, o + j, acc[j]);
            }
      }
    });
  }

  // Forward, one query row at a time: scores against every earlier key, their log-sum-exp, the
  // weighted sum of values. Only lse is kept; the probabilities live in a row of scratch. Keys are
  // held transposed ([hs][T]) so that a row's scores accumulate over t2 in vector lanes.
  void attention_forward_impl(Tensor out, Tensor lse, Tensor qkv, int B, int T, int NH, int NKV, int hs,
                              const Dropout& drop, const PackedDocs& docs, int window,
                              const AttnScores& scores) override {
    const int32_t* doc = docs.active() ? docs.start.i32() : nullptr;
    float* L = lse.f32();
    const int64_t row = (int64_t)(NH + 2 * NKV) * hs;
    const int group = NH / NKV;
    const float scale = scores.scale, softcap = scores.softcap;
    const float keep_scale = drop.active() ? 1.0f / (1.0f - drop.p) : 1.0f;
    by_dtype(qkv.dtype, "attention_forward", [&](auto tag) {
      using A = decltype(tag);
      const A* X = (const A*)qkv.data;
      A* O = (A*)out.data;
#pragma omp parallel num_threads(nthreads_)
      {
        std::vector<float> kt_((size_t)hs * T), v_((size_t)T * hs), q_((size_t)hs), acc_((size_t)hs), s_((size_t)T);
        float *__restrict kt = kt_.data(), *__restrict v = v_.data(), *__restrict q = q_.data(),
              *__restrict acc = acc_.data(), *__restrict s = s_.data();
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++) {
          for (int h = 0; h < NH; h++) {
            const int kvh = h / group;
            const int64_t base = (int64_t)b * T * row;
            load_head_t(X, base, row, (int64_t)(NH + kvh) * hs, T, hs, kt);
            load_head(X, base, row, (int64_t)(NH + NKV + kvh) * hs, T, hs, v);
            for (int t = 0; t < T; t++) {
              // the first key t sees: its document's start, or its window's when later
              const int s0 = std::max(doc ? doc[(int64_t)b * T + t] : 0, window > 0 ? t - window + 1 : 0);
              for (int j = 0; j < hs; j++) q[j] = ld(X, base + t * row + (int64_t)h * hs + j) * scale;
              for (int t2 = s0; t2 <= t; t2++) s[t2] = 0.0f;
              for (int j = 0; j < hs; j++) {
                const float qj = q[j];
                const float* __restrict kj = kt + (size_t)j * T;
#pragma omp simd
                for (int t2 = s0; t2 <= t; t2++) s[t2] += qj * kj[t2];
              }
              if (softcap > 0.0f)  // Gemma 2: the scaled scores capped, before the softmax
                for (int t2 = s0; t2 <= t; t2++) s[t2] = softcap * std::tanh(s[t2] / softcap);
              float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
              for (int t2 = s0; t2 <= t; t2++) maxv = std::max(maxv, s[t2]);
              float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
              for (int t2 = s0; t2 <= t; t2++) sum += (s[t2] = exp_approx(s[t2] - maxv));
              const float inv = 1.0f / sum;
              for (int j = 0; j < hs; j++) acc[j] = 0.0f;
              const int64_t drow = dropout_row(drop.row0 + b, t);
              for (int t2 = s0; t2 <= t; t2++) {
                float p = s[t2] * inv;
                if (drop.active())
                  p = dropout_keep(drop.key, drow, ((int64_t)h << kDropoutPosBits) + t2, drop.p) ? p * keep_scale : 0.0f;
                const float* __restrict vv = v + (size_t)t2 * hs;
#pragma omp simd
                for (int j = 0; j < hs; j++) acc[j] += p * vv[j];
              }
              const int64_t o = ((int64_t)b * T + t) * NH * hs + (int64_t)h * hs;
              for (int j = 0; j < hs; j++) st(O, o + j, acc[j]);
              L[((int64_t)b * NH + h) * T + t] = maxv + std::log(sum);
            }
          }
        }
      }
    });
  }

  // Backward as FlashAttention-2: per (batch, kv head), every query row of the heads that share it
  // recomputes its probabilities from lse; D = rowsum(dout * out) stands in for the softmax's
  // row sums. dk and dv accumulate in fp32 scratch and are stored once. Rows of scores and their
  // gradients run over t2 in vector lanes (keys and values held both ways).
  void attention_backward_impl(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T, int NH,
                               int NKV, int hs, const Dropout& drop, const PackedDocs& docs, int window,
                               const AttnScores& scores) override {
    const int32_t* doc = docs.active() ? docs.start.i32() : nullptr;
    const float* L = lse.f32();
    const int64_t row = (int64_t)(NH + 2 * NKV) * hs;
    const int group = NH / NKV;
    const float scale = scores.scale, softcap = scores.softcap;
    const float keep_scale = drop.active() ? 1.0f / (1.0f - drop.p) : 1.0f;
    by_dtype(qkv.dtype, "attention_backward", [&](auto tag) {
      using A = decltype(tag);
      const A *X = (const A*)qkv.data, *D = (const A*)dout.data, *O = (const A*)out.data;
      A* DX = (A*)dqkv.data;
#pragma omp parallel num_threads(nthreads_)
      {
        const size_t th = (size_t)T * hs;
        std::vector<float> buf(6 * th + 4 * (size_t)hs + 4 * (size_t)T);
        float* __restrict k = buf.data();       // [T][hs]
        float* __restrict kt = k + th;          // [hs][T]
        float* __restrict vt = kt + th;         // [hs][T]
        float* __restrict dk = vt + th;         // [T][hs]
        float* __restrict dv = dk + th;         // [T][hs]
        float* __restrict q = dv + th + th;     // [hs], after a spare [T][hs]
        float* __restrict dq = q + hs;
        float* __restrict dd = dq + hs;         // this row's dout
        float* __restrict p = dd + hs + hs;     // [T] probabilities
        float* __restrict dp = p + T;           // [T] their gradients, then the scores'
        float* __restrict pd = dp + T;          // [T] the probabilities after dropout
        float* __restrict dc = pd + T;          // [T] the soft cap's derivative, 1 - tanh^2
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++) {
          for (int kvh = 0; kvh < NKV; kvh++) {
            const int64_t base = (int64_t)b * T * row;
            const int64_t koff = (int64_t)(NH + kvh) * hs, voff = (int64_t)(NH + NKV + kvh) * hs;
            load_head(X, base, row, koff, T, hs, k);
            load_head_t(X, base, row, koff, T, hs, kt);
            load_head_t(X, base, row, voff, T, hs, vt);
            std::fill(dk, dk + th, 0.0f);
            std::fill(dv, dv + th, 0.0f);
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
              for (int t = 0; t < T; t++) {
                // the first key t sees: its document's start, or its window's when later
                const int s0 = std::max(doc ? doc[(int64_t)b * T + t] : 0, window > 0 ? t - window + 1 : 0);
                const int64_t o = ((int64_t)b * T + t) * NH * hs + (int64_t)h * hs;
                float Dt = 0.0f;  // rowsum(dout * out): the softmax backward's sum over the row
                for (int j = 0; j < hs; j++) {
                  q[j] = ld(X, base + t * row + (int64_t)h * hs + j);
                  dd[j] = ld(D, o + j);
                  Dt += dd[j] * ld(O, o + j);
                  dq[j] = 0.0f;
                }
                const float lse_t = L[((int64_t)b * NH + h) * T + t];
                for (int t2 = s0; t2 <= t; t2++) p[t2] = dp[t2] = 0.0f;
                for (int j = 0; j < hs; j++) {  // scores (q . k) and dout . v, over t2 in lanes
                  const float qj = q[j] * scale, dj = dd[j];
                  const float *__restrict kj = kt + (size_t)j * T, *__restrict vj = vt + (size_t)j * T;
#pragma omp simd
                  for (int t2 = s0; t2 <= t; t2++) {
                    p[t2] += qj * kj[t2];
                    dp[t2] += dj * vj[t2];
                  }
                }
                if (softcap > 0.0f)  // the capped score, and its derivative for d(score)
                  for (int t2 = s0; t2 <= t; t2++) {
                    const float th = std::tanh(p[t2] / softcap);
                    p[t2] = softcap * th;
                    dc[t2] = 1.0f - th * th;
                  }
#pragma omp simd
                for (int t2 = s0; t2 <= t; t2++) pd[t2] = p[t2] = exp_approx(p[t2] - lse_t);
                if (drop.active()) {
                  const int64_t drow = dropout_row(drop.row0 + b, t);
                  for (int t2 = s0; t2 <= t; t2++) {
                    bool keep = dropout_keep(drop.key, drow, ((int64_t)h << kDropoutPosBits) + t2, drop.p);
                    pd[t2] = keep ? p[t2] * keep_scale : 0.0f;
                    dp[t2] = keep ? dp[t2] * keep_scale : 0.0f;
                  }
                }
#pragma omp simd
                for (int t2 = s0; t2 <= t; t2++) dp[t2] = p[t2] * (dp[t2] - Dt) * scale;  // now d(score)
                if (softcap > 0.0f)
#pragma omp simd
                  for (int t2 = s0; t2 <= t; t2++) dp[t2] *= dc[t2];
                for (int t2 = s0; t2 <= t; t2++) {
                  const float ds = dp[t2], pv = pd[t2];
                  const float* __restrict kk = k + (size_t)t2 * hs;
                  float *__restrict dkk = dk + (size_t)t2 * hs, *__restrict dvv = dv + (size_t)t2 * hs;
#pragma omp simd
                  for (int j = 0; j < hs; j++) {
                    dvv[j] += pv * dd[j];
                    dq[j] += ds * kk[j];
                    dkk[j] += ds * q[j];
                  }
                }
                for (int j = 0; j < hs; j++) st(DX, base + t * row + (int64_t)h * hs + j, dq[j]);
              }
            }
            for (int t = 0; t < T; t++)
              for (int j = 0; j < hs; j++) {
                st(DX, base + t * row + koff + j, dk[(size_t)t * hs + j]);
                st(DX, base + t * row + voff + j, dv[(size_t)t * hs + j]);
              }
          }
        }
      }
    });
  }

  // ---- elementwise ----
  void add_impl(Tensor out, Tensor a, Tensor b, int64_t n) override {
    by_dtype(out.dtype, "add", [&](auto tag) {
      using A = decltype(tag);
      A* o = (A*)out.data;
      const A *Av = (const A*)a.data, *Bv = (const A*)b.data;
#pragma omp parallel for simd num_threads(nthreads_)
      for (int64_t i = 0; i < n; i++) st(o, i, ld(Av, i) + ld(Bv, i));
    });
  }
  void accumulate_impl(Tensor dst, Tensor src, int64_t n) override {
    by_dtype(dst.dtype, "accumulate", [&](auto dtag) {
      by_dtype(src.dtype, "accumulate", [&](auto stag) {
        using D = decltype(dtag);
        using S = decltype(stag);
        D* d = (D*)dst.data;
        const S* s = (const S*)src.data;
#pragma omp parallel for simd num_threads(nthreads_)
        for (int64_t i = 0; i < n; i++) st(d, i, ld(d, i) + ld(s, i));
      });
    });
  }
  void scale_impl(Tensor x, float s, int64_t n) override {
    by_dtype(x.dtype, "scale", [&](auto tag) {
      using A = decltype(tag);
      A* X = (A*)x.data;
#pragma omp parallel for simd num_threads(nthreads_)
      for (int64_t i = 0; i < n; i++) st(X, i, ld(X, i) * s);
    });
  }

  // ---- loss ----
  // One row of cross_entropy with the logits soft-capped: y = cap tanh(x / cap) (fp32, in y), the
  // loss over y added to total, and when dx: dx (may alias x) = grad_scale (softmax(y) - onehot)
  // (1 - (y / cap)^2), the gradient before the cap. e: V floats of scratch.
  template <class A>
  static void softcap_row(float* y, float* e, const A* x, int V, float cap, int target, float grad_scale, A* dx,
                          double& total) {
    float maxv = -INFINITY;
    for (int j = 0; j < V; j++) maxv = std::max(maxv, y[j] = cap * std::tanh(ld(x, j) / cap));
    double sum = 0.0;
    for (int j0 = 0; j0 < V; j0 += 1024) {  // as the uncapped rows: fp32 blocks of 1024, added in double
      const int j1 = std::min(V, j0 + 1024);
      float block = 0.0f;
      for (int j = j0; j < j1; j++) block += (e[j] = exp_approx(y[j] - maxv));
      sum += block;
    }
    if (dx) {
      const float f = (float)(grad_scale / sum);
      for (int j = 0; j < V; j++) {
        const float t = y[j] / cap;
        st(dx, j, (e[j] * f - (j == target ? grad_scale : 0.0f)) * (1.0f - t * t));
      }
    }
    total += std::log(sum) + maxv - y[target];
  }
  void logit_softcap_impl(Tensor x, int64_t N, int V, float cap, int64_t row_stride) override {
    by_dtype(x.dtype, "logit_softcap", [&](auto tag) {
      using A = decltype(tag);
      A* X = (A*)x.data;
#pragma omp parallel for num_threads(nthreads_)
      for (int64_t i = 0; i < N; i++)
        for (int j = 0; j < V; j++) st(X, i * row_stride + j, cap * std::tanh(ld(X, i * row_stride + j) / cap));
    });
  }
  void cross_entropy_impl(Tensor loss_sum, Tensor dlogits, Tensor logits, Tensor targets, int64_t N, int V,
                          float grad_scale, int64_t row_stride, float softcap) override {
    double* out = loss_sum.f64();
    const int32_t* tg = targets.i32();
    for (int64_t i = 0; i < N; i++)
      LLMT_CHECK(tg[i] == kIgnoreIndex || (tg[i] >= 0 && tg[i] < V),
                 "cross_entropy: target %d at row %lld is outside the vocabulary [0, %d) and is not %d", tg[i],
                 (long long)i, V, kIgnoreIndex);
    double total = 0.0;
    by_dtype(logits.dtype, "cross_entropy", [&](auto tag) {
      using A = decltype(tag);
      const A* Lg = (const A*)logits.data;
      A* DL = dlogits.data ? (A*)dlogits.data : nullptr;
#pragma omp parallel num_threads(nthreads_) reduction(+ : total)
      {
        std::vector<float> e((size_t)V), capped(softcap > 0.0f ? (size_t)V : 0);
#pragma omp for
        for (int64_t i = 0; i < N; i++) {
          const int64_t r = i * row_stride;
          const int target = tg[i];
          if (target == kIgnoreIndex) {
            if (DL)
              for (int j = 0; j < V; j++) st(DL, r + j, 0.0f);
            continue;
          }
          if (softcap > 0.0f) {
            softcap_row(capped.data(), e.data(), Lg + r, V, softcap, target, grad_scale, DL ? DL + r : nullptr, total);
            continue;
          }
          float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
          for (int j = 0; j < V; j++) maxv = std::max(maxv, ld(Lg, r + j));
          const float target_logit = ld(Lg, r + target);
          // the exponentials summed in fp32 vector lanes over blocks of 1024, the blocks in double
          double sum = 0.0;
          float* __restrict ee = e.data();
          for (int j0 = 0; j0 < V; j0 += 1024) {
            const int j1 = std::min(V, j0 + 1024);
            float block = 0.0f;
#pragma omp simd reduction(+ : block)
            for (int j = j0; j < j1; j++) block += (ee[j] = exp_approx(ld(Lg, r + j) - maxv));
            sum += block;
          }
          if (DL) {  // DL may alias Lg: every logit was read above
            const float f = (float)(grad_scale / sum);
#pragma omp simd
            for (int j = 0; j < V; j++) st(DL, r + j, ee[j] * f);
            st(DL, r + target, ld(DL, r + target) - grad_scale);
          }
          total += std::log(sum) + maxv - target_logit;
        }
      }
    });
    *out += total;
  }

  // ---- optimizer and reductions ----
  void adamw_impl(Tensor p, Tensor p_compute, Tensor g, Tensor m, Tensor v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, const DecaySpans& decay, int t,
                  float grad_scale) override {
    // the elements between spans take no decay: a run of them, then a span, ...
    int64_t at = 0;
    for (int s = 0; s <= decay.count; s++) {
      const int64_t b = s < decay.count ? decay.begin[s] : n;
      adamw_run(p, p_compute, g, m, v, at, b, lr, beta1, beta2, eps, 0.0f, t, grad_scale);
      if (s == decay.count) break;
      adamw_run(p, p_compute, g, m, v, b, decay.end[s], lr, beta1, beta2, eps, weight_decay, t, grad_scale);
      at = decay.end[s];
    }
  }

  // Elements [lo, hi) of one AdamW call, all with the same weight decay.
  void adamw_run(Tensor p, Tensor p_compute, Tensor g, Tensor m, Tensor v, int64_t lo, int64_t hi, float lr,
                 float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale) {
    if (hi <= lo) return;
    float* P = p.f32();
    const float* G = g.f32();
    float* Mm = m.f32();
    float* Vv = v.f32();
    uint16_t* PC = p_compute.data ? p_compute.bf16() : nullptr;
    // a held unit's fp32 mirror (the widened weights), kept equal to the bf16 values written
    float* W = PC ? held_mirror_for(PC + lo, hi - lo) : nullptr;  // W[i - lo] mirrors PC[i]
    const float bc1 = 1.0f - std::pow(beta1, (float)t);
    const float bc2 = 1.0f - std::pow(beta2, (float)t);
    const float step_size = lr / bc1;
    const float bc2_sqrt = std::sqrt(bc2);
    const float decay = 1.0f - lr * weight_decay;
#pragma omp parallel for simd num_threads(nthreads_)
    for (int64_t i = lo; i < hi; i++) {
      float gi = G[i] * grad_scale;
      float mi = beta1 * Mm[i] + (1.0f - beta1) * gi;
      float vi = beta2 * Vv[i] + (1.0f - beta2) * gi * gi;
      Mm[i] = mi;
      Vv[i] = vi;
      float pi = P[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
      P[i] = pi;
      if (PC) {
        const uint16_t b = f32_to_bf16(pi);
        PC[i] = b;
        if (W) W[i - lo] = bf16_to_f32(b);
      }
    }
  }

  void sum_squares_impl(Tensor out, Tensor x, int64_t n) override {
    const float* X = x.f32();
    double total = 0.0;
#pragma omp parallel for simd reduction(+ : total) num_threads(nthreads_)
    for (int64_t i = 0; i < n; i++) total += (double)X[i] * X[i];
    *out.f64() += total;
  }

  // ---- dtype conversion ----
  void convert_impl(Tensor out, Tensor in, int64_t n) override {
    by_dtype(out.dtype, "convert", [&](auto otag) {
      by_dtype(in.dtype, "convert", [&](auto itag) {
        using O = decltype(otag);
        using I = decltype(itag);
        O* o = (O*)out.data;
        const I* s = (const I*)in.data;
#pragma omp parallel for num_threads(nthreads_)
        for (int64_t i = 0; i < n; i++) st(o, i, ld(s, i));
      });
    });
  }

  // ---- mixture of experts: kernels/cpu/cpu_moe.cpp, and the experts' products here ----
  bool bf16() const { return compute_ == DType::bf16; }
  void moe_route_impl(Tensor topk_idx, Tensor topk_w, Tensor probs, Tensor stats, Tensor logits, int64_t N, int E,
                      int k, bool norm_topk, bool round_w) override {
    cpu_moe::route(bf16(), topk_idx, topk_w, probs, stats, logits, N, E, k, norm_topk, round_w, nthreads_);
  }
  void moe_route_backward_impl(Tensor dlogits, Tensor dtopk_w, Tensor probs, Tensor topk_idx, Tensor aux_grad,
                               int64_t N, int E, int k, bool norm_topk) override {
    cpu_moe::route_backward(bf16(), dlogits, dtopk_w, probs, topk_idx, aux_grad, N, E, k, norm_topk, nthreads_);
  }
  void moe_dispatch_impl(Tensor offsets, Tensor pos, Tensor xg, Tensor x, Tensor topk_idx, int64_t N, int E, int k,
                         int C) override {
    cpu_moe::dispatch(bf16(), offsets, pos, xg, x, topk_idx, N, E, k, C, nthreads_);
  }
  void moe_undispatch_impl(Tensor dx, Tensor dxg, Tensor pos, int64_t N, int k, int C) override {
    cpu_moe::undispatch(bf16(), dx, dxg, pos, N, k, C, nthreads_);
  }
  void moe_combine_impl(Tensor out, Tensor residual, Tensor y, Tensor topk_w, Tensor pos, Tensor shared, Tensor gate,
                        int64_t N, int k, int C) override {
    cpu_moe::combine(bf16(), out, residual, y, topk_w, pos, shared, gate, N, k, C, nthreads_);
  }
  void moe_combine_backward_impl(Tensor dy, Tensor dtopk_w, Tensor dshared, Tensor dgate, Tensor dout, Tensor y,
                                 Tensor topk_w, Tensor pos, Tensor shared, Tensor gate, int64_t N, int k,
                                 int C) override {
    cpu_moe::combine_backward(bf16(), dy, dtopk_w, dshared, dgate, dout, y, topk_w, pos, shared, gate, N, k, C,
                              nthreads_);
  }
  void moe_aux_loss_impl(Tensor loss, Tensor grad, Tensor stats, int E, double rows, float coef,
                         float grad_scale) override {
    cpu_moe::aux_loss(loss, grad, stats, E, rows, coef, grad_scale);
  }
  // Each expert's rows through dnnl_sgemm, which takes any row count without a primitive made for it
  // (a primitive per shape, as matmul_native keeps, would be one per expert and per step here). bf16
  // operands are widened first (the weights once while held, as matmul_widened), the product rounded
  // once: the bf16 primitive's arithmetic (exact products, fp32 sums).
  const float* moe_weights_f32(const Tensor& w, int64_t n) {
    if (!bf16()) return w.f32();
    bool made = false;
    float* mirror = held_copy(w.data, n, &made);
    if (!mirror) return (const float*)widen(w, n, wb_);
    if (made) convert_impl(Tensor(mirror, DType::f32, {n}), w, n);
    return mirror;
  }
  void moe_matmul_impl(Tensor out, Tensor a, Tensor w, Tensor offsets, int64_t rows, int E, int64_t n, int64_t K,
                       int64_t w_stride, bool trans_w) override {
    const float* A = bf16() ? (const float*)widen(a, rows * K, wa_) : a.f32();
    const float* W = moe_weights_f32(w, (E - 1) * w_stride + n * K);
    float* O = out.dtype == DType::f32 ? out.f32() : nullptr;
    if (!O) wout_.resize((size_t)(rows * n)), O = wout_.data();
    const int32_t* off = offsets.i32();
    omp_set_num_threads(nthreads_);
    for (int e = 0; e < E; e++) {
      const int64_t m = off[e + 1] - off[e];
      if (m == 0) continue;
      dnnl_status_t st = dnnl_sgemm('N', trans_w ? 'T' : 'N', m, n, K, 1.0f, A + off[e] * K, K, W + e * w_stride,
                                    trans_w ? K : n, 0.0f, O + off[e] * n, n);
      LLMT_CHECK(st == dnnl_success, "cpu moe_matmul: dnnl_sgemm failed (%d) for expert %d", (int)st, e);
    }
    if (O != out.data) convert_impl(out, Tensor(O, DType::f32, {rows * n}), rows * n);
  }
  void moe_matmul_wgrad_impl(Tensor dw, Tensor dout, Tensor a, Tensor offsets, int64_t rows, int E, int64_t n,
                             int64_t K, int64_t w_stride) override {
    const float* A = bf16() ? (const float*)widen(a, rows * K, wa_) : a.f32();
    const float* D = bf16() ? (const float*)widen(dout, rows * n, wout_) : dout.f32();
    const int32_t* off = offsets.i32();
    omp_set_num_threads(nthreads_);
    for (int e = 0; e < E; e++) {
      const int64_t m = off[e + 1] - off[e];
      if (m == 0) continue;
      dnnl_status_t st = dnnl_sgemm('T', 'N', n, K, m, 1.0f, D + off[e] * n, n, A + off[e] * K, K, 1.0f,
                                    dw.f32() + e * w_stride, K);
      LLMT_CHECK(st == dnnl_success, "cpu moe_matmul_wgrad: dnnl_sgemm failed (%d) for expert %d", (int)st, e);
    }
  }

 private:
  // Runs f(offset, length) over [0, bytes) in one piece per thread (one piece when small): a
  // single-threaded memset of a step's gradients takes twice as long as two threads'.
  template <class F>
  void chunked(size_t bytes, F&& f) {
    const size_t kMin = 1 << 20;
    if (bytes < 2 * kMin || nthreads_ == 1) return f(0, bytes);
    const size_t per = (bytes / nthreads_ + 63) / 64 * 64;
#pragma omp parallel for num_threads(nthreads_)
    for (int t = 0; t < nthreads_; t++) {
      size_t at = std::min(bytes, (size_t)t * per), n = std::min(bytes - at, per);
      if (n) f(at, n);
    }
  }

  // One head's rows [T, hs] of q, k or v (at column `off` of rows `row` apart) widened to fp32;
  // load_head_t stores them transposed, [hs, T].
  template <class A>
  static void load_head(const A* X, int64_t base, int64_t row, int64_t off, int T, int hs, float* dst) {
    for (int t = 0; t < T; t++)
      for (int j = 0; j < hs; j++) dst[(size_t)t * hs + j] = ld(X, base + t * row + off + j);
  }
  template <class A>
  static void load_head_t(const A* X, int64_t base, int64_t row, int64_t off, int T, int hs, float* dst) {
    for (int t = 0; t < T; t++)
      for (int j = 0; j < hs; j++) dst[(size_t)j * T + t] = ld(X, base + t * row + off + j);
  }

  // A oneDNN matmul primitive per shape and dtype combination, created on first use (the
  // creation JIT-compiles its kernel; a step reuses a few dozen shapes).
  using MatmulKey = std::tuple<int64_t, int64_t, int64_t, bool, bool, bool, bool, DType, DType>;
  struct Matmul {
    dnnl::matmul prim;
    dnnl::memory::desc a, b, bias, out;
  };
  // a bf16 tensor's n values as fp32 in `scratch`
  void* widen(const Tensor& t, int64_t n, std::vector<float>& scratch) {
    scratch.resize((size_t)n);
    convert_impl(Tensor(scratch.data(), DType::f32, {n}), t, n);
    return scratch.data();
  }
  static dnnl::memory::data_type dnnl_type(DType t) {
    return t == DType::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
  }
  Matmul make_matmul(const MatmulKey& key) {
    auto [M, N, K, ta, tb, accumulate, has_bias, in_t, out_t] = key;
    using tag = dnnl::memory::format_tag;
    Matmul m;
    // a transpose is a stride: [M,K] read from storage [K,M] is format "ba"
    m.a = dnnl::memory::desc({M, K}, dnnl_type(in_t), ta ? tag::ba : tag::ab);
    m.b = dnnl::memory::desc({K, N}, dnnl_type(in_t), tb ? tag::ba : tag::ab);
    m.out = dnnl::memory::desc({M, N}, dnnl_type(out_t), tag::ab);
    if (has_bias) m.bias = dnnl::memory::desc({1, N}, dnnl_type(in_t), tag::ab);
    dnnl::primitive_attr attr;
    if (accumulate) {  // out = out + a b (+ bias)
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    try {
      dnnl::matmul::desc desc = has_bias ? dnnl::matmul::desc(m.a, m.b, m.bias, m.out) : dnnl::matmul::desc(m.a, m.b, m.out);
      m.prim = dnnl::matmul(dnnl::matmul::primitive_desc(desc, attr, engine_));
    } catch (const dnnl::error& e) {
      fail("cpu matmul: oneDNN has no %s matmul for %lld x %lld x %lld: %s", dtype_name(in_t), (long long)M,
           (long long)N, (long long)K, e.what());
    }
    return m;
  }

  int nthreads_ = 1;
  DType compute_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<MatmulKey, Matmul> matmuls_;
  std::vector<float> wa_, wb_, wbias_, wout_;  // fp32 copies of bf16 operands when widened
  std::vector<HeldParams> held_;               // and of the weights in held parameters
  std::multimap<size_t, std::unique_ptr<float[]>> spare_;  // released mirrors' memory, by bytes held
  bool has_bf16_kernel_ = false;
  std::unique_ptr<Bf16MatmulChoice> bf16_choice_;  // bf16 compute only
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads, DType compute) {
  return std::make_unique<CpuBackend>(threads, compute);
}

std::string cpu_library_version() {
  const dnnl_version_t* v = dnnl_version();
  const char* isa = std::getenv("DNNL_MAX_CPU_ISA");
  return strformat("oneDNN %d.%d.%d (DNNL_MAX_CPU_ISA %s)", v->major, v->minor, v->patch, isa ? isa : "unset");
}

}  // namespace llmt
