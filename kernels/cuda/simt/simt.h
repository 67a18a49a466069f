// The SIMT emulator: the CUDA execution model on the CPU, so the project's own .cu kernels compile
// with g++ and run in ctest against the CPU backend. Included (through cuda_platform.h) instead of
// the CUDA headers when LLMT_SIMT is defined.
//
// What it gives a kernel:
//  - every thread of a block is a fiber (Boost.Context, 64 KiB stacks); blocks are spread over
//    OpenMP threads and run one at a time on each;
//  - __syncthreads as a block-wide turn switch; __shfl_sync / _xor / _down / _up, __ballot_sync and
//    __syncwarp meet at a barrier of just the lanes in their mask, so divergent warp code and early
//    returns behave as on a GPU;
//  - the tensor-core operations of kernels/cuda/mma.cuh (mma.sync m16n8k16 bf16, ldmatrix) as
//    warp-collective operations in the PTX ISA's fragment layouts;
//  - shared memory of each block's own: static arrays through LLMT_SHARED (a bare __shared__ does not
//    compile here), dynamic bytes through LLMT_DYNAMIC_SHARED; float, double and integer atomics
//    (relaxed, as CUDA's); the fast-math intrinsics; threadIdx, blockIdx, blockDim, gridDim;
//  - the CUDA runtime calls the project uses, on host memory: streams run in order (a launch runs
//    to completion before it returns), events complete at once;
//  - several devices (LLMT_SIMT_DEVICES, default 1) over the one host memory, a current device per
//    thread, and events that belong to the device current when they were made: touching one from a
//    thread whose current device is another stops the program (on a GPU it makes a context there).
//
// As a sanitizer (docs/design.md, "The emulator as a sanitizer"), what each mode finds:
//  - synccheck, always on: a __syncthreads that some live threads of the block never reach (they
//    exited first, or wait at another __syncthreads, by source line, or at another count of it), a
//    warp operation whose lanes meet from different source lines or kinds, a lane named in a mask
//    that has exited, barriers that can never complete: each stops the kernel, naming it and the
//    threads involved.
//  - poison, on unless LLMT_SIMT_POISON=0: fresh cudaMalloc memory and every block's shared memory
//    (static and dynamic) hold 0xff bytes (NaN as f32, bf16 and f64; -1 as an integer), so a kernel
//    that reads what it never wrote computes with NaN where a GPU would hold garbage.
//  - schedule, LLMT_SIMT_SCHEDULE=forward|reverse|shuffle:SEED (default forward): the order in which
//    the runnable threads of a block run between two meetings, and the order of the blocks of a
//    grid (then on one OpenMP thread). Any order but forward runs each launch twice from the same
//    memory: forward with shared memory poisoned as above, then the order asked for with shared
//    memory holding another pattern (0x7f bytes). A byte of the kernel's writable arguments'
//    allocations that differs between the two stops the program naming the kernel: a reader that
//    depends on running after its writer, or on what shared memory held before the block wrote it.
//  - racecheck: the ThreadSanitizer build (llmt_simt_tsan_tests) runs every emulated thread as a
//    TSan fiber. __syncthreads and __syncwarp order memory among exactly the threads that meet, a
//    launch orders the host's work before every thread and a kernel's end orders its threads before
//    the host; shuffles, ballots and the tensor-core operations order nothing (CUDA guarantees
//    memory ordering for __syncthreads and __syncwarp only), ldmatrix's reads of shared memory are
//    reported as the reading lane's, atomics are TSan's atomics, and blocks run on one OS thread in
//    separate fibers. TSan then reports a shared-memory race inside a block or a global-memory race
//    between blocks with both stacks, the kernel's name in them.
// What is left to silicon: memory-model effects beyond barriers (a fence, the visibility order of
// relaxed atomics, the L1/L2 caches), timing, and host pointers handed to a kernel (they work here).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

// ---- the language ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
// Static shared memory only through LLMT_SHARED(type, name, dims) (cuda_platform.h): each block then
// has its own, poisoned, where a static thread_local would carry one block's values into the next.
#define __shared__ static_assert(false, "declare static shared memory with LLMT_SHARED(type, name, dims)");
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
using uint3 = dim3;

