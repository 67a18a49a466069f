// CUDA kernels for the first subset of the Backend op set; semantics in cuda_kernels.h and backend.h.
//
// Idioms (after llm.c): grid-stride loops with 64-bit indices; a Vec<T, V> of 16 bytes moved with one
// 128-bit load/store when every pointer is aligned for it, else V = 1; elements past the last whole Vec
// are handled by a scalar tail loop in the same kernel. bf16 is carried as uint16_t bits and rounded
// with the same code as llmt::f32_to_bf16 on the host, so conversions match the CPU bit for bit.
#include "kernels/cuda/cuda_kernels.h"

#include <atomic>
#include <cmath>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/device_common.cuh"

namespace llmt {
namespace cuda {
namespace {

// ---------------------------------------------------------------------------------------------------
// elementwise maps: out[i] = f(a[i]) and out[i] = f(a[i], b[i]), fp32 math, out may alias an input

template <int V, typename To, typename Ta, typename F>
__global__ void map1_kernel(To* out, const Ta* a, int64_t n, F f) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  for (int64_t i = tid; i < nvec; i += stride) {
    Vec<Ta, V> va = load_vec<Ta, V>(a + i * V);
    Vec<To, V> vo;
#pragma unroll
    for (int k = 0; k < V; k++) vo.v[k] = from_f32<To>(f(to_f32(va.v[k])));
    store_vec<To, V>(out + i * V, vo);
  }
  for (int64_t i = nvec * V + tid; i < n; i += stride) out[i] = from_f32<To>(f(to_f32(a[i])));
}

template <int V, typename T, typename F>
__global__ void map2_kernel(T* out, const T* a, const T* b, int64_t n, F f) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  for (int64_t i = tid; i < nvec; i += stride) {
    Vec<T, V> va = load_vec<T, V>(a + i * V);
    Vec<T, V> vb = load_vec<T, V>(b + i * V);
    Vec<T, V> vo;
#pragma unroll
    for (int k = 0; k < V; k++) vo.v[k] = from_f32<T>(f(to_f32(va.v[k]), to_f32(vb.v[k])));
    store_vec<T, V>(out + i * V, vo);
  }
  for (int64_t i = nvec * V + tid; i < n; i += stride) out[i] = from_f32<T>(f(to_f32(a[i]), to_f32(b[i])));
}

template <typename To, typename Ta, typename F>
void launch_map1(const char* op, To* out, const Ta* a, int64_t n, F f, Stream stream) {
  check_n(n, op);
  if (n == 0) return;
  constexpr int V = 16 / (sizeof(To) > sizeof(Ta) ? sizeof(To) : sizeof(Ta));
  if (aligned(out, sizeof(To) * V) && aligned(a, sizeof(Ta) * V)) {
    LLMT_LAUNCH(map1_kernel<V>, grid_for((n + V - 1) / V), kBlock, 0, stream, out, a, n, f);
  } else {
    LLMT_LAUNCH(map1_kernel<1>, grid_for(n), kBlock, 0, stream, out, a, n, f);
  }
  CUDA_CHECK_LAUNCH();
}

template <typename T, typename F>
void launch_map2(const char* op, T* out, const T* a, const T* b, int64_t n, F f, Stream stream) {
  check_n(n, op);
  if (n == 0) return;
  constexpr int V = 16 / sizeof(T);
  if (aligned(out, 16) && aligned(a, 16) && aligned(b, 16)) {
    LLMT_LAUNCH(map2_kernel<V>, grid_for((n + V - 1) / V), kBlock, 0, stream, out, a, b, n, f);
  } else {
    LLMT_LAUNCH(map2_kernel<1>, grid_for(n), kBlock, 0, stream, out, a, b, n, f);
  }
  CUDA_CHECK_LAUNCH();
}

struct Identity {
  __device__ float operator()(float x) const { return x; }
};
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Scale {
  float s;
  __device__ float operator()(float x) const { return x * s; }
};

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

struct GeluForward {
  __device__ float operator()(float x) const {
    float u = kGeluK * (x + kGeluC * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
  }
};
// Arguments (x, dout).
struct GeluBackward {
  __device__ float operator()(float x, float dout) const {
    float x2 = x * x;
    float u = kGeluK * (x + kGeluC * x2 * x);
    float th = tanhf(u);
    float dudx = kGeluK * (1.0f + 3.0f * kGeluC * x2);
    float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * dudx;
    return dout * grad;
  }
};

// ---------------------------------------------------------------------------------------------------
// SwiGLU: rows of gate_up[N, 2I]; item e of N*I is row e / I, column e % I. With V > 1, I % V == 0, so
// a Vec never crosses a row and both halves stay aligned.

__device__ __forceinline__ float sigmoidf(float g) { return 1.0f / (1.0f + expf(-g)); }

// the gate's activation: silu, or (Gelu) the tanh GELU of GeGLU
template <bool Gelu>
__device__ __forceinline__ float glu_gate(float g) {
  return Gelu ? GeluForward()(g) : g * sigmoidf(g);
}

template <int V, bool Gelu, typename T>
__global__ void swiglu_forward_kernel(T* out, const T* gate_up, int64_t N, int I) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t nvec = N * I / V;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
    const int64_t e = i * V;
    const int64_t row = e / I, col = e % I;
    const T* gp = gate_up + row * 2 * I + col;
    Vec<T, V> vg = load_vec<T, V>(gp);
    Vec<T, V> vu = load_vec<T, V>(gp + I);
    Vec<T, V> vo;
#pragma unroll
    for (int k = 0; k < V; k++) {
      float g = to_f32(vg.v[k]), u = to_f32(vu.v[k]);
      vo.v[k] = from_f32<T>(glu_gate<Gelu>(g) * u);
    }
    store_vec<T, V>(out + e, vo);
  }
}

