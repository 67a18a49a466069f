// The SIMT emulator's scheduler and runtime (kernels/cuda/simt/simt.h says what it models and what it
// cannot see). Compiled only into the emulated build (LLMT_SIMT).
#include "kernels/cuda/simt/simt.h"

#include <omp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <boost/context/fiber.hpp>
#include <boost/context/pooled_fixedsize_stack.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/core/error.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define LLMT_SIMT_ASAN 1
#endif

namespace llmt {
namespace simt {

namespace {

namespace ctx = boost::context;

constexpr size_t kStackBytes = 64 * 1024;
constexpr int kWarp = 32;
constexpr unsigned kMaxBlockThreads = 1024;

enum class Wait { none, block, warp, done };

struct Thread {
  dim3 idx;
  int linear = 0;
  const void* stack_bottom = nullptr;  // for AddressSanitizer's fiber switches
  size_t stack_size = 0;
  void* fake_stack = nullptr;
  ctx::fiber fiber;  // resumes this thread
  ctx::fiber sink;   // inside the thread: resumes the scheduler
  Wait wait = Wait::none;
  unsigned mask = 0;        // the warp operation's lanes
  uint64_t snapshot[kWarp];  // what the lanes of the warp deposited, as of the meeting
};

struct Block {
  const char* name = "";
  dim3 idx, dim, grid;
  std::vector<Thread> threads;
  std::vector<uint64_t> slots;  // [warp][lane]: values deposited for a warp operation
  void* smem = nullptr;
  const std::function<void()>* body = nullptr;
  std::exception_ptr error;
  bool aborting = false;  // after an error: every waiting thread leaves its barrier by throwing Abort
  const void* sched_bottom = nullptr;  // the scheduler's stack, for AddressSanitizer
  size_t sched_size = 0;
};

// Thrown inside a fiber to end it when its block is given up (no forced unwinding: it would switch
// stacks behind AddressSanitizer's back).
struct Abort {};

// Stacks from a per-OS-thread pool, their bounds kept for AddressSanitizer.
struct RecordingStack {
  boost::context::pooled_fixedsize_stack* pool;
  Thread* thread;
  boost::context::stack_context allocate() {
    boost::context::stack_context sc = pool->allocate();
    thread->stack_bottom = (char*)sc.sp - sc.size;
    thread->stack_size = sc.size;
    return sc;
  }
  void deallocate(boost::context::stack_context& sc) { pool->deallocate(sc); }
};

thread_local Block* g_block = nullptr;
thread_local Thread* g_thread = nullptr;
thread_local cudaError_t g_last_error = cudaSuccess;

const dim3 kZero(0, 0, 0);

Block& block() {
  LLMT_CHECK(g_block, "simt: a device function was called outside a kernel launch");
  return *g_block;
}

// AddressSanitizer must be told of every stack switch (a no-op without it).
void switching_to(void** fake_save, const void* bottom, size_t size) {
#ifdef LLMT_SIMT_ASAN
  __sanitizer_start_switch_fiber(fake_save, bottom, size);
#else
  (void)fake_save, (void)bottom, (void)size;
#endif
}
void switched(void* fake, const void** old_bottom, size_t* old_size) {
#ifdef LLMT_SIMT_ASAN
  __sanitizer_finish_switch_fiber(fake, old_bottom, old_size);
#else
  (void)fake, (void)old_bottom, (void)old_size;
#endif
}

// Leaves the fiber for the scheduler until released from `w`.
void yield(Wait w) {
  Thread* t = g_thread;
  Block* b = g_block;
  t->wait = w;
  switching_to(&t->fake_stack, b->sched_bottom, b->sched_size);
  t->sink = std::move(t->sink).resume();
  switched(t->fake_stack, nullptr, nullptr);
  if (b->aborting) throw Abort{};
}

// The lanes of this thread's warp in `mask` meet; returns the values they deposited.
const uint64_t* warp_meet(unsigned mask, uint64_t bits) {
  Block& b = block();
  Thread& t = *g_thread;
  const int lane = t.linear % kWarp, warp = t.linear / kWarp;
  if (!((mask >> lane) & 1u))
    throw Error(strformat("simt: kernel %s, thread %d: a warp operation whose mask 0x%08x leaves out its own lane %d",
                          b.name, t.linear, mask, lane));
  b.slots[(size_t)warp * kWarp + lane] = bits;
  t.mask = mask;
  yield(Wait::warp);
  return t.snapshot;
}

std::string describe_waits(const Block& b) {
  std::string s;
  for (const Thread& t : b.threads) {
    if (t.wait == Wait::done) continue;
    s += strformat("%s%d:%s", s.empty() ? "" : " ", t.linear,
                   t.wait == Wait::block ? "__syncthreads" : t.wait == Wait::warp ? strformat("warp 0x%08x", t.mask).c_str()
                                                                                   : "running");
    if (s.size() > 400) return s + " ...";
  }
  return s;
}

// Releases the warp meetings that are complete; throws where one never can be. Returns whether any
// lane was released.
bool release_warps(Block& b) {
  bool released = false;
  const int n = (int)b.threads.size();
  for (int w = 0; w * kWarp < n; w++) {
    for (int l = 0; l < kWarp && w * kWarp + l < n; l++) {
      Thread& t = b.threads[(size_t)w * kWarp + l];
      if (t.wait != Wait::warp) continue;
      const unsigned m = t.mask;
      bool complete = true;
      for (int k = 0; k < kWarp; k++) {
        if (!((m >> k) & 1u)) continue;
        const int id = w * kWarp + k;
        if (id >= n)
          throw Error(strformat("simt: kernel %s: warp %d's mask 0x%08x names lane %d, which the block of %d threads "
                                "does not have", b.name, w, m, k, n));
        const Thread& o = b.threads[(size_t)id];
        if (o.wait == Wait::done)
          throw Error(strformat("simt: kernel %s: thread %d waits in a warp operation with mask 0x%08x, but lane %d "
                                "(thread %d) has already exited", b.name, t.linear, m, k, id));
        if (o.wait != Wait::warp || o.mask != m) complete = false;
      }
      if (!complete) continue;
      for (int k = 0; k < kWarp; k++) {
        if (!((m >> k) & 1u)) continue;
        Thread& o = b.threads[(size_t)w * kWarp + k];
        std::memcpy(o.snapshot, &b.slots[(size_t)w * kWarp], sizeof(o.snapshot));
        o.wait = Wait::none;
      }
      released = true;
    }
  }
  return released;
}

void run_block(Block& b) {
  static thread_local ctx::pooled_fixedsize_stack stacks(kStackBytes);
  const unsigned n = b.dim.x * b.dim.y * b.dim.z;
  b.threads.resize(n);
  b.slots.assign(((size_t)n + kWarp - 1) / kWarp * kWarp, 0);
  for (unsigned i = 0; i < n; i++) {
    Thread& t = b.threads[i];
    t.linear = (int)i;
    t.idx = dim3(i % b.dim.x, i / b.dim.x % b.dim.y, i / (b.dim.x * b.dim.y));
    t.fiber = ctx::fiber(std::allocator_arg, RecordingStack{&stacks, &t}, [&b, i](ctx::fiber&& sink) {
      Thread& me = b.threads[i];
      switched(nullptr, &b.sched_bottom, &b.sched_size);
      me.sink = std::move(sink);
      try {
        if (!b.aborting) (*b.body)();
      } catch (const Abort&) {
      } catch (...) {
        if (!b.error) b.error = std::current_exception();
      }
      me.wait = Wait::done;
      switching_to(nullptr, b.sched_bottom, b.sched_size);  // this fiber's stack is finished with
      return std::move(me.sink);
    });
  }
  g_block = &b;
  auto resume = [&](Thread& t) {
    g_thread = &t;
    void* fake = nullptr;
    switching_to(&fake, t.stack_bottom, t.stack_size);
    t.fiber = std::move(t.fiber).resume();
    switched(fake, nullptr, nullptr);
    g_thread = nullptr;
  };
  for (;;) {
    bool ran = false;
    for (Thread& t : b.threads) {
      if (t.wait != Wait::none) continue;
      resume(t);
      ran = true;
      if (b.error) break;
    }
    if (b.error) break;
    size_t live = 0, at_block = 0;
    for (const Thread& t : b.threads) {
      live += t.wait != Wait::done;
      at_block += t.wait == Wait::block;
    }
    if (live == 0) break;
    bool released = false;
    try {
      released = release_warps(b);
    } catch (...) {
      b.error = std::current_exception();
      break;
    }
    if (at_block == live) {  // every thread still running is at __syncthreads
      for (Thread& t : b.threads)
        if (t.wait == Wait::block) t.wait = Wait::none;
      released = true;
    }
    if (!ran && !released) {
      b.error = std::make_exception_ptr(Error(strformat(
          "simt: kernel %s, block (%u,%u,%u): threads wait at barriers that can never complete: %s", b.name, b.idx.x,
          b.idx.y, b.idx.z, describe_waits(b).c_str())));
      break;
    }
  }
  if (b.error) {  // give the block up: every thread still waiting leaves by throwing Abort
    b.aborting = true;
    for (Thread& t : b.threads)
      if (t.wait != Wait::done) {
        t.wait = Wait::none;
        resume(t);
      }
  }
  g_block = nullptr;
  b.threads.clear();
}

}  // namespace

const dim3& thread_idx() { return g_thread ? g_thread->idx : kZero; }
const dim3& block_idx() { return block().idx; }
const dim3& block_dim() { return block().dim; }
const dim3& grid_dim() { return block().grid; }
void syncthreads() {
  block();
  yield(Wait::block);
}
uint64_t exchange(unsigned mask, uint64_t bits, int src) {
  const uint64_t* got = warp_meet(mask, bits);
  return src >= 0 && src < kWarp && ((mask >> src) & 1u) ? got[src] : bits;
}
// The 32 lanes' values of one 64-bit deposit each, as every lane of a full warp sees them.
static void gather_warp(uint64_t bits, uint64_t all[kWarp]) {
  std::memcpy(all, warp_meet(0xffffffffu, bits), sizeof(uint64_t) * kWarp);
}
static float bf16_bits_to_f32(uint32_t h) {
  const uint32_t u = (h & 0xffffu) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  uint64_t a01[kWarp], a23[kWarp], b01[kWarp];
  gather_warp((uint64_t)a[0] | (uint64_t)a[1] << 32, a01);
  gather_warp((uint64_t)a[2] | (uint64_t)a[3] << 32, a23);
  gather_warp((uint64_t)b[0] | (uint64_t)b[1] << 32, b01);
  float A[16][16], B[16][8];
  for (int l = 0; l < kWarp; l++) {  // every lane's registers back into the matrices
    const int g = l / 4, t = l % 4;
    const uint32_t ar[4] = {(uint32_t)a01[l], (uint32_t)(a01[l] >> 32), (uint32_t)a23[l], (uint32_t)(a23[l] >> 32)};
    const uint32_t br[2] = {(uint32_t)b01[l], (uint32_t)(b01[l] >> 32)};
    for (int e = 0; e < 2; e++) {
      A[g][2 * t + e] = bf16_bits_to_f32(ar[0] >> (16 * e));
      A[g + 8][2 * t + e] = bf16_bits_to_f32(ar[1] >> (16 * e));
      A[g][2 * t + 8 + e] = bf16_bits_to_f32(ar[2] >> (16 * e));
      A[g + 8][2 * t + 8 + e] = bf16_bits_to_f32(ar[3] >> (16 * e));
      B[2 * t + e][g] = bf16_bits_to_f32(br[0] >> (16 * e));
      B[2 * t + 8 + e][g] = bf16_bits_to_f32(br[1] >> (16 * e));
    }
  }
  const int l = lane(), g = l / 4, t = l % 4;
  for (int i = 0; i < 4; i++) {  // this lane's part of D, where its c sits
    const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
    float acc = c[i];
    for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
    d[i] = acc;
  }
}

void ldmatrix(uint32_t* r, int n, bool trans, const void* row) {
  if (n != 1 && n != 2 && n != 4) throw Error(strformat("simt: ldmatrix of %d matrices (1, 2 or 4)", n));
  uint64_t rows[kWarp];
  gather_warp((uint64_t)(uintptr_t)row, rows);
  const int l = lane();
  for (int j = 0; j < n; j++) {
    uint32_t v = 0;
    for (int e = 0; e < 2; e++) {
      // matrix j's rows come from lanes 8j..8j+7; each row is 8 b16 elements
      const int r_ = trans ? 2 * (l % 4) + e : l / 4, c_ = trans ? l / 4 : 2 * (l % 4) + e;
      const uint16_t* p = (const uint16_t*)(uintptr_t)rows[8 * j + r_];
      v |= (uint32_t)p[c_] << (16 * e);
    }
    r[j] = v;
  }
}

unsigned ballot(unsigned mask, bool pred) {
  const uint64_t* got = warp_meet(mask, pred ? 1 : 0);
  unsigned r = 0;
  for (int l = 0; l < kWarp; l++)
    if (((mask >> l) & 1u) && got[l]) r |= 1u << l;
  return r;
}
void syncwarp(unsigned mask) { warp_meet(mask, 0); }
void* dynamic_shared() { return block().smem; }

// ---- device memory ----
// Device memory is host memory here, so host code that reads a device buffer directly (which on a
// GPU crashes or reads garbage) would pass unseen. The guard closes that hole: cudaMalloc carves
// device buffers out of one reserved arena that host code cannot reach except while a kernel runs or
// a cudaMemcpy / cudaMemset (or a stand-in, HostAccess) works on it, so such a host access stops the
// program with a message. Two ways to close it:
// - protection keys (x86 PKU, where the CPU and the kernel offer them): the arena's pages carry a key
//   of their own and a thread reaches them only while its PKRU register allows that key. Opening and
//   closing is one unprivileged instruction on the thread doing the work, so a launch costs nothing.
// - mprotect, elsewhere (or with LLMT_SIMT_GUARD=mprotect): each open and close rewrites the page
//   tables of the whole handed-out arena, for every thread at once. That was 95% of the emulated
//   model tests' time (32.9 s against 1.6 s with keys, docs/design.md), which is why keys come first.
//   A thread starts with its maker's PKRU: one made while its maker has the arena open keeps it open.
// Under AddressSanitizer buffers are exact-sized heap blocks instead (so a kernel's one-past-the-end
// access is reported), without the guard.
#ifndef LLMT_SIMT_ASAN
constexpr size_t kArenaBytes = (size_t)1 << 37;  // 128 GiB of address space, reserved, not committed
char* g_arena = nullptr;
size_t g_arena_used = 0;                       // the bump pointer: [g_arena, g_arena + used) was handed out
std::multimap<size_t, char*> g_free_chunks;     // freed chunks by size, for reuse
std::map<char*, size_t> g_chunk_bytes;          // every live chunk's size
int g_open = 0;                                 // mprotect guard: device work in progress (launches, copies)
thread_local int t_open = 0;                    // protection keys: this thread's open accesses
std::mutex g_mem_mutex;
struct sigaction g_previous_segv;

void on_segv(int sig, siginfo_t* info, void* uctx) {
  const char* a = (const char*)info->si_addr;
  if (g_arena && a >= g_arena && a < g_arena + kArenaBytes) {
    const char msg[] =
        "simt: the host touched device memory outside a kernel or a cudaMemcpy/cudaMemset. On a GPU this "
        "reads garbage or crashes: copy the data with the backend (copy_to_host / copy_from_host).\n";
    ssize_t ignored = write(2, msg, sizeof(msg) - 1);
    (void)ignored;
    std::abort();
  }
  if (g_previous_segv.sa_flags & SA_SIGINFO) {
    g_previous_segv.sa_sigaction(sig, info, uctx);
  } else if (g_previous_segv.sa_handler != SIG_DFL && g_previous_segv.sa_handler != SIG_IGN) {
    g_previous_segv.sa_handler(sig);
  } else {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

// The arena's protection key, made at the first use of device memory; -1: the mprotect guard. The
// key starts closed on this thread, and on every other: Linux gives each thread a PKRU that denies
// keys other than 0 until it opens them.
int arena_key() {
  static const int key = [] {
    const char* want = std::getenv("LLMT_SIMT_GUARD");
    return want && std::strcmp(want, "mprotect") == 0 ? -1 : pkey_alloc(0, PKEY_DISABLE_ACCESS);
  }();
  return key;
}

void set_device_access(bool open) {
  if (g_arena_used) mprotect(g_arena, g_arena_used, open ? PROT_READ | PROT_WRITE : PROT_NONE);
}

void* device_malloc(size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  if (!g_arena) {
    void* p = mmap(nullptr, kArenaBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    g_arena = (char*)p;
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_previous_segv);
  }
  const size_t page = 4096, want = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  char* p = nullptr;
  auto it = g_free_chunks.lower_bound(want);
  if (it != g_free_chunks.end() && it->first <= 2 * want) {  // reuse a freed chunk of about this size
    p = it->second;
    g_chunk_bytes[p] = it->first;
    g_free_chunks.erase(it);
  } else {
    if (g_arena_used + want > kArenaBytes) return nullptr;
    p = g_arena + g_arena_used;
    g_arena_used += want;
    g_chunk_bytes[p] = want;
  }
  if (arena_key() < 0) {
    mprotect(p, g_chunk_bytes[p], g_open ? PROT_READ | PROT_WRITE : PROT_NONE);
  } else if (pkey_mprotect(p, g_chunk_bytes[p], PROT_READ | PROT_WRITE, arena_key()) != 0) {
    g_free_chunks.emplace(g_chunk_bytes[p], p);  // not handed out after all
    g_chunk_bytes.erase(p);
    return nullptr;
  }
  return p;
}

bool device_free(void* p) {
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  auto it = g_chunk_bytes.find((char*)p);
  if (it == g_chunk_bytes.end()) return false;
  g_free_chunks.emplace(it->second, it->first);
  g_chunk_bytes.erase(it);
  return true;
}

#endif

void launch(const char* name, dim3 grid, dim3 blk, size_t dynamic_shared_bytes, const std::function<void()>& body) {
  const uint64_t threads = (uint64_t)blk.x * blk.y * blk.z, blocks = (uint64_t)grid.x * grid.y * grid.z;
  if (threads == 0 || threads > kMaxBlockThreads || blocks == 0) {
    g_last_error = cudaErrorInvalidConfiguration;
    return;
  }
  HostAccess open;  // this thread (under mprotect: all of them, for the whole launch)
  std::exception_ptr first;
  std::mutex m;
#pragma omp parallel
  {
  HostAccess open_here;  // each worker's own, under protection keys
#pragma omp for schedule(dynamic, 1)
  for (int64_t i = 0; i < (int64_t)blocks; i++) {
    Block b;
    b.name = name;
    b.grid = grid;
    b.dim = blk;
    b.idx = dim3((unsigned)(i % grid.x), (unsigned)(i / grid.x % grid.y), (unsigned)(i / ((int64_t)grid.x * grid.y)));
    b.body = &body;
    std::unique_ptr<void, void (*)(void*)> smem(
        dynamic_shared_bytes ? std::aligned_alloc(64, (dynamic_shared_bytes + 63) / 64 * 64) : nullptr, std::free);
    b.smem = smem.get();
    try {
      run_block(b);
    } catch (...) {
      b.error = std::current_exception();
    }
    if (b.error) {
      std::lock_guard<std::mutex> lock(m);
      if (!first) first = b.error;
    }
  }
  }
  if (first) std::rethrow_exception(first);
}

#ifndef LLMT_SIMT_ASAN
// With protection keys the calling thread opens; with mprotect every thread does.
HostAccess::HostAccess() {
  const int key = arena_key();
  if (key >= 0) {
    if (t_open++ == 0) pkey_set(key, 0);
    return;
  }
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  if (g_open++ == 0) set_device_access(true);
}
HostAccess::~HostAccess() {
  const int key = arena_key();
  if (key >= 0) {
    if (--t_open == 0) pkey_set(key, PKEY_DISABLE_ACCESS);
    return;
  }
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  if (--g_open == 0) set_device_access(false);
}
const char* device_memory_guard() { return arena_key() >= 0 ? "protection keys" : "mprotect"; }
#else
HostAccess::HostAccess() {}
HostAccess::~HostAccess() {}
const char* device_memory_guard() { return "none (AddressSanitizer)"; }
#endif

}  // namespace simt
}  // namespace llmt

using llmt::simt::g_last_error;

// ---- the runtime ----

// Under AddressSanitizer exactly the bytes asked for (256-byte aligned, as cudaMalloc's), so a kernel
// that reads or writes one element past its buffer is reported; otherwise a guarded arena chunk.
cudaError_t cudaMalloc(void** p, size_t bytes) {
#ifdef LLMT_SIMT_ASAN
  if (posix_memalign(p, 256, std::max<size_t>(bytes, 1)) != 0) *p = nullptr;
#else
  *p = llmt::simt::device_malloc(bytes);
#endif
  return *p ? cudaSuccess : (g_last_error = cudaErrorMemoryAllocation);
}
cudaError_t cudaFree(void* p) {
#ifdef LLMT_SIMT_ASAN
  std::free(p);
#else
  if (p && !llmt::simt::device_free(p)) return g_last_error = cudaErrorInvalidValue;
#endif
  return cudaSuccess;
}
// pinned host memory: plain host memory
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  if (posix_memalign(p, 256, std::max<size_t>(bytes, 1)) != 0) *p = nullptr;
  return *p ? cudaSuccess : (g_last_error = cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  llmt::simt::HostAccess open;
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  llmt::simt::HostAccess open;
  if (bytes) std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) { return cudaMemset(p, value, bytes); }
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = *total_bytes = (size_t)16 << 30;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaGetLastError() {
  cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return g_last_error; }
const char* cudaGetErrorName(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
  }
  return "unknown error";
}
// Devices: LLMT_SIMT_DEVICES of them (default 1, at most 8), all backed by the same host memory,
// and a current device per thread as the runtime keeps one (0 until the thread sets another). What
// the emulator checks with it is which device a thread's calls act on: an event belongs to the
// device current when it was made, and recording, querying or waiting for it from a thread whose
// current device is another stops the program. On a GPU the query works but makes a context on the
// thread's device (device 0 for a thread that never chose one): every rank of a node would hold
// memory on GPU 0 (docs/design.md, "The watchdog").
static int simt_device_count() {
  static const int n = [] {
    const char* v = std::getenv("LLMT_SIMT_DEVICES");
    const int d = v && *v ? std::atoi(v) : 1;
    return d >= 1 && d <= 8 ? d : 1;
  }();
  return n;
}
static thread_local int t_current_device = 0;

cudaError_t cudaGetDevice(int* device) {
  *device = t_current_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= simt_device_count()) return g_last_error = cudaErrorInvalidDevice;
  t_current_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* count) {
  *count = simt_device_count();
  return cudaSuccess;
}
// A small "device": few SMs keep grids (and so fibers) few.
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  *value = attr == cudaDevAttrMultiProcessorCount ? 2 : 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= simt_device_count()) return g_last_error = cudaErrorInvalidDevice;
  std::memset(prop, 0, sizeof(*prop));
  std::strncpy(prop->name, "llmt SIMT emulator (CPU)", sizeof(prop->name) - 1);
  prop->multiProcessorCount = 2;
  prop->totalGlobalMem = (size_t)16 << 30;
  prop->major = 9;
  prop->minor = 0;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = 0;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = 0;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = nullptr;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
struct CUevent_st {
  int device;  // current when the event was made
  std::chrono::steady_clock::time_point at{};  // when it was last recorded
  bool recorded = false;
};
// Stops the program when `e` belongs to another device than the calling thread's current one.
static void check_event_device(cudaEvent_t e, const char* call) {
  if (!e || e->device == t_current_device) return;
  std::fprintf(stderr,
               "simt: %s of an event of device %d from a thread whose current device is %d. On a GPU this makes a "
               "context on device %d (call cudaSetDevice(%d) on this thread first).\n",
               call, e->device, t_current_device, t_current_device, e->device);
  std::abort();
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new CUevent_st{t_current_device, {}, false};
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventQuery(cudaEvent_t e) {
  check_event_device(e, "cudaEventQuery");
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  check_event_device(e, "cudaEventDestroy");
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  check_event_device(e, "cudaEventRecord");
  e->at = std::chrono::steady_clock::now();
  e->recorded = true;
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms || !start || !end || !start->recorded || !end->recorded) return cudaErrorInvalidValue;
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  check_event_device(e, "cudaEventSynchronize");
  return cudaSuccess;
}