namespace llmt {
namespace simt {

dim3 thread_idx();  // by value: a kernel reads copies, never the emulator's own memory
dim3 block_idx();
dim3 block_dim();
dim3 grid_dim();
// Every meeting names its source line (the call site, through __builtin_FILE/__builtin_LINE), so
// threads that meet from different lines are told apart (synccheck).
void syncthreads(const char* file, int line);
// Deposits `bits` for this lane, waits for every lane in `mask`, returns what lane `src` deposited
// (this lane's own when src is outside the mask).
uint64_t exchange(unsigned mask, uint64_t bits, int src, const char* file, int line);
unsigned ballot(unsigned mask, bool pred, const char* file, int line);
void syncwarp(unsigned mask, const char* file, int line);
void* dynamic_shared();
// The block's instance of the static shared array declared at `key` (one key per declaration):
// every thread of the block gets the same bytes, poisoned when first handed out.
void* static_shared(const void* key, size_t bytes);
// The tensor-core operations of kernels/cuda/mma.cuh as warp-collective operations of all 32 lanes,
// in the PTX ISA's fragment layouts (described there): mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
// (products exact in f32, summed in k order onto c), and ldmatrix.sync.aligned.m8n8.x{n}[.trans].b16
// from the row addresses the lanes give.
// cp.async (kernels/cuda/async_copy.cuh) as the PTX ISA documents it: a copy of `bytes` from global to
// shared memory, of which the first `src_bytes` come from `src` and the rest are zeros, issued now
// and landed only when a later wait covers its group. Until then its destination holds the block's
// poison, so a read before the wait (and the barrier that shows it to other threads) sees that.
void cp_async(void* dst, const void* src, int bytes, int src_bytes);
void cp_async_commit();        // cp.async.commit_group: the copies issued since the last one
void cp_async_wait(int newest);  // cp.async.wait_group: all but the `newest` most recent groups landed
void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                       const char* file = __builtin_FILE(), int line = __builtin_LINE());
void ldmatrix(uint32_t* r, int n, bool trans, const void* row, const char* file = __builtin_FILE(),
              int line = __builtin_LINE());
// Runs `body` as a grid of blocks of threads; returns when every thread has finished. `writable` holds
// the kernel's `args` arguments as pointers where they are non-const pointers (what it may write),
// null elsewhere: under a schedule other than forward the launch runs twice and compares them.
void launch(const char* name, dim3 grid, dim3 block, size_t dynamic_shared_bytes, const std::function<void()>& body,
            const void* const* writable, int args);

template <class T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8, "shuffle of a value over 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}
inline int lane() { return (int)(thread_idx().x + block_dim().x * (thread_idx().y + block_dim().y * thread_idx().z)) % 32; }

}  // namespace simt
}  // namespace llmt

#define threadIdx (::llmt::simt::thread_idx())
#define blockIdx (::llmt::simt::block_idx())
#define blockDim (::llmt::simt::block_dim())
#define gridDim (::llmt::simt::grid_dim())

inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::llmt::simt::syncthreads(file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::llmt::simt::syncwarp(mask, file, line);
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline unsigned __ballot_sync(unsigned mask, int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::llmt::simt::ballot(mask, pred != 0, file, line);
}

template <class T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
  const int l = ::llmt::simt::lane(), base = l / width * width;
  return ::llmt::simt::from_bits<T>(
      ::llmt::simt::exchange(mask, ::llmt::simt::to_bits(v), base + src_lane % width, file, line));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
  const int l = ::llmt::simt::lane(), base = l / width * width, src = l ^ lane_mask;
  return ::llmt::simt::from_bits<T>(
      ::llmt::simt::exchange(mask, ::llmt::simt::to_bits(v), src >= base + width ? l : src, file, line));
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
  const int l = ::llmt::simt::lane(), base = l / width * width, src = l + (int)delta;
  return ::llmt::simt::from_bits<T>(
      ::llmt::simt::exchange(mask, ::llmt::simt::to_bits(v), src >= base + width ? l : src, file, line));
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
  const int l = ::llmt::simt::lane(), base = l / width * width, src = l - (int)delta;
  return ::llmt::simt::from_bits<T>(
      ::llmt::simt::exchange(mask, ::llmt::simt::to_bits(v), src < base ? l : src, file, line));
}

// Dynamic shared memory: LLMT_DYNAMIC_SHARED(float) is a float* to the launch's dynamic bytes.
#define LLMT_DYNAMIC_SHARED(type) ((type*)::llmt::simt::dynamic_shared())