template <int V, bool Gelu, typename T>
__global__ void swiglu_backward_kernel(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int I) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t nvec = N * I / V;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
    const int64_t e = i * V;
    const int64_t row = e / I, col = e % I;
    const int64_t off = row * 2 * I + col;
    Vec<T, V> vg = load_vec<T, V>(gate_up + off);
    Vec<T, V> vu = load_vec<T, V>(gate_up + off + I);
    Vec<T, V> vd = load_vec<T, V>(dout + e);
    Vec<T, V> dg, du;
#pragma unroll
    for (int k = 0; k < V; k++) {
      float g = to_f32(vg.v[k]), u = to_f32(vu.v[k]), d = to_f32(vd.v[k]);
      float a, da;
      if (Gelu) {
        a = GeluForward()(g);
        da = GeluBackward()(g, 1.0f);
      } else {
        const float s = sigmoidf(g);
        a = g * s;
        da = s * (1.0f + g * (1.0f - s));
      }
      dg.v[k] = from_f32<T>(d * u * da);
      du.v[k] = from_f32<T>(d * a);
    }
    store_vec<T, V>(dgate_up + off, dg);
    store_vec<T, V>(dgate_up + off + I, du);
  }
}

template <bool Gelu, typename T>
void launch_swiglu_forward(T* out, const T* gate_up, int64_t N, int I, Stream stream) {
  LLMT_CHECK(N >= 0 && I >= 0, "cuda swiglu_forward: bad shape N=%lld I=%d", (long long)N, I);
  if (N == 0 || I == 0) return;
  constexpr int V = 16 / sizeof(T);
  if (I % V == 0 && aligned(out, 16) && aligned(gate_up, 16)) {
    LLMT_LAUNCH((swiglu_forward_kernel<V, Gelu>), grid_for(N * I / V), kBlock, 0, stream, out, gate_up, N, I);
  } else {
    LLMT_LAUNCH((swiglu_forward_kernel<1, Gelu>), grid_for(N * I), kBlock, 0, stream, out, gate_up, N, I);
  }
  CUDA_CHECK_LAUNCH();
}

