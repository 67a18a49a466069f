// The SIMT emulator's scheduler and runtime (kernels/cuda/simt/simt.h says what it models and what it
// cannot see). Compiled only into the emulated build (LLMT_SIMT).
#include "kernels/cuda/simt/simt.h"

#include <omp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <boost/context/fiber.hpp>
#include <boost/context/pooled_fixedsize_stack.hpp>
#include <chrono>
#include <atomic>
#include <climits>
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
#include "engine/core/rng.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define LLMT_SIMT_ASAN 1
#endif

// The ThreadSanitizer build (llmt_simt_tsan_tests) defines LLMT_SIMT_TSAN and compiles this file
// without -fsanitize=thread: the emulator's own bookkeeping is not the kernels' memory, and what it
// does for them it tells TSan through these calls (libtsan's interface).
#ifdef LLMT_SIMT_TSAN
extern "C" {
void* __tsan_get_current_fiber(void);
void* __tsan_create_fiber(unsigned flags);
void __tsan_switch_to_fiber(void* fiber, unsigned flags);
void __tsan_set_fiber_name(void* fiber, const char* name);
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
void __tsan_read1(void* addr);
void __tsan_read2(void* addr);
void __tsan_write4(void* addr);
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
void AnnotateIgnoreWritesBegin(const char* file, int line);
void AnnotateIgnoreWritesEnd(const char* file, int line);
}
constexpr unsigned kTsanNoSync = 1;  // __tsan_switch_to_fiber_no_sync: a switch orders nothing
#endif
#if defined(LLMT_SIMT_ASAN) || defined(LLMT_SIMT_TSAN)
#define LLMT_SIMT_HEAP 1  // device buffers are exact-sized heap blocks, without the arena's guard
#endif