// ---- atomics (blocks run concurrently on OS threads) ----
// Relaxed, as CUDA's atomics are: they order no other memory access, so under ThreadSanitizer they
// make no happens-before edge that a GPU would not have.
inline float atomicAdd(float* addr, float v) {
  uint32_t old = __atomic_load_n((uint32_t*)addr, __ATOMIC_RELAXED), next;
  do {
    float f;
    std::memcpy(&f, &old, 4);
    f += v;
    std::memcpy(&next, &f, 4);
  } while (!__atomic_compare_exchange_n((uint32_t*)addr, &old, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  float r;
  std::memcpy(&r, &old, 4);
  return r;
}
inline double atomicAdd(double* addr, double v) {
  uint64_t old = __atomic_load_n((uint64_t*)addr, __ATOMIC_RELAXED), next;
  do {
    double f;
    std::memcpy(&f, &old, 8);
    f += v;
    std::memcpy(&next, &f, 8);
  } while (!__atomic_compare_exchange_n((uint64_t*)addr, &old, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  double r;
  std::memcpy(&r, &old, 8);
  return r;
}
inline int atomicAdd(int* addr, int v) { return __atomic_fetch_add(addr, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned* addr, unsigned v) { return __atomic_fetch_add(addr, v, __ATOMIC_RELAXED); }
inline unsigned long long atomicAdd(unsigned long long* addr, unsigned long long v) {
  return __atomic_fetch_add(addr, v, __ATOMIC_RELAXED);
}
inline int atomicCAS(int* addr, int expected, int desired) {
  __atomic_compare_exchange_n(addr, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return expected;
}
inline int atomicMax(int* addr, int v) {
  int old = __atomic_load_n(addr, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(addr, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}

// ---- intrinsics ----
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline int __float_as_int(float f) { return (int)__float_as_uint(f); }
inline float __int_as_float(int i) { return __uint_as_float((uint32_t)i); }
inline long long __double_as_longlong(double d) {
  long long u;
  std::memcpy(&u, &d, 8);
  return u;
}
inline double __longlong_as_double(long long u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}
template <class T>
T __ldg(const T* p) {
  return *p;
}

// ---- the CUDA runtime, on host memory ----
typedef int cudaError_t;
enum : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
};
struct CUstream_st;
struct CUevent_st;
typedef CUstream_st* cudaStream_t;
typedef CUevent_st* cudaEvent_t;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaDeviceAttr { cudaDevAttrClockRate = 13, cudaDevAttrMultiProcessorCount = 16 };
struct cudaDeviceProp {
  char name[256];
  int multiProcessorCount;
  size_t totalGlobalMem;
  int major, minor;
};

cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t err);
const char* cudaGetErrorString(cudaError_t err);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDriverGetVersion(int* v);
cudaError_t cudaRuntimeGetVersion(int* v);
cudaError_t cudaStreamCreate(cudaStream_t* s);
enum { cudaStreamDefault = 0, cudaStreamNonBlocking = 1 };
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t* e);
enum { cudaEventDefault = 0, cudaEventDisableTiming = 2 };
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventQuery(cudaEvent_t e);  // cudaSuccess: work is done when it returns
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
// Milliseconds between two recorded events: the host's clock at each record (the emulator runs a
// stream's work when it is issued, so that is when the stream reached the event).
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
namespace llmt {
namespace simt {
// A kernel's dynamic shared memory above 48 KiB must be asked for, as on a GPU (LLMT_MAX_DYNAMIC_SHARED,
// cuda_platform.h): by the kernel as LLMT_LAUNCH spells it. A launch that asks for more than its kernel
// was allowed is an error. The emulator's limit is an H100's: 227 KiB.
cudaError_t set_max_dynamic_shared(const char* kernel, int bytes);
}  // namespace simt
}  // namespace llmt

namespace llmt {
namespace simt {
// Opens device memory to host code for the object's lifetime: what a launch and a copy hold, and
// what the CPU stand-ins of libraries that work on device buffers take (NCCL, simt/nccl_simt.h).
// Under protection keys it opens the calling thread only, so work spread over OpenMP threads makes
// one in each (a launch, cublaslt_simt.cpp).
class HostAccess {
 public:
  HostAccess();
  ~HostAccess();
  HostAccess(const HostAccess&) = delete;
  HostAccess& operator=(const HostAccess&) = delete;
};
// How host code is kept out of device memory in this process: "protection keys", "mprotect" (where
// the CPU or kernel has no keys, or LLMT_SIMT_GUARD=mprotect) or "none (AddressSanitizer)".
const char* device_memory_guard();
// The sanitizer modes in force (simt.h's header): whether fresh memory is poisoned, and the schedule.
bool poisons_memory();
const char* schedule_name();
}  // namespace simt
}  // namespace llmt

// The kernel launch: <<<grid, block, shared bytes, stream>>> under nvcc, the emulator here. The
// arguments are evaluated once, at the launch, and every thread gets its copy, as on a GPU.
namespace llmt {
namespace simt {
template <class T>
const void* writable_arg(const T& a) {
  if constexpr (std::is_pointer<T>::value && !std::is_const<typename std::remove_pointer<T>::type>::value)
    return (const void*)a;
  else
    return nullptr;
}
template <class F, class... A>
void launch_with(const char* name, dim3 grid, dim3 block, size_t shared_bytes, F kernel, A... args) {
  const void* writable[] = {writable_arg(args)..., nullptr};
  launch(name, grid, block, shared_bytes, [&] { kernel(args...); }, writable, (int)sizeof...(A));
}
}  // namespace simt
}  // namespace llmt
#define LLMT_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                                        \
  ((void)(stream), ::llmt::simt::launch_with(#kernel, dim3(grid), dim3(block), (shared_bytes),              \
                                             [](auto... kernel_args) { kernel(kernel_args...); }, __VA_ARGS__))