template <bool Gelu, typename T>
void launch_swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int I, Stream stream) {
  LLMT_CHECK(N >= 0 && I >= 0, "cuda swiglu_backward: bad shape N=%lld I=%d", (long long)N, I);
  if (N == 0 || I == 0) return;
  constexpr int V = 16 / sizeof(T);
  if (I % V == 0 && aligned(dgate_up, 16) && aligned(dout, 16) && aligned(gate_up, 16)) {
    LLMT_LAUNCH((swiglu_backward_kernel<V, Gelu>), grid_for(N * I / V), kBlock, 0, stream, dgate_up, dout, gate_up, N,
                I);
  } else {
    LLMT_LAUNCH((swiglu_backward_kernel<1, Gelu>), grid_for(N * I), kBlock, 0, stream, dgate_up, dout, gate_up, N, I);
  }
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------------
// AdamW

struct AdamWArgs {
  float lr, beta1, beta2, eps;
  float decay;          // 1 - lr * weight_decay, for elements inside a decay span
  float step_size;      // lr / (1 - beta1^t)
  float bc2_sqrt;       // sqrt(1 - beta2^t)
  float grad_scale;
  int spans;            // decay spans [span_begin, span_end), sorted; elements outside take no decay
  int64_t span_begin[kAdamWMaxSpans], span_end[kAdamWMaxSpans];
};

// Element i's decay factor: a.decay inside a span, 1 outside (biases and norm weights).
__device__ __forceinline__ float adamw_decay(int64_t i, const AdamWArgs& a) {
  for (int s = 0; s < a.spans; s++)
    if (i >= a.span_begin[s] && i < a.span_end[s]) return a.decay;
  return 1.0f;
}

__device__ __forceinline__ float adamw_one(float& p, float g, float& m, float& v, float decay, const AdamWArgs& a) {
  g *= a.grad_scale;
  m = m + (1.0f - a.beta1) * (g - m);  // torch: exp_avg.lerp_(grad, 1 - beta1)
  v = a.beta2 * v + (1.0f - a.beta2) * g * g;
  float denom = sqrtf(v) / a.bc2_sqrt + a.eps;
  p = p * decay - a.step_size * (m / denom);
  return p;
}

template <int V>
__global__ void adamw_kernel(float* p, uint16_t* p_bf16, const float* g, float* m, float* v, int64_t n,
                             AdamWArgs a) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  for (int64_t i = tid; i < nvec; i += stride) {
    const int64_t e = i * V;
    Vec<float, V> vp = load_vec<float, V>(p + e);
    Vec<float, V> vg = load_vec<float, V>(g + e);
    Vec<float, V> vm = load_vec<float, V>(m + e);
    Vec<float, V> vv = load_vec<float, V>(v + e);
    Vec<uint16_t, V> vb;
#pragma unroll
    for (int k = 0; k < V; k++)
      vb.v[k] = bf16_bits(adamw_one(vp.v[k], vg.v[k], vm.v[k], vv.v[k], adamw_decay(e + k, a), a));
    store_vec<float, V>(p + e, vp);
    store_vec<float, V>(m + e, vm);
    store_vec<float, V>(v + e, vv);
    if (p_bf16) store_vec<uint16_t, V>(p_bf16 + e, vb);
  }
  for (int64_t i = nvec * V + tid; i < n; i += stride) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_one(pi, g[i], mi, vi, adamw_decay(i, a), a);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (p_bf16) p_bf16[i] = bf16_bits(pi);
  }
}

// ---------------------------------------------------------------------------------------------------
// sum of squares: pass 1 writes one double per block, pass 2 sums them in one block. Both use the same
// fixed-order tree (warp shuffles, then the warps' sums), so the result is deterministic.

// Sum over the block; the result is valid in thread 0. blockDim.x must be a multiple of WARP_SIZE.
__device__ double block_sum(double x) {
  LLMT_SHARED(double, warp_sums, [WARP_SIZE]);
  const int tid = (int)threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
  const int nwarps = (int)blockDim.x / WARP_SIZE;
#pragma unroll
  for (int o = WARP_SIZE / 2; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  x = tid < nwarps ? warp_sums[tid] : 0.0;
  if (warp == 0) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
  }
  return x;
}