namespace llmt {
namespace simt {

namespace {

namespace ctx = boost::context;

constexpr size_t kStackBytes = 64 * 1024;
constexpr int kWarp = 32;
constexpr unsigned kMaxBlockThreads = 1024;
constexpr size_t kMaxStaticShared = 48 * 1024;  // a block's static __shared__ bytes on every GPU llmt targets
constexpr uint8_t kPoison = 0xff;              // NaN as f32, bf16 and f64; -1 as an integer
constexpr uint8_t kOtherPoison = 0x7f;         // shared memory's pattern in a schedule's second run

// ---- the sanitizer modes' settings (simt.h) ----

enum class Order { forward, reverse, shuffle };
struct Schedule {
  Order order = Order::forward;
  uint64_t seed = 0;
  std::string text = "forward";
};

const Schedule& schedule() {
  static const Schedule s = [] {
    Schedule r;
    const char* v = std::getenv("LLMT_SIMT_SCHEDULE");
    if (!v || !*v || std::strcmp(v, "forward") == 0) return r;
    r.text = v;
    char* end = nullptr;
    if (std::strcmp(v, "reverse") == 0) {
      r.order = Order::reverse;
    } else if (std::strncmp(v, "shuffle:", 8) == 0 && v[8] && (r.seed = std::strtoull(v + 8, &end, 10), !*end)) {
      r.order = Order::shuffle;
    } else {
      throw Error(strformat("LLMT_SIMT_SCHEDULE=%s: expected forward, reverse or shuffle:SEED (SEED an integer)", v));
    }
    return r;
  }();
  return s;
}

bool poison() {
  static const bool on = [] {
    const char* v = std::getenv("LLMT_SIMT_POISON");
    if (!v || !*v || std::strcmp(v, "1") == 0) return true;
    if (std::strcmp(v, "0") == 0) return false;
    throw Error(strformat("LLMT_SIMT_POISON=%s: expected 1 (the default: poison fresh memory) or 0", v));
  }();
  return on;
}

// ---- blocks and their threads ----

enum class Wait { none, block, warp, done };
enum class Op { syncthreads, shfl, ballot, syncwarp, mma, ldmatrix };
const char* op_name(Op op) {
  switch (op) {
    case Op::syncthreads: return "__syncthreads";
    case Op::shfl: return "a shuffle";
    case Op::ballot: return "__ballot_sync";
    case Op::syncwarp: return "__syncwarp";
    case Op::mma: return "mma.sync";
    case Op::ldmatrix: return "ldmatrix";
  }
  return "?";
}

// Racecheck: memory the emulator hands a block (shared memory, fiber stacks) is allocated, filled and
// freed with TSan ignoring the calling fiber's accesses. An allocation made so starts with no history
// (the same address served an earlier block's threads, which nothing orders before this block's),
// and a free made so is not a write racing with the threads that used it.
struct IgnoreWrites {
#ifdef LLMT_SIMT_TSAN
  IgnoreWrites() { AnnotateIgnoreWritesBegin(__FILE__, __LINE__); }
  ~IgnoreWrites() { AnnotateIgnoreWritesEnd(__FILE__, __LINE__); }
#else
  IgnoreWrites() {}
  ~IgnoreWrites() {}
#endif
};
void* alloc_shared(size_t bytes, uint8_t fill) {
  IgnoreWrites quiet;
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  LLMT_CHECK(p, "simt: out of host memory for a block's shared memory");
  std::memset(p, fill, bytes);
  return p;
}
void fill_shared(void* p, size_t bytes, uint8_t fill) {
  IgnoreWrites quiet;
  std::memset(p, fill, bytes);
}
void free_shared(void* p) {
  IgnoreWrites quiet;
  std::free(p);
}

// Where a thread waits: the kind of meeting and its source line.
struct Site {
  Op op = Op::shfl;
  const char* file = "";
  int line = 0;
  bool same(const Site& o) const {
    return op == o.op && line == o.line && (file == o.file || std::strcmp(file, o.file) == 0);
  }
};

// One cp.async not yet landed: group -1 until a commit_group takes it.
struct AsyncCopy {
  void* dst;
  const void* src;
  int bytes, src_bytes, group;
};
constexpr int kMaxAsyncCopies = 64;

struct Thread {
  dim3 idx;
  int linear = 0;
  const void* stack_bottom = nullptr;  // for AddressSanitizer's fiber switches
  size_t stack_size = 0;
  void* fake_stack = nullptr;
  ctx::fiber fiber;  // resumes this thread
  ctx::fiber sink;   // inside the thread: resumes the scheduler
  Wait wait = Wait::none;
  Site site;                 // of the meeting it waits at (block or warp)
  int barriers = 0;          // __syncthreads passed
  unsigned mask = 0;         // the warp operation's lanes
  uint64_t snapshot[kWarp];  // what the lanes of the warp deposited, as of the meeting
  int warp_syncs = 0;        // __syncwarp meetings reached
  uint32_t peer_parity = 0;  // as of the meeting: bit k = lane k's warp_syncs & 1
  uint64_t meeting = 0;      // the number of the warp's last meeting it was released from
  AsyncCopy copies[kMaxAsyncCopies];  // cp.async issued and not yet landed, oldest first
  int pending = 0;
  int groups = 0;                     // cp.async.commit_group calls so far
  void* tsan_fiber = nullptr;
};

struct Block {
  const char* name = "";
  dim3 idx, dim, grid;
  std::vector<Thread>& threads;  // this OS thread's, reused from block to block
  std::vector<uint64_t> slots;  // [warp][lane]: values deposited for a warp operation
  std::vector<uint64_t> meetings;  // [warp]: meetings released so far
  std::vector<uint64_t> mma_done;  // [warp]: the meeting whose mma.sync has been computed
  std::vector<int> runnable;    // this round's threads (forward)
  Order order = Order::forward;
  uint8_t fill = kPoison;  // what fresh shared memory holds
  void* smem = nullptr;    // dynamic shared memory
  char* statics = nullptr;  // static shared memory (LLMT_SHARED), kMaxStaticShared bytes when first asked for
  size_t statics_used = 0;
  std::vector<std::pair<const void*, char*>> static_vars;  // declaration's key, its bytes
  int fewest_exit_barriers = INT_MAX;  // the fewest __syncthreads any exited thread passed
  const std::function<void()>* body = nullptr;
  std::exception_ptr error;
  bool aborting = false;  // after an error: every waiting thread leaves its barrier by throwing Abort
  const void* sched_bottom = nullptr;  // the scheduler's stack, for AddressSanitizer
  size_t sched_size = 0;
  void* tsan_sched = nullptr;  // the scheduler's TSan fiber
  int tsan_pool = 0;           // racecheck: the pool its threads' TSan fibers come from; 0: not checked
  // Racecheck's synchronisation objects (for blocks TSan checks): [0], [1]: what arriving threads
  // release at __syncthreads (two, alternating: a thread past barrier k may release into k + 1's
  // before a slower one has acquired k's); [2]: what the scheduler releases before the threads
  // start; [3 + 2 i + p]: thread i's last two __syncwarp (the same alternation). Heap memory freed
  // with the block, so TSan forgets them.
  std::unique_ptr<char[]> sync;
  explicit Block(std::vector<Thread>& t) : threads(t) {}
  ~Block() {
    free_shared(statics);
    free_shared(smem);
  }
};

// Thrown inside a fiber to end it when its block is given up (no forced unwinding: it would switch
// stacks behind AddressSanitizer's back).
struct Abort {};

// Stacks from a per-OS-thread pool, their bounds kept for AddressSanitizer. Under racecheck each
// TSan fiber has a stack of its own for good (tsan_fiber): a stack shared by two fibers would carry
// one's accesses into the other's, which TSan would take for races.
struct RecordingStack {
  boost::context::pooled_fixedsize_stack* pool;
  Thread* thread;
  char* own = nullptr;  // racecheck: the fiber's own stack, kStackBytes
  boost::context::stack_context allocate() {
    boost::context::stack_context sc;
    if (own) {
      sc.size = kStackBytes;
      sc.sp = own + kStackBytes;
    } else {
      sc = pool->allocate();
    }
    thread->stack_bottom = (char*)sc.sp - sc.size;
    thread->stack_size = sc.size;
    return sc;
  }
  void deallocate(boost::context::stack_context& sc) {
    if (!own) pool->deallocate(sc);
  }
};

thread_local Block* g_block = nullptr;
thread_local Thread* g_thread = nullptr;
thread_local cudaError_t g_last_error = cudaSuccess;
#ifdef LLMT_SIMT_TSAN
char g_kernel_end;  // racecheck: every thread releases here as it exits; the host acquires after the grid

// Racecheck's fibers. Making a TSan fiber costs about 20 us (libtsan maps and clears its state), so
// a grid of 4096 blocks of 256 threads would take 20 s to start. Instead the threads of a grid's
// first and last kRacecheckEnds blocks (all of a grid of up to 2 kRacecheckEnds blocks) run as TSan
// fibers from pools of their own, one pool per place in that list, and TSan checks them against
// each other; the other blocks run on one more pool with TSan ignoring them. Reusing a fiber in a
// later launch orders nothing new: the end of a kernel already orders all its threads before the
// next launch's. So races inside a block, and between the checked blocks (neighbours at both ends
// of the grid, where tile bounds go wrong), are found; a race only between unchecked blocks is not.
constexpr int kRacecheckEnds = 4;
struct TsanFiber {
  void* fiber;
  char* stack;  // its own, kStackBytes (RecordingStack)
};
std::vector<TsanFiber> g_tsan_pools[2 * kRacecheckEnds + 1];  // [0]: unchecked blocks

const TsanFiber& tsan_fiber(int pool, size_t i) {
  std::vector<TsanFiber>& p = g_tsan_pools[pool];
  while (p.size() <= i) {
    IgnoreWrites quiet;
    char* stack = (char*)std::malloc(kStackBytes);
    LLMT_CHECK(stack, "simt: out of host memory for a thread's stack");
    p.push_back(TsanFiber{__tsan_create_fiber(0), stack});
  }
  return p[i];
}
#endif

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
// ThreadSanitizer must be told which fiber runs next, just before the switch (a no-op without it).
void tsan_switch(void* fiber) {
#ifdef LLMT_SIMT_TSAN
  __tsan_switch_to_fiber(fiber, kTsanNoSync);
#else
  (void)fiber;
#endif
}
// Racecheck: releases or acquires the block's synchronisation object i, where TSan checks the block.
void tsan_release(Block& b, size_t i) {
#ifdef LLMT_SIMT_TSAN
  if (b.sync) __tsan_release(&b.sync[i]);
#else
  (void)b, (void)i;
#endif
}
void tsan_acquire(Block& b, size_t i) {
#ifdef LLMT_SIMT_TSAN
  if (b.sync) __tsan_acquire(&b.sync[i]);
#else
  (void)b, (void)i;
#endif
}

// Leaves the fiber for the scheduler until released from `w`.
void yield(Wait w) {
  Thread* t = g_thread;
  Block* b = g_block;
  t->wait = w;
  switching_to(&t->fake_stack, b->sched_bottom, b->sched_size);
  tsan_switch(b->tsan_sched);
  t->sink = std::move(t->sink).resume();
  switched(t->fake_stack, nullptr, nullptr);
  if (b->aborting) throw Abort{};
}

// The lanes of this thread's warp in `mask` meet; returns the values they deposited.
const uint64_t* warp_meet(unsigned mask, uint64_t bits, Site site) {
  Block& b = block();
  Thread& t = *g_thread;
  const int lane = t.linear % kWarp, warp = t.linear / kWarp;
  if (!((mask >> lane) & 1u))
    throw Error(strformat("simt: kernel %s, thread %d: a warp operation whose mask 0x%08x leaves out its own lane %d",
                          b.name, t.linear, mask, lane));
  b.slots[(size_t)warp * kWarp + lane] = bits;
  t.mask = mask;
  t.site = site;
  if (site.op == Op::syncwarp) {  // racecheck: __syncwarp orders memory among the lanes that meet
    t.warp_syncs++;
    tsan_release(b, 3 + 2 * (size_t)t.linear + (t.warp_syncs & 1));
  }
  yield(Wait::warp);
  if (site.op == Op::syncwarp)
    for (int k = 0; k < kWarp; k++)
      if ((mask >> k) & 1u) tsan_acquire(b, 3 + 2 * (size_t)(warp * kWarp + k) + ((t.peer_parity >> k) & 1u));
  return t.snapshot;
}

std::string where(const Site& s) {
  const char* slash = std::strrchr(s.file, '/');
  return strformat("%s:%d", slash ? slash + 1 : s.file, s.line);
}

// "threads 0-31 <what>; threads 32-63 <what>": runs of consecutive threads whose descriptions agree.
std::string describe_threads(const Block& b, const std::function<std::string(const Thread&)>& what) {
  std::string s;
  size_t i = 0;
  while (i < b.threads.size()) {
    const std::string w = what(b.threads[i]);
    size_t j = i + 1;
    while (j < b.threads.size() && what(b.threads[j]) == w) j++;
    if (!w.empty()) {
      s += strformat("%sthread%s %zu%s %s", s.empty() ? "" : "; ", j - i > 1 ? "s" : "", i,
                     j - i > 1 ? strformat("-%zu", j - 1).c_str() : "", w.c_str());
      if (s.size() > 600) return s + " ...";
    }
    i = j;
  }
  return s;
}

std::string describe_waits(const Block& b) {
  return describe_threads(b, [](const Thread& t) -> std::string {
    switch (t.wait) {
      case Wait::done: return "";
      case Wait::block: return "at __syncthreads " + where(t.site);
      case Wait::warp: return strformat("at %s %s, mask 0x%08x", op_name(t.site.op), where(t.site).c_str(), t.mask);
      case Wait::none: return "running";
    }
    return "";
  });
}

Error block_error(const Block& b, const std::string& what) {
  return Error(strformat("simt: kernel %s, block (%u,%u,%u): %s", b.name, b.idx.x, b.idx.y, b.idx.z, what.c_str()));
}

// Releases warp w's meetings that are complete (only lane `only`'s, when given); throws where one
// never can be, or where its lanes meet from different places (synccheck). Returns whether any lane
// was released.
bool release_warp(Block& b, int w, int only = -1) {
  bool released = false;
  const int n = (int)b.threads.size();
  for (int l = only < 0 ? 0 : only; l < (only < 0 ? kWarp : only + 1) && w * kWarp + l < n; l++) {
    Thread& t = b.threads[(size_t)w * kWarp + l];
    if (t.wait != Wait::warp) continue;
    const unsigned m = t.mask;
    bool complete = true;
    for (int k = 0; k < kWarp; k++) {
      if (!((m >> k) & 1u)) continue;
      const int id = w * kWarp + k;
      if (id >= n)
        throw block_error(b, strformat("warp %d's mask 0x%08x names lane %d, which the block of %d threads does not "
                                       "have", w, m, k, n));
      const Thread& o = b.threads[(size_t)id];
      if (o.wait == Wait::done)
        throw block_error(b, strformat("thread %d waits in %s at %s with mask 0x%08x, but lane %d (thread %d) has "
                                       "already exited", t.linear, op_name(t.site.op), where(t.site).c_str(), m, k, id));
      if (o.wait != Wait::warp || o.mask != m) {
        complete = false;
        if (only >= 0) break;  // the lane that arrives last will find the meeting complete
      }
    }
    if (!complete) continue;
    uint32_t parity = 0;
    for (int k = 0; k < kWarp; k++) {
      if (!((m >> k) & 1u)) continue;
      const Thread& o = b.threads[(size_t)w * kWarp + k];
      if (!o.site.same(t.site))
        throw block_error(b, strformat("the lanes of warp %d meet in different warp operations (%s; every lane of a "
                                       "mask must execute the same one)", w, describe_waits(b).c_str()));
      parity |= (uint32_t)(o.warp_syncs & 1) << k;
    }
    const uint64_t meeting = ++b.meetings[(size_t)w];
    for (int k = 0; k < kWarp; k++) {
      if (!((m >> k) & 1u)) continue;
      Thread& o = b.threads[(size_t)w * kWarp + k];
      std::memcpy(o.snapshot, &b.slots[(size_t)w * kWarp], sizeof(o.snapshot));
      o.peer_parity = parity;
      o.meeting = meeting;
      o.wait = Wait::none;
    }
    released = true;
  }
  return released;
}

bool release_warps(Block& b) {
  bool released = false;
  for (int w = 0; w * kWarp < (int)b.threads.size(); w++) released = release_warp(b, w) || released;
  return released;
}

// Every live thread waits at __syncthreads: release them if they all wait at the same one (synccheck:
// the same source line and the same count of barriers passed, and no thread exited before it).
void release_block_barrier(Block& b) {
  const Thread* first = nullptr;
  bool same = true;
  for (const Thread& t : b.threads) {
    if (t.wait != Wait::block) continue;
    if (!first) first = &t;
    same = same && t.site.same(first->site) && t.barriers == first->barriers;
  }
  if (!same)
    throw block_error(b, strformat("the threads wait at different __syncthreads (%s)", describe_waits(b).c_str()));
  if (b.fewest_exit_barriers <= first->barriers)
    throw block_error(b, strformat("threads exited without reaching the __syncthreads at %s that the others wait at "
                                   "(%s; %s)", where(first->site).c_str(), describe_waits(b).c_str(),
                                   describe_threads(b, [](const Thread& t) -> std::string {
                                     return t.wait == Wait::done ? "exited" : "";
                                   }).c_str()));
  for (Thread& t : b.threads)
    if (t.wait == Wait::block) t.wait = Wait::none;
}

// When nothing can run: releases the meetings that are complete (every live thread at __syncthreads,
// or a warp's lanes); throws where none is and none ever can be. Returns false when every thread has
// exited.
bool release_or_throw(Block& b) {
  size_t live = 0, at_block = 0;
  for (const Thread& t : b.threads) {
    live += t.wait != Wait::done;
    at_block += t.wait == Wait::block;
  }
  if (live == 0) return false;
  bool released = release_warps(b);
  if (at_block == live) {  // every thread still running is at __syncthreads
    release_block_barrier(b);
    released = true;
  }
  if (!released) throw block_error(b, "threads wait at barriers that can never complete: " + describe_waits(b));
  return true;
}

// Forward (the default): rounds in which every thread that can run runs, in index order, to its next
// meeting; then the meetings that are complete are released.
void run_in_rounds(Block& b, const std::function<void(Thread&)>& resume) {
  for (;;) {
    b.runnable.clear();
    for (const Thread& t : b.threads)
      if (t.wait == Wait::none) b.runnable.push_back(t.linear);
    for (int i : b.runnable) {
      resume(b.threads[(size_t)i]);
      if (b.error) return;
    }
    if (!release_or_throw(b)) return;
  }
}

// reverse and shuffle: one thread at a time, the highest-numbered one that can run (reverse) or one
// drawn from the seed (shuffle), and a warp's meeting released the moment its last lane arrives. So
// a warp runs ahead of the others up to the next __syncthreads as warps may on a GPU, and a read
// that a missing barrier leaves unordered sees what shared memory held before the writer ran.
void run_eagerly(Block& b, const std::function<void(Thread&)>& resume) {
  const uint64_t block_linear = b.idx.x + (uint64_t)b.grid.x * (b.idx.y + (uint64_t)b.grid.y * b.idx.z);
  uint64_t state = stream_state(schedule().seed ^ std::hash<std::string>{}(b.name), block_linear);
  constexpr int kWords = kMaxBlockThreads / 64;
  uint64_t ready[kWords] = {};  // bit i: thread i can run
  const int words = ((int)b.threads.size() + 63) / 64;
  auto mark = [&](const Thread& t) {
    if (t.wait == Wait::none) ready[t.linear / 64] |= 1ull << (t.linear % 64);
  };
  for (const Thread& t : b.threads) mark(t);
  for (;;) {
    int pick = -1;
    if (b.order == Order::reverse) {
      for (int w = words - 1; w >= 0 && pick < 0; w--)
        if (ready[w]) pick = w * 64 + 63 - __builtin_clzll(ready[w]);
    } else {
      int count = 0;
      for (int w = 0; w < words; w++) count += __builtin_popcountll(ready[w]);
      if (count) {
        state += 0x9e3779b97f4a7c15ull;
        int k = (int)(mix64(state) % (uint64_t)count);  // the k-th thread that can run
        for (int w = 0; w < words && pick < 0; w++) {
          const int c = __builtin_popcountll(ready[w]);
          if (k >= c) {
            k -= c;
            continue;
          }
          uint64_t bits = ready[w];
          for (; k > 0; k--) bits &= bits - 1;
          pick = w * 64 + __builtin_ctzll(bits);
        }
      }
    }
    if (pick < 0) {
      if (!release_or_throw(b)) return;
      for (const Thread& t : b.threads) mark(t);
      continue;
    }
    Thread& t = b.threads[(size_t)pick];
    ready[pick / 64] &= ~(1ull << (pick % 64));
    resume(t);
    if (b.error) return;
    if (t.wait == Wait::warp && release_warp(b, t.linear / kWarp, t.linear % kWarp))
      for (int k = 0; k < kWarp && (t.linear / kWarp) * kWarp + k < (int)b.threads.size(); k++)
        mark(b.threads[(size_t)(t.linear / kWarp) * kWarp + k]);
  }
}

void run_block(Block& b) {
  static thread_local ctx::pooled_fixedsize_stack stacks(kStackBytes);
  const unsigned n = b.dim.x * b.dim.y * b.dim.z;
  b.threads.resize(n);
  for (Thread& t : b.threads) t = Thread();
  b.slots.assign(((size_t)n + kWarp - 1) / kWarp * kWarp, 0);
  b.meetings.assign(((size_t)n + kWarp - 1) / kWarp, 0);
  b.mma_done.assign(((size_t)n + kWarp - 1) / kWarp, 0);
#ifdef LLMT_SIMT_TSAN
  b.tsan_sched = __tsan_get_current_fiber();
  if (b.tsan_pool) b.sync.reset(new char[3 + 2 * (size_t)n]);
  tsan_release(b, 2);  // the host's work, the block's shared memory: before every thread
#endif
  for (unsigned i = 0; i < n; i++) {
    Thread& t = b.threads[i];
    t.linear = (int)i;
    t.idx = dim3(i % b.dim.x, i / b.dim.x % b.dim.y, i / (b.dim.x * b.dim.y));
    RecordingStack stack{&stacks, &t};
#ifdef LLMT_SIMT_TSAN
    t.tsan_fiber = tsan_fiber(b.tsan_pool, i).fiber;
    stack.own = tsan_fiber(b.tsan_pool, i).stack;
    if (b.tsan_pool)
      __tsan_set_fiber_name(t.tsan_fiber, strformat("%s block (%u,%u,%u) thread %u", b.name, b.idx.x, b.idx.y,
                                                    b.idx.z, i).c_str());
#endif
    t.fiber = ctx::fiber(std::allocator_arg, stack, [&b, i](ctx::fiber&& sink) {
      Thread& me = b.threads[i];
      switched(nullptr, &b.sched_bottom, &b.sched_size);
      me.sink = std::move(sink);
      tsan_acquire(b, 2);
#ifdef LLMT_SIMT_TSAN
      if (!b.tsan_pool) __tsan_ignore_thread_begin();
#endif
      try {
        if (!b.aborting) (*b.body)();
      } catch (const Abort&) {
      } catch (...) {
        if (!b.error) b.error = std::current_exception();
      }
#ifdef LLMT_SIMT_TSAN
      if (!b.tsan_pool) __tsan_ignore_thread_end();
#endif
      if (me.pending && !b.error && !b.aborting)
        b.error = std::make_exception_ptr(block_error(
            b, strformat("thread %d exited with %d cp.async copies it never waited for (cp.async.wait_group)",
                         me.linear, me.pending)));
      me.wait = Wait::done;
      b.fewest_exit_barriers = std::min(b.fewest_exit_barriers, me.barriers);
#ifdef LLMT_SIMT_TSAN
      if (b.sync) __tsan_release(&g_kernel_end);
#endif
      switching_to(nullptr, b.sched_bottom, b.sched_size);  // this fiber's stack is finished with
      tsan_switch(b.tsan_sched);
      return std::move(me.sink);
    });
  }
  g_block = &b;
  const std::function<void(Thread&)> resume = [&](Thread& t) {
    g_thread = &t;
    void* fake = nullptr;
    switching_to(&fake, t.stack_bottom, t.stack_size);
    tsan_switch(t.tsan_fiber);
    t.fiber = std::move(t.fiber).resume();
    switched(fake, nullptr, nullptr);
    g_thread = nullptr;
  };
  try {
    if (b.order == Order::forward)
      run_in_rounds(b, resume);
    else
      run_eagerly(b, resume);
  } catch (...) {
    b.error = std::current_exception();
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
}

}  // namespace

dim3 thread_idx() { return g_thread ? g_thread->idx : kZero; }
dim3 block_idx() { return block().idx; }
dim3 block_dim() { return block().dim; }
dim3 grid_dim() { return block().grid; }
void syncthreads(const char* file, int line) {
  Block& b = block();
  Thread& t = *g_thread;
  t.site = Site{Op::syncthreads, file, line};
  tsan_release(b, t.barriers & 1);
  yield(Wait::block);
  tsan_acquire(b, t.barriers & 1);
  t.barriers++;
}
uint64_t exchange(unsigned mask, uint64_t bits, int src, const char* file, int line) {
  const uint64_t* got = warp_meet(mask, bits, Site{Op::shfl, file, line});
  return src >= 0 && src < kWarp && ((mask >> src) & 1u) ? got[src] : bits;
}
// The 32 lanes' values of one 64-bit deposit each, as every lane of a full warp sees them.
static void gather_warp(uint64_t bits, uint64_t all[kWarp], Site site) {
  std::memcpy(all, warp_meet(0xffffffffu, bits, site), sizeof(uint64_t) * kWarp);
}
static float bf16_bits_to_f32(uint32_t h) {
  const uint32_t u = (h & 0xffffu) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// One lane's operands of an mma.sync, and where its part of D goes: on the lane's stack, which
// stays put while the lane waits at the meeting.
struct MmaLane {
  uint32_t a[4], b[2];
  float c[4];
  float d[4];
};

void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4], const char* file,
                       int line) {
  MmaLane me;
  std::memcpy(me.a, a, sizeof(me.a));
  std::memcpy(me.b, b, sizeof(me.b));
  std::memcpy(me.c, c, sizeof(me.c));
  const uint64_t* lanes = warp_meet(0xffffffffu, (uint64_t)(uintptr_t)&me, Site{Op::mma, file, line});
  // The first lane to go on computes the whole warp's D, into every lane's MmaLane: the others are
  // still waiting (a lane can reach the warp's next meeting only after all of them have gone on).
  Block& blk = block();
  const int w = g_thread->linear / kWarp;
  if (blk.mma_done[(size_t)w] != g_thread->meeting) {
    blk.mma_done[(size_t)w] = g_thread->meeting;
    float A[16][16], B[16][8];
    for (int l = 0; l < kWarp; l++) {  // every lane's registers back into the matrices
      const MmaLane& f = *(const MmaLane*)(uintptr_t)lanes[l];
      const int g = l / 4, t = l % 4;
      for (int e = 0; e < 2; e++) {
        A[g][2 * t + e] = bf16_bits_to_f32(f.a[0] >> (16 * e));
        A[g + 8][2 * t + e] = bf16_bits_to_f32(f.a[1] >> (16 * e));
        A[g][2 * t + 8 + e] = bf16_bits_to_f32(f.a[2] >> (16 * e));
        A[g + 8][2 * t + 8 + e] = bf16_bits_to_f32(f.a[3] >> (16 * e));
        B[2 * t + e][g] = bf16_bits_to_f32(f.b[0] >> (16 * e));
        B[2 * t + 8 + e][g] = bf16_bits_to_f32(f.b[1] >> (16 * e));
      }
    }
    for (int l = 0; l < kWarp; l++) {  // lane l's part of D, where its c sits
      MmaLane& f = *(MmaLane*)(uintptr_t)lanes[l];
      const int g = l / 4, t = l % 4;
      for (int i = 0; i < 4; i++) {
        const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        float acc = f.c[i];
        for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
        f.d[i] = acc;
      }
    }
  }
  std::memcpy(d, me.d, sizeof(me.d));
}

void ldmatrix(uint32_t* r, int n, bool trans, const void* row, const char* file, int line) {
  if (n != 1 && n != 2 && n != 4) throw Error(strformat("simt: ldmatrix of %d matrices (1, 2 or 4)", n));
  uint64_t rows[kWarp];
  gather_warp((uint64_t)(uintptr_t)row, rows, Site{Op::ldmatrix, file, line});
  const int l = lane();
  for (int j = 0; j < n; j++) {
    uint32_t v = 0;
    for (int e = 0; e < 2; e++) {
      // matrix j's rows come from lanes 8j..8j+7; each row is 8 b16 elements
      const int r_ = trans ? 2 * (l % 4) + e : l / 4, c_ = trans ? l / 4 : 2 * (l % 4) + e;
      const uint16_t* p = (const uint16_t*)(uintptr_t)rows[8 * j + r_];
#ifdef LLMT_SIMT_TSAN
      __tsan_read2((void*)(p + c_));  // this lane's read of shared memory another lane may have written
#endif
      v |= (uint32_t)p[c_] << (16 * e);
    }
    r[j] = v;
  }
}

unsigned ballot(unsigned mask, bool pred, const char* file, int line) {
  const uint64_t* got = warp_meet(mask, pred ? 1 : 0, Site{Op::ballot, file, line});
  unsigned r = 0;
  for (int l = 0; l < kWarp; l++)
    if (((mask >> l) & 1u) && got[l]) r |= 1u << l;
  return r;
}
void syncwarp(unsigned mask, const char* file, int line) { warp_meet(mask, 0, Site{Op::syncwarp, file, line}); }

void cp_async(void* dst, const void* src, int bytes, int src_bytes) {
  Block& b = block();
  Thread& t = *g_thread;
  if (bytes != 4 && bytes != 8 && bytes != 16)
    throw block_error(b, strformat("thread %d: cp.async of %d bytes (4, 8 or 16)", t.linear, bytes));
  if (src_bytes < 0 || src_bytes > bytes)
    throw block_error(b, strformat("thread %d: cp.async's source size %d outside [0, %d]", t.linear, src_bytes, bytes));
  if ((uintptr_t)dst % bytes || (uintptr_t)src % bytes)
    throw block_error(b, strformat("thread %d: cp.async of %d bytes from %p to %p, not aligned to %d", t.linear, bytes,
                                   src, dst, bytes));
  if (t.pending == kMaxAsyncCopies)
    throw block_error(b, strformat("thread %d has %d cp.async copies in flight, more than the emulator holds",
                                   t.linear, kMaxAsyncCopies));
#ifdef LLMT_SIMT_TSAN
  if (src_bytes) __tsan_read1((void*)src);  // the issuing thread reads its source now
#endif
  fill_shared(dst, (size_t)bytes, b.fill);  // until it lands: what fresh shared memory holds
  t.copies[t.pending++] = AsyncCopy{dst, src, bytes, src_bytes, -1};
}

void cp_async_commit() {
  Thread& t = *g_thread;
  block();
  for (int i = 0; i < t.pending; i++)
    if (t.copies[i].group < 0) t.copies[i].group = t.groups;
  t.groups++;
}

void cp_async_wait(int newest) {
  Thread& t = *g_thread;
  block();
  int kept = 0;
  for (int i = 0; i < t.pending; i++) {
    const AsyncCopy& c = t.copies[i];
    if (c.group < 0 || c.group >= t.groups - newest) {  // uncommitted, or among the newest groups
      t.copies[kept++] = c;
      continue;
    }
#ifdef LLMT_SIMT_TSAN
    for (int k = 0; k < c.bytes; k += 4) __tsan_write4((char*)c.dst + k);  // lands: this thread's write
#endif
    std::memcpy(c.dst, c.src, (size_t)c.src_bytes);
    std::memset((char*)c.dst + c.src_bytes, 0, (size_t)(c.bytes - c.src_bytes));
  }
  t.pending = kept;
}
void* dynamic_shared() { return block().smem; }

void* static_shared(const void* key, size_t bytes) {
  Block& b = block();
  IgnoreWrites quiet;  // what it allocates is the block's, freed by the scheduler
  for (const auto& v : b.static_vars)
    if (v.first == key) return v.second;
  const size_t at = (b.statics_used + 15) / 16 * 16;
  if (at + bytes > kMaxStaticShared)
    throw block_error(b, strformat("its static shared memory (LLMT_SHARED) comes to %zu bytes, over the %zu a block "
                                   "may declare", at + bytes, kMaxStaticShared));
  if (!b.statics) b.statics = (char*)alloc_shared(kMaxStaticShared, b.fill);
  b.statics_used = at + bytes;
  b.static_vars.emplace_back(key, b.statics + at);
  return b.statics + at;
}

namespace {

// ---- device memory ----
// Device memory is host memory here, so host code that reads a device buffer directly (which on a
// GPU crashes or reads garbage) would pass unseen. The guard closes that hole: cudaMalloc carves
// device buffers out of one reserved arena that host code cannot reach except while a kernel runs or
// a cudaMemcpy / cudaMemset (or a stand-in, HostAccess) works on it, so such a host access stops the
// program with a message. Two ways to close it:
// - protection keys (x86 PKU, where the CPU and the kernel offer them): the arena's pages carry a key
//   of their own and a thread reaches them only while its PKRU register allows that key. Opening and
//   closing is one unprivileged instruction on the thread doing the work, so a launch costs nothing.
// - mprotect, elsewhere (or with LLMT_SIMT_GUARD=mprotect): the arena stays PROT_NONE; while any
//   thread does device work, a fault in the handed-out arena opens the 1 MiB window around it
//   (mprotect from the signal handler, then the access runs again), and the last HostAccess to close
//   shuts the windows that were opened. Rewriting the page tables of the whole handed-out arena at
//   every open and close instead was 55% of the emulated 3-rank FSDP test's time (perf:
//   change_pte_range), as it had been 95% of the model tests' before protection keys (32.9 s against
//   1.6 s). The guard is process-wide here: another thread's stray read while a kernel runs passes.
//   A thread starts with its maker's PKRU: one made while its maker has the arena open keeps it open.
// Under AddressSanitizer and ThreadSanitizer buffers are exact-sized heap blocks instead (so a
// kernel's one-past-the-end access is reported), without the guard.
std::mutex g_mem_mutex;
std::map<char*, size_t> g_chunk_bytes;  // every live allocation's size (arena chunks, or heap blocks)

#ifndef LLMT_SIMT_HEAP
constexpr size_t kArenaBytes = (size_t)1 << 37;  // 128 GiB of address space, reserved, not committed
char* g_arena = nullptr;
size_t g_arena_used = 0;                       // the bump pointer: [g_arena, g_arena + used) was handed out
std::multimap<size_t, char*> g_free_chunks;     // freed chunks by size, for reuse
std::atomic<int> g_open{0};                     // mprotect guard: device work in progress (launches, copies)
thread_local int t_open = 0;                    // protection keys: this thread's open accesses
struct sigaction g_previous_segv;

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

// The mprotect guard's open windows: a bit each, and the list of those opened since the arena was
// last shut (kMaxOpenWindows of them; past that, shutting covers the whole handed-out arena).
constexpr size_t kWindowBytes = (size_t)1 << 20;
constexpr size_t kMaxOpenWindows = 4096;
std::atomic<uint64_t> g_window_open[kArenaBytes / kWindowBytes / 64];
std::atomic<uint32_t> g_open_windows[kMaxOpenWindows];
std::atomic<size_t> g_open_count{0};

// Signal-safe: atomics and mprotect only.
bool open_window(const char* a) {
  if (g_open.load() == 0 || a >= g_arena + g_arena_used) return false;
  const size_t w = (size_t)(a - g_arena) / kWindowBytes;
  if (mprotect(g_arena + w * kWindowBytes, kWindowBytes, PROT_READ | PROT_WRITE) != 0) return false;
  const uint64_t bit = 1ull << (w % 64);
  if (!(g_window_open[w / 64].fetch_or(bit) & bit)) {
    const size_t i = g_open_count.fetch_add(1);
    if (i < kMaxOpenWindows) g_open_windows[i].store((uint32_t)w);
  }
  return true;
}

// Called with g_mem_mutex held, when the last device work ends.
void shut_windows() {
  const size_t n = g_open_count.load();
  if (n > kMaxOpenWindows) {
    mprotect(g_arena, g_arena_used, PROT_NONE);
    for (auto& bits : g_window_open) bits.store(0);
  } else {
    for (size_t i = 0; i < n; i++) {
      const uint32_t w = g_open_windows[i].load();
      mprotect(g_arena + (size_t)w * kWindowBytes, kWindowBytes, PROT_NONE);
      g_window_open[w / 64].store(0);
    }
  }
  g_open_count.store(0);
}

void on_segv(int sig, siginfo_t* info, void* uctx) {
  const char* a = (const char*)info->si_addr;
  if (g_arena && a >= g_arena && a < g_arena + kArenaBytes) {
    if (arena_key() < 0 && open_window(a)) return;  // device work: the access runs again, now allowed
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
    mprotect(p, g_chunk_bytes[p], PROT_NONE);  // opened window by window as device work touches it
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

#else

// Exactly the bytes asked for (256-byte aligned, as cudaMalloc's), so a kernel that reads or writes
// one element past its buffer is reported.
void* device_malloc(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 256, std::max<size_t>(bytes, 1)) != 0) return nullptr;
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  g_chunk_bytes[(char*)p] = std::max<size_t>(bytes, 1);
  return p;
}

bool device_free(void* p) {
  {
    std::lock_guard<std::mutex> lock(g_mem_mutex);
    if (!g_chunk_bytes.erase((char*)p)) return false;
  }
  std::free(p);
  return true;
}

#endif

// The device allocation that holds `p`: its first byte and its size; {nullptr, 0} for host memory.
std::pair<char*, size_t> allocation_of(const void* p) {
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  auto it = g_chunk_bytes.upper_bound((char*)p);
  if (it == g_chunk_bytes.begin()) return {nullptr, 0};
  --it;
  if ((const char*)p >= it->first + it->second) return {nullptr, 0};
  return {it->first, it->second};
}

// Runs the grid once, its blocks in `order` (forward: spread over OpenMP threads as they come;
// otherwise, and under racecheck, on this thread in that order), fresh shared memory holding `fill`.
void run_grid(const char* name, dim3 grid, dim3 blk, size_t dynamic_shared_bytes, const std::function<void()>& body,
              Order order, uint8_t fill) {
  const int64_t blocks = (int64_t)grid.x * grid.y * grid.z;
#ifdef LLMT_SIMT_TSAN
  const bool one_thread = true;
#else
  const bool one_thread = order != Order::forward;
#endif
  std::vector<int64_t> shuffled;
  if (order == Order::shuffle) {
    shuffled.resize((size_t)blocks);
    for (int64_t i = 0; i < blocks; i++) shuffled[(size_t)i] = i;
    uint64_t state = stream_state(schedule().seed, std::hash<std::string>{}(name));
    for (int64_t i = blocks; i > 1; i--) {
      state += 0x9e3779b97f4a7c15ull;
      std::swap(shuffled[(size_t)i - 1], shuffled[mix64(state) % (uint64_t)i]);
    }
  }
  std::exception_ptr first;
  std::mutex m;
#pragma omp parallel if (!one_thread)
  {
  HostAccess open_here;  // each worker's own, under protection keys
#pragma omp for schedule(dynamic, 1)
  for (int64_t k = 0; k < blocks; k++) {
    const int64_t i = order == Order::forward ? k : order == Order::reverse ? blocks - 1 - k : shuffled[(size_t)k];
    static thread_local std::vector<Thread> threads;
    Block b(threads);
    b.name = name;
    b.grid = grid;
    b.dim = blk;
    b.idx = dim3((unsigned)(i % grid.x), (unsigned)(i / grid.x % grid.y), (unsigned)(i / ((int64_t)grid.x * grid.y)));
    b.body = &body;
    b.order = order;
    b.fill = fill;
#ifdef LLMT_SIMT_TSAN
    b.tsan_pool = blocks <= 2 * kRacecheckEnds ? (int)k + 1
                  : k < kRacecheckEnds         ? (int)k + 1
                  : k >= blocks - kRacecheckEnds ? (int)(k - (blocks - 2 * kRacecheckEnds)) + 1
                                                 : 0;
#endif
    if (dynamic_shared_bytes) b.smem = alloc_shared(dynamic_shared_bytes, fill);
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
#ifdef LLMT_SIMT_TSAN
  __tsan_acquire(&g_kernel_end);  // the kernel's threads, before the host's next work
#endif
  if (first) std::rethrow_exception(first);
}

// The allocations a kernel may write: those its non-const pointer arguments point into, each once.
// Each must be device memory: what the first run wrote is put back before the second.
std::vector<std::pair<char*, size_t>> writable_allocations(const char* name, const void* const* writable, int n,
                                                           std::vector<int>& arg) {
  std::vector<std::pair<char*, size_t>> out;
  for (int i = 0; i < n; i++) {
    if (!writable[i]) continue;
    const auto a = allocation_of(writable[i]);
    if (!a.first)
      throw Error(strformat("simt: kernel %s: argument %d (%p) is a writable pointer to host memory. Under "
                            "LLMT_SIMT_SCHEDULE=%s each launch runs twice from the same memory, which needs what it "
                            "writes in device memory (cudaMalloc), as a GPU needs it anyway", name, i, writable[i],
                            schedule().text.c_str()));
    bool seen = false;
    for (const auto& o : out) seen = seen || o.first == a.first;
    if (seen) continue;
    out.push_back(a);
    arg.push_back(i);
  }
  return out;
}

}  // namespace

namespace {
std::mutex g_attr_mutex;
std::map<std::string, int> g_max_dynamic_shared;  // LLMT_MAX_DYNAMIC_SHARED, by kernel as LLMT_LAUNCH spells it
constexpr int kDefaultDynamicShared = 48 * 1024, kMaxDynamicShared = 227 * 1024;
}  // namespace

// The kernel as LLMT_LAUNCH spelled it, without the parentheses a template's commas need there.
static std::string kernel_name(const char* spelled) {
  std::string s = spelled;
  if (s.size() > 2 && s.front() == '(' && s.back() == ')') s = s.substr(1, s.size() - 2);
  return s;
}

cudaError_t set_max_dynamic_shared(const char* kernel, int bytes) {
  if (bytes < 0 || bytes > kMaxDynamicShared) return g_last_error = cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(g_attr_mutex);
  g_max_dynamic_shared[kernel_name(kernel)] = bytes;
  return cudaSuccess;
}

void launch(const char* launched, dim3 grid, dim3 blk, size_t dynamic_shared_bytes, const std::function<void()>& body,
            const void* const* writable, int args) {
  const std::string spelled = kernel_name(launched);
  const char* name = spelled.c_str();
  const uint64_t threads = (uint64_t)blk.x * blk.y * blk.z, blocks = (uint64_t)grid.x * grid.y * grid.z;
  if (threads == 0 || threads > kMaxBlockThreads || blocks == 0) {
    g_last_error = cudaErrorInvalidConfiguration;
    return;
  }
  int allowed = kDefaultDynamicShared;
  {
    std::lock_guard<std::mutex> lock(g_attr_mutex);
    auto it = g_max_dynamic_shared.find(spelled);
    if (it != g_max_dynamic_shared.end()) allowed = it->second;
  }
  if (dynamic_shared_bytes > (size_t)allowed)
    throw Error(strformat("simt: kernel %s asks for %zu bytes of dynamic shared memory; it may have %d (over 48 KiB "
                          "needs LLMT_MAX_DYNAMIC_SHARED(kernel, bytes) first, as on a GPU)", name,
                          dynamic_shared_bytes, allowed));
  HostAccess open;  // this thread (under mprotect: all of them, for the whole launch)
  const uint8_t fill = poison() ? kPoison : 0;
  const Schedule& sched = schedule();
  if (sched.order == Order::forward) {
    run_grid(name, grid, blk, dynamic_shared_bytes, body, Order::forward, fill);
    return;
  }
  // Another order: the launch runs forward first, then in that order from the same memory, and the
  // two must agree byte for byte in everything the kernel may write.
  std::vector<int> arg;
  const auto regions = writable_allocations(name, writable, args, arg);
  std::vector<std::string> before, forward;
  for (const auto& r : regions) before.emplace_back(r.first, r.second);
  run_grid(name, grid, blk, dynamic_shared_bytes, body, Order::forward, fill);
  for (size_t i = 0; i < regions.size(); i++) {
    forward.emplace_back(regions[i].first, regions[i].second);
    std::memcpy(regions[i].first, before[i].data(), regions[i].second);
  }
  run_grid(name, grid, blk, dynamic_shared_bytes, body, sched.order, poison() ? kOtherPoison : 0);
  for (size_t i = 0; i < regions.size(); i++) {
    const char* got = regions[i].first;
    if (std::memcmp(got, forward[i].data(), regions[i].second) == 0) continue;
    size_t first = regions[i].second, count = 0;
    for (size_t k = 0; k < regions[i].second; k++)
      if (got[k] != forward[i][k]) {
        first = std::min(first, k);
        count++;
      }
    if (count)
      throw Error(strformat(
          "simt: kernel %s gives other results under LLMT_SIMT_SCHEDULE=%s than in forward order: %zu of the %zu bytes "
          "of the allocation its argument %d points into differ, the first at byte %zu (0x%02x forward, 0x%02x now). A "
          "thread reads what another writes without a barrier between them, or reads shared memory the block never "
          "wrote", name, sched.text.c_str(), count, regions[i].second, arg[i], first, (unsigned)(uint8_t)forward[i][first],
          (unsigned)(uint8_t)got[first]));
  }
}

#ifndef LLMT_SIMT_HEAP
// With protection keys the calling thread opens; with mprotect every thread does.
HostAccess::HostAccess() {
  const int key = arena_key();
  if (key >= 0) {
    if (t_open++ == 0) pkey_set(key, 0);
    return;
  }
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  g_open++;
}
HostAccess::~HostAccess() {
  const int key = arena_key();
  if (key >= 0) {
    if (--t_open == 0) pkey_set(key, PKEY_DISABLE_ACCESS);
    return;
  }
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  if (--g_open == 0) shut_windows();
}
const char* device_memory_guard() { return arena_key() >= 0 ? "protection keys" : "mprotect"; }
#else
HostAccess::HostAccess() {}
HostAccess::~HostAccess() {}
#ifdef LLMT_SIMT_ASAN
const char* device_memory_guard() { return "none (AddressSanitizer)"; }
#else
const char* device_memory_guard() { return "none (ThreadSanitizer)"; }
#endif
#endif

bool poisons_memory() { return poison(); }
const char* schedule_name() { return schedule().text.c_str(); }

}  // namespace simt
}  // namespace llmt

using llmt::simt::g_last_error;

// ---- the runtime ----

// A guarded arena chunk, or under the sanitizers an exact-sized heap block (simt.cpp's device memory
// section); poisoned (0xff bytes) unless LLMT_SIMT_POISON=0, as fresh memory on a GPU holds garbage.
cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = llmt::simt::device_malloc(bytes);
  if (!*p) return g_last_error = cudaErrorMemoryAllocation;
  if (llmt::simt::poison()) {
    llmt::simt::HostAccess open;
    std::memset(*p, llmt::simt::kPoison, bytes);
  }
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (p && !llmt::simt::device_free(p)) return g_last_error = cudaErrorInvalidValue;
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
