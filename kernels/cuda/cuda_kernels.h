// CUDA kernels with host launchers: the first subset of the Backend op set (engine/backend/backend.h),
// with the same semantics, on device pointers. A plain C++ header: include it from .cpp files without
// the CUDA headers.
//
// Conventions:
//  - Every pointer is a device pointer unless named host_*; bf16 tensors are passed as uint16_t* (the
//    raw bits, as Tensor::bf16() gives them) and are converted with round to nearest even exactly as
//    llmt::f32_to_bf16 (engine/core/tensor.h), NaN kept quiet.
//  - bf16 variants load bf16, compute in fp32, and round the result once.
//  - Launches are asynchronous on `stream` (nullptr = the default stream); a bad launch throws
//    llmt::Error, a fault inside a kernel surfaces at the next synchronizing call.
//  - n == 0 is a no-op; n < 0 is an error. Element counts and indices are 64-bit throughout.
//  - Pointers need only their element's alignment; 16-byte aligned ones get 128-bit loads and stores.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace llmt {

namespace cuda {

using Stream = CUstream_st*;

// ---- memory (the current device) ----
void* device_alloc(size_t bytes);  // zero-filled, 256-byte aligned; nullptr for 0 bytes
void device_free(void* p);         // nullptr is fine
void copy_to_device(void* dst, const void* host_src, size_t bytes);
void copy_to_host(void* host_dst, const void* src, size_t bytes);
void device_synchronize();

// ---- dtype conversion ----
void convert_f32_to_bf16(uint16_t* out, const float* in, int64_t n, Stream stream = nullptr);
void convert_bf16_to_f32(float* out, const uint16_t* in, int64_t n, Stream stream = nullptr);

// ---- elementwise ----
// out = a + b (out may alias a or b)
void add_f32(float* out, const float* a, const float* b, int64_t n, Stream stream = nullptr);
void add_bf16(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n, Stream stream = nullptr);
// dst += src
void accumulate_f32(float* dst, const float* src, int64_t n, Stream stream = nullptr);
void accumulate_bf16(uint16_t* dst, const uint16_t* src, int64_t n, Stream stream = nullptr);
// x *= s
void scale_f32(float* x, float s, int64_t n, Stream stream = nullptr);
void scale_bf16(uint16_t* x, float s, int64_t n, Stream stream = nullptr);

// ---- activations ----
// GELU, tanh form (gelu_new): out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (out may alias x).
void gelu_forward_f32(float* out, const float* x, int64_t n, Stream stream = nullptr);
void gelu_forward_bf16(uint16_t* out, const uint16_t* x, int64_t n, Stream stream = nullptr);
// dx = dout * gelu'(x) (dx may alias dout).
void gelu_backward_f32(float* dx, const float* x, const float* dout, int64_t n, Stream stream = nullptr);
void gelu_backward_bf16(uint16_t* dx, const uint16_t* x, const uint16_t* dout, int64_t n, Stream stream = nullptr);
// SwiGLU over rows of gate_up[N, 2I] = [gate | up]: out[N, I] = silu(gate) * up, silu(g) = g / (1 + exp(-g));
// with gelu, GeGLU: the tanh GELU (as gelu_forward) in silu's place.
void swiglu_forward_f32(float* out, const float* gate_up, int64_t N, int I, Stream stream = nullptr,
                        bool gelu = false);
void swiglu_forward_bf16(uint16_t* out, const uint16_t* gate_up, int64_t N, int I, Stream stream = nullptr,
                         bool gelu = false);
// dgate_up[N, 2I] (=) from dout[N, I]: dgate = dout * up * act'(gate), dup = dout * act(gate).
void swiglu_backward_f32(float* dgate_up, const float* dout, const float* gate_up, int64_t N, int I,
                         Stream stream = nullptr, bool gelu = false);
void swiglu_backward_bf16(uint16_t* dgate_up, const uint16_t* dout, const uint16_t* gate_up, int64_t N, int I,
                          Stream stream = nullptr, bool gelu = false);

// ---- optimizer ----
// AdamW as torch.optim.AdamW on fp32 p, g, m, v (step t is 1-based):
//   p *= 1 - lr*wd;  g' = g*grad_scale;  m = lerp(m, g', 1-beta1);  v = beta2 v + (1-beta2) g'^2
//   p -= lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps)
// with the decay only for elements inside the `spans` spans [span_begin[s], span_end[s]) (host
// arrays, at most kAdamWMaxSpans, passed to the kernel by value): one launch for a unit's shard.
// When p_bf16 != nullptr it also receives the bf16 rounding of the new p (the compute copy).
constexpr int kAdamWMaxSpans = 16;
void adamw(float* p, uint16_t* p_bf16, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
           float beta2, float eps, float weight_decay, int spans, const int64_t* span_begin, const int64_t* span_end,
           int t, float grad_scale, Stream stream = nullptr);

// ---- reductions ----
// Sum of x[i]^2 in double, deterministic (a fixed two-pass tree: no atomics, the same bits every run
// for the same input and pointer alignment). out[0] (=) the sum, or (+=) with accumulate, so several
// tensors' squares can be summed on the device. partials: a device scratch of kSumSquaresPartials doubles.
constexpr int kSumSquaresPartials = 1024;
void sum_squares_f32(double* out, double* partials, const float* x, int64_t n, bool accumulate = false,
                     Stream stream = nullptr);

}  // namespace cuda
}  // namespace llmt