template <int V>
__global__ void sum_squares_partial_kernel(double* partials, const float* x, int64_t n) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  double acc = 0.0;  // a float squared is exact in double; only the additions round
  for (int64_t i = tid; i < nvec; i += stride) {
    Vec<float, V> vx = load_vec<float, V>(x + i * V);
#pragma unroll
    for (int k = 0; k < V; k++) {
      double d = vx.v[k];
      acc += d * d;
    }
  }
  for (int64_t i = nvec * V + tid; i < n; i += stride) {
    double d = x[i];
    acc += d * d;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void sum_squares_final_kernel(double* out, const double* partials, int count, bool accumulate) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) out[0] = accumulate ? out[0] + acc : acc;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// host entry points

void* device_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    (void)cudaGetLastError();
    throw Error(strformat("cuda device_alloc: cudaMalloc of %zu bytes failed: %s (%zu of %zu bytes free)", bytes,
                          cudaGetErrorString(err), free_b, total_b));
  }
  CUDA_CHECK(cudaMemset(p, 0, bytes));
  return p;
}

void device_free(void* p) {
  if (p) CUDA_CHECK(cudaFree(p));
}

void copy_to_device(void* dst, const void* host_src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpy(dst, host_src, bytes, cudaMemcpyHostToDevice));
}

void copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpy(host_dst, src, bytes, cudaMemcpyDeviceToHost));
}

void device_synchronize() { CUDA_CHECK(cudaDeviceSynchronize()); }

void convert_f32_to_bf16(uint16_t* out, const float* in, int64_t n, Stream stream) {
  launch_map1("convert_f32_to_bf16", out, in, n, Identity{}, stream);
}
void convert_bf16_to_f32(float* out, const uint16_t* in, int64_t n, Stream stream) {
  launch_map1("convert_bf16_to_f32", out, in, n, Identity{}, stream);
}

void add_f32(float* out, const float* a, const float* b, int64_t n, Stream stream) {
  launch_map2("add_f32", out, a, b, n, Add{}, stream);
}
void add_bf16(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n, Stream stream) {
  launch_map2("add_bf16", out, a, b, n, Add{}, stream);
}
void accumulate_f32(float* dst, const float* src, int64_t n, Stream stream) {
  launch_map2("accumulate_f32", dst, (const float*)dst, src, n, Add{}, stream);
}
void accumulate_bf16(uint16_t* dst, const uint16_t* src, int64_t n, Stream stream) {
  launch_map2("accumulate_bf16", dst, (const uint16_t*)dst, src, n, Add{}, stream);
}
void scale_f32(float* x, float s, int64_t n, Stream stream) { launch_map1("scale_f32", x, x, n, Scale{s}, stream); }
void scale_bf16(uint16_t* x, float s, int64_t n, Stream stream) {
  launch_map1("scale_bf16", x, x, n, Scale{s}, stream);
}

void gelu_forward_f32(float* out, const float* x, int64_t n, Stream stream) {
  launch_map1("gelu_forward_f32", out, x, n, GeluForward{}, stream);
}
void gelu_forward_bf16(uint16_t* out, const uint16_t* x, int64_t n, Stream stream) {
  launch_map1("gelu_forward_bf16", out, x, n, GeluForward{}, stream);
}
void gelu_backward_f32(float* dx, const float* x, const float* dout, int64_t n, Stream stream) {
  launch_map2("gelu_backward_f32", dx, x, dout, n, GeluBackward{}, stream);
}
void gelu_backward_bf16(uint16_t* dx, const uint16_t* x, const uint16_t* dout, int64_t n, Stream stream) {
  launch_map2("gelu_backward_bf16", dx, x, dout, n, GeluBackward{}, stream);
}

void swiglu_forward_f32(float* out, const float* gate_up, int64_t N, int I, Stream stream, bool gelu) {
  if (gelu) launch_swiglu_forward<true>(out, gate_up, N, I, stream);
  else launch_swiglu_forward<false>(out, gate_up, N, I, stream);
}
void swiglu_forward_bf16(uint16_t* out, const uint16_t* gate_up, int64_t N, int I, Stream stream, bool gelu) {
  if (gelu) launch_swiglu_forward<true>(out, gate_up, N, I, stream);
  else launch_swiglu_forward<false>(out, gate_up, N, I, stream);
}
void swiglu_backward_f32(float* dgate_up, const float* dout, const float* gate_up, int64_t N, int I,
                         Stream stream, bool gelu) {
  if (gelu) launch_swiglu_backward<true>(dgate_up, dout, gate_up, N, I, stream);
  else launch_swiglu_backward<false>(dgate_up, dout, gate_up, N, I, stream);
}
void swiglu_backward_bf16(uint16_t* dgate_up, const uint16_t* dout, const uint16_t* gate_up, int64_t N, int I,
                          Stream stream, bool gelu) {
  if (gelu) launch_swiglu_backward<true>(dgate_up, dout, gate_up, N, I, stream);
  else launch_swiglu_backward<false>(dgate_up, dout, gate_up, N, I, stream);
}

void adamw(float* p, uint16_t* p_bf16, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
           float beta2, float eps, float weight_decay, int spans, const int64_t* span_begin, const int64_t* span_end,
           int t, float grad_scale, Stream stream) {
  check_n(n, "adamw");
  LLMT_CHECK(t >= 1, "cuda adamw: step t must be 1-based, got %d", t);
  LLMT_CHECK(spans >= 0 && spans <= kAdamWMaxSpans, "cuda adamw: %d decay spans, expected 0 to %d", spans,
             kAdamWMaxSpans);
  if (n == 0) return;
  AdamWArgs a;
  a.lr = lr;
  a.beta1 = beta1;
  a.beta2 = beta2;
  a.eps = eps;
  a.decay = (float)(1.0 - (double)lr * (double)weight_decay);
  a.step_size = (float)((double)lr / (1.0 - std::pow((double)beta1, (double)t)));
  a.bc2_sqrt = (float)std::sqrt(1.0 - std::pow((double)beta2, (double)t));
  a.grad_scale = grad_scale;
  a.spans = spans;
  for (int s = 0; s < kAdamWMaxSpans; s++) {
    a.span_begin[s] = s < spans ? span_begin[s] : 0;
    a.span_end[s] = s < spans ? span_end[s] : 0;
  }
  constexpr int V = 4;
  if (aligned(p, 16) && aligned(g, 16) && aligned(m, 16) && aligned(v, 16) && aligned(p_bf16, 8)) {
    LLMT_LAUNCH(adamw_kernel<V>, grid_for((n + V - 1) / V), kBlock, 0, stream, p, p_bf16, g, m, v, n, a);
  } else {
    LLMT_LAUNCH(adamw_kernel<1>, grid_for(n), kBlock, 0, stream, p, p_bf16, g, m, v, n, a);
  }
  CUDA_CHECK_LAUNCH();
}

void sum_squares_f32(double* out, double* partials, const float* x, int64_t n, bool accumulate, Stream stream) {
  check_n(n, "sum_squares_f32");
  // The block count depends on n only (not on the device), so the summation order is fixed.
  constexpr int V = 4;
  const bool vec = aligned(x, 16);
  const int64_t items = vec ? (n + V - 1) / V : n;
  int64_t blocks = (items + kBlock - 1) / kBlock;
  if (blocks > kSumSquaresPartials) blocks = kSumSquaresPartials;
  if (blocks < 1) blocks = 1;
  if (vec) {
    LLMT_LAUNCH(sum_squares_partial_kernel<V>, (unsigned)blocks, kBlock, 0, stream, partials, x, n);
  } else {
    LLMT_LAUNCH(sum_squares_partial_kernel<1>, (unsigned)blocks, kBlock, 0, stream, partials, x, n);
  }
  CUDA_CHECK_LAUNCH();
  LLMT_LAUNCH(sum_squares_final_kernel, 1, 1024, 0, stream, out, partials, (int)blocks, accumulate);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cuda

}  // namespace llmt
