// The SIMT emulator itself (kernels/cuda/simt): barriers, warp operations with full and partial
// masks, early returns, shared memory, atomics across blocks, and the errors a GPU would hang or
// misbehave on (a warp operation naming a lane that has exited, barriers that can never complete).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/error.h"
#include "kernels/cuda/cuda_platform.h"
#include "kernels/cuda/simt/cudnn_frontend_simt.h"

namespace {

// Block-wide sum through shared memory, a tree of __syncthreads steps.
__global__ void block_tree_sum(const int* in, int* out, int n) {
  LLMT_SHARED(int, buf, [256]);
  const int t = (int)threadIdx.x, i = (int)(blockIdx.x * blockDim.x) + t;
  buf[t] = i < n ? in[i] : 0;
  __syncthreads();
  for (int s = (int)blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) buf[t] += buf[t + s];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = buf[0];
}

TEST(Simt, SharedMemoryTreeWithSyncthreadsPerBlock) {
  const int n = 1000, blocks = 4;
  std::vector<int> in(n), out(blocks, -1);
  std::iota(in.begin(), in.end(), 1);
  LLMT_LAUNCH(block_tree_sum, blocks, 256, 0, nullptr, in.data(), out.data(), n);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int b = 0; b < blocks; b++) {
    int want = 0;
    for (int i = b * 256; i < std::min(n, (b + 1) * 256); i++) want += in[i];
    EXPECT_EQ(out[b], want) << "block " << b << ": each block has its own __shared__ array";
  }
}

// Warp sums: full mask, then a divergent half warp with its own mask.
__global__ void warp_sums(const float* in, float* full, float* half) {
  const int lane = (int)threadIdx.x % WARP_SIZE, warp = (int)threadIdx.x / WARP_SIZE;
  float x = in[threadIdx.x];
  float s = x;
  for (int o = WARP_SIZE / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  full[threadIdx.x] = s;
  if (lane < 16) {  // only the low half of the warp: a mask of those 16 lanes
    float h = x;
    for (int o = 8; o > 0; o >>= 1) h += __shfl_down_sync(0x0000ffffu, h, o);
    if (lane == 0) half[warp] = h;
  }
}

TEST(Simt, WarpShufflesWithFullAndDivergentMasks) {
  const int threads = 64;
  std::vector<float> in(threads), full(threads), half(2);
  for (int i = 0; i < threads; i++) in[i] = (float)(i + 1);
  LLMT_LAUNCH(warp_sums, 1, threads, 0, nullptr, in.data(), full.data(), half.data());
  for (int w = 0; w < 2; w++) {
    float want_full = 0, want_half = 0;
    for (int l = 0; l < 32; l++) want_full += in[w * 32 + l];
    for (int l = 0; l < 16; l++) want_half += in[w * 32 + l];
    for (int l = 0; l < 32; l++) EXPECT_EQ(full[w * 32 + l], want_full) << "xor butterfly: every lane holds the sum";
    EXPECT_EQ(half[w], want_half);
  }
}

__global__ void ballot_and_broadcast(const int* pred, unsigned* ballots, int* from_lane5) {
  const int lane = (int)threadIdx.x % WARP_SIZE;
  unsigned b = __ballot_sync(0xffffffffu, pred[threadIdx.x]);
  int v = __shfl_sync(0xffffffffu, (int)threadIdx.x * 10, 5);
  if (lane == 0) ballots[threadIdx.x / WARP_SIZE] = b;
  from_lane5[threadIdx.x] = v;
}

TEST(Simt, BallotAndBroadcast) {
  std::vector<int> pred(64), from5(64);
  std::vector<unsigned> ballots(2);
  for (int i = 0; i < 64; i++) pred[i] = i % 3 == 0;
  LLMT_LAUNCH(ballot_and_broadcast, 1, 64, 0, nullptr, pred.data(), ballots.data(), from5.data());
  for (int w = 0; w < 2; w++) {
    unsigned want = 0;
    for (int l = 0; l < 32; l++)
      if (pred[w * 32 + l]) want |= 1u << l;
    EXPECT_EQ(ballots[w], want);
    for (int l = 0; l < 32; l++) EXPECT_EQ(from5[w * 32 + l], (w * 32 + 5) * 10);
  }
}

// Threads past n return before the block's barrier while the others wait there: undefined on a GPU
// (every live thread of a block must reach each __syncthreads), an error here (synccheck).
__global__ void early_return(int* out, int n) {
  LLMT_SHARED(int, count, );
  if ((int)threadIdx.x >= n) return;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  atomicAdd(&count, 1);
  __syncthreads();
  out[threadIdx.x] = count;
}

TEST(Simt, ExitingBeforeASyncthreadsTheOthersWaitAtIsAnError) {
  std::vector<int> out(128, -1);
  try {
    LLMT_LAUNCH(early_return, 1, 128, 0, nullptr, out.data(), 70);
    FAIL() << "no error";
  } catch (const llmt::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("kernel early_return"), std::string::npos) << what;
    EXPECT_NE(what.find("threads 70-127 exited"), std::string::npos) << what;
    EXPECT_NE(what.find("threads 0-69 at __syncthreads simt_test.cpp:"), std::string::npos) << what;
  }
}

// Threads that leave after the block's last barrier are fine.
__global__ void return_after_barrier(int* out, int n) {
  LLMT_SHARED(int, buf, [128]);
  buf[threadIdx.x] = (int)threadIdx.x;
  __syncthreads();
  if ((int)threadIdx.x >= n) return;
  out[threadIdx.x] = buf[(threadIdx.x + 1) % 128];
}

TEST(Simt, ExitingAfterTheLastSyncthreadsIsFine) {
  std::vector<int> out(128, -1);
  LLMT_LAUNCH(return_after_barrier, 1, 128, 0, nullptr, out.data(), 70);
  for (int i = 0; i < 70; i++) EXPECT_EQ(out[i], (i + 1) % 128);
  EXPECT_EQ(out[70], -1);
}

// Two halves of the block at two different __syncthreads: on a GPU a hang or worse, whether or not
// the counts happen to match; here an error naming both lines (synccheck).
__global__ void divergent_barriers(int* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

TEST(Simt, SyncthreadsAtDifferentLinesIsAnError) {
  std::vector<int> out(64);
  try {
    LLMT_LAUNCH(divergent_barriers, 1, 64, 0, nullptr, out.data());
    FAIL() << "no error";
  } catch (const llmt::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("different __syncthreads"), std::string::npos) << what;
    EXPECT_NE(what.find("threads 0-31 at __syncthreads"), std::string::npos) << what;
    EXPECT_NE(what.find("threads 32-63 at __syncthreads"), std::string::npos) << what;
  }
}

// The halves of a warp in two different shuffles with the same full mask: the emulator would pair
// them up; a GPU need not. An error naming both (synccheck).
__global__ void divergent_shuffles(float* out) {
  const int lane = (int)threadIdx.x % WARP_SIZE;
  float v = (float)lane;
  if (lane < 16)
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  else
    v = __shfl_xor_sync(0xffffffffu, v, 2);
  out[threadIdx.x] = v;
}

TEST(Simt, LanesMeetingInDifferentWarpOperationsIsAnError) {
  std::vector<float> out(32);
  try {
    LLMT_LAUNCH(divergent_shuffles, 1, 32, 0, nullptr, out.data());
    FAIL() << "no error";
  } catch (const llmt::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("different warp operations"), std::string::npos) << what;
    EXPECT_NE(what.find("threads 0-15 at a shuffle simt_test.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("threads 16-31 at a shuffle simt_test.cpp:"), std::string::npos) << what;
  }
}

// What fresh shared memory holds, as each thread reads it before any thread wrote it.
__global__ void read_fresh_shared(uint32_t* out) {
  LLMT_SHARED(uint32_t, fixed, [64]);
  uint32_t* dynamic = LLMT_DYNAMIC_SHARED(uint32_t);
  out[threadIdx.x] = fixed[threadIdx.x];
  out[64 + threadIdx.x] = dynamic[threadIdx.x];
}

TEST(Simt, FreshDeviceAndSharedMemoryArePoisoned) {
  uint32_t* d = nullptr;
  ASSERT_EQ(cudaMalloc((void**)&d, 128 * sizeof(uint32_t)), cudaSuccess);
  std::vector<uint32_t> fresh(128);
  ASSERT_EQ(cudaMemcpy(fresh.data(), d, 128 * sizeof(uint32_t), cudaMemcpyDeviceToHost), cudaSuccess);
  const uint32_t want = llmt::simt::poisons_memory() ? 0xffffffffu : 0u;  // LLMT_SIMT_POISON=0: zeros
  for (uint32_t v : fresh) ASSERT_EQ(v, want) << "a fresh cudaMalloc allocation";
  float f;
  std::memcpy(&f, &fresh[0], 4);
  if (llmt::simt::poisons_memory()) {
    EXPECT_TRUE(std::isnan(f)) << "the poison reads as NaN";
  }
  LLMT_LAUNCH(read_fresh_shared, 1, 64, 64 * sizeof(uint32_t), nullptr, d);
  ASSERT_EQ(cudaMemcpy(fresh.data(), d, 128 * sizeof(uint32_t), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < 128; i++) EXPECT_EQ(fresh[i], want) << (i < 64 ? "static" : "dynamic") << " shared, thread " << i % 64;
  ASSERT_EQ(cudaFree(d), cudaSuccess);
}

// Schedules (ctest simt.schedule.emulator runs these under LLMT_SIMT_SCHEDULE=reverse, shuffle:1 and
// shuffle:2; simt.emulator in forward order). Thread t reads what thread t - 1 wrote to shared memory
// with no barrier between: in forward order the writer always runs first and the kernel passes.
__global__ void shift_without_barrier(float* out, const float* in) {
  LLMT_SHARED(float, buf, [64]);
  const int t = (int)threadIdx.x;
  buf[t] = in[t];
  out[t] = t > 0 ? buf[t - 1] : 0.0f;
}
// The same with the barrier.
__global__ void shift_with_barrier(float* out, const float* in) {
  LLMT_SHARED(float, buf, [64]);
  const int t = (int)threadIdx.x;
  buf[t] = in[t];
  __syncthreads();
  out[t] = t > 0 ? buf[t - 1] : 0.0f;
}

struct DeviceFloats {
  float* p = nullptr;
  explicit DeviceFloats(const std::vector<float>& h) {
    EXPECT_EQ(cudaMalloc((void**)&p, h.size() * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(p); }
  std::vector<float> host(size_t n) const {
    std::vector<float> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

TEST(SimtSchedule, AMissingBarrierPassesForwardAndFailsInAnyOtherOrder) {
  std::vector<float> in(64);
  for (int i = 0; i < 64; i++) in[i] = (float)(i + 1);
  DeviceFloats din(in), dout(std::vector<float>(64, 0.0f));
  const std::string schedule = llmt::simt::schedule_name();
  if (schedule == "forward") {
    LLMT_LAUNCH(shift_without_barrier, 1, 64, 0, nullptr, dout.p, din.p);
    const std::vector<float> out = dout.host(64);
    for (int t = 1; t < 64; t++) EXPECT_EQ(out[t], in[t - 1]) << "forward order hides the missing barrier";
    return;
  }
  try {
    LLMT_LAUNCH(shift_without_barrier, 1, 64, 0, nullptr, dout.p, din.p);
    FAIL() << "no error under LLMT_SIMT_SCHEDULE=" << schedule;
  } catch (const llmt::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("kernel shift_without_barrier gives other results under LLMT_SIMT_SCHEDULE=" + schedule),
              std::string::npos) << what;
  }
}

TEST(SimtSchedule, KernelsWithTheirBarriersGiveTheSameBytesInEveryOrder) {
  std::vector<float> in(64);
  for (int i = 0; i < 64; i++) in[i] = std::sin((float)i);
  DeviceFloats din(in), dout(std::vector<float>(64, 0.0f));
  LLMT_LAUNCH(shift_with_barrier, 1, 64, 0, nullptr, dout.p, din.p);
  const std::vector<float> out = dout.host(64);
  for (int t = 1; t < 64; t++) EXPECT_EQ(out[t], in[t - 1]);
  // blocks in another order, and warps running ahead of each other up to their barriers
  std::vector<int> ids(1000);
  std::iota(ids.begin(), ids.end(), 1);
  int* dids = nullptr;
  int* dsums = nullptr;
  ASSERT_EQ(cudaMalloc((void**)&dids, ids.size() * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc((void**)&dsums, 4 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dids, ids.data(), ids.size() * sizeof(int), cudaMemcpyHostToDevice), cudaSuccess);
  LLMT_LAUNCH(block_tree_sum, 4, 256, 0, nullptr, dids, dsums, (int)ids.size());
  std::vector<int> sums(4);
  ASSERT_EQ(cudaMemcpy(sums.data(), dsums, sizeof(int) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(sums[0] + sums[1] + sums[2] + sums[3], 1000 * 1001 / 2);
  ASSERT_EQ(cudaFree(dids), cudaSuccess);
  ASSERT_EQ(cudaFree(dsums), cudaSuccess);
}

TEST(SimtSchedule, AWritableHostPointerIsRefusedInAnyOtherOrder) {
  if (std::string(llmt::simt::schedule_name()) == "forward") GTEST_SKIP() << "a host pointer works in forward order";
  std::vector<float> in(64, 1.0f), out(64);
  DeviceFloats din(in);
  try {
    LLMT_LAUNCH(shift_with_barrier, 1, 64, 0, nullptr, out.data(), din.p);
    FAIL() << "no error";
  } catch (const llmt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("writable pointer to host memory"), std::string::npos) << e.what();
  }
}

// 2-D blocks, dynamic shared memory, atomics from every block.
__global__ void transpose_tile(const float* in, float* out, int n, float* total) {
  float* tile = LLMT_DYNAMIC_SHARED(float);
  const int x = (int)(blockIdx.x * blockDim.x + threadIdx.x), y = (int)(blockIdx.y * blockDim.y + threadIdx.y);
  const int w = (int)blockDim.x;
  tile[threadIdx.y * w + threadIdx.x] = in[y * n + x];
  __syncthreads();
  const int tx = (int)(blockIdx.y * blockDim.y + threadIdx.x), ty = (int)(blockIdx.x * blockDim.x + threadIdx.y);
  out[ty * n + tx] = tile[threadIdx.x * w + threadIdx.y];
  atomicAdd(total, in[y * n + x]);
}

TEST(Simt, TwoDimensionalBlocksDynamicSharedAtomics) {
  const int n = 32;
  std::vector<float> in(n * n), out(n * n, -1.f);
  float total = 0.f;
  for (int i = 0; i < n * n; i++) in[i] = (float)(i % 17);
  LLMT_LAUNCH(transpose_tile, dim3(4, 4), dim3(8, 8), 8 * 8 * sizeof(float), nullptr, in.data(), out.data(), n, &total);
  for (int r = 0; r < n; r++)
    for (int c = 0; c < n; c++) ASSERT_EQ(out[c * n + r], in[r * n + c]) << r << "," << c;
  EXPECT_EQ(total, std::accumulate(in.begin(), in.end(), 0.f));
}

TEST(Simt, BadLaunchConfigurationIsALaunchError) {
  std::vector<int> out(4);
  LLMT_LAUNCH(early_return, 1, 2048, 0, nullptr, out.data(), 4);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the error is cleared once read";
}

// Lane 0 leaves; the others then shuffle with a full mask that still names it: undefined on a GPU,
// an error here.
__global__ void shuffle_with_exited_lane(float* out) {
  if (threadIdx.x == 0) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

TEST(Simt, WarpOperationNamingAnExitedLaneIsAnError) {
  std::vector<float> out(32);
  try {
    LLMT_LAUNCH(shuffle_with_exited_lane, 1, 32, 0, nullptr, out.data());
    FAIL() << "no error";
  } catch (const llmt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("already exited"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("shuffle_with_exited_lane"), std::string::npos) << e.what();
  }
}

// Warp 0's lanes wait for each other in a shuffle while lane 0 waits at __syncthreads: a hang on a GPU.
__global__ void barrier_deadlock(float* out) {
  if (threadIdx.x == 0) {
    __syncthreads();
  } else if (threadIdx.x < 32) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  }
}

TEST(Simt, BarriersThatCanNeverCompleteAreAnError) {
  std::vector<float> out(64);
  try {
    LLMT_LAUNCH(barrier_deadlock, 1, 64, 0, nullptr, out.data());
    FAIL() << "no error";
  } catch (const llmt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("can never complete"), std::string::npos) << e.what();
  }
}

}  // namespace

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
// The device-memory guard: the host may reach device memory only through cudaMemcpy / cudaMemset or
// inside a kernel, as on a GPU; a direct host read stops the program with a message.
__global__ void fill_kernel(float* p, int n) {
  int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) p[i] = (float)i;
}
TEST(SimtDeathTest, HostReadOfDeviceMemoryStopsTheProgram) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc((void**)&d, 64 * sizeof(float)), cudaSuccess);
  LLMT_LAUNCH(fill_kernel, 1, 64, 0, nullptr, d, 64);
  float h[64];
  ASSERT_EQ(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(h[63], 63.0f);  // through the runtime: fine
  EXPECT_DEATH({ volatile float x = d[5]; (void)x; }, "the host touched device memory");
  ASSERT_EQ(cudaFree(d), cudaSuccess);
  // ctest runs this test once more with LLMT_SIMT_GUARD=mprotect (simt.guard_mprotect)
  const char* want = std::getenv("LLMT_SIMT_GUARD");
  const std::string guard = llmt::simt::device_memory_guard();
  if (want && std::string(want) == "mprotect") {
    EXPECT_EQ(guard, "mprotect");
  }
  std::printf("device-memory guard: %s\n", guard.c_str());
}

// Under protection keys the guard is per thread: while one thread works on device memory (a stand-in
// inside HostAccess), another thread's host code is still kept out.
TEST(SimtDeathTest, AnotherThreadStaysShutWhileOneHasAccess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc((void**)&d, 64 * sizeof(float)), cudaSuccess);
  if (std::string(llmt::simt::device_memory_guard()) != "protection keys") {
    ASSERT_EQ(cudaFree(d), cudaSuccess);
    GTEST_SKIP() << "the guard here is " << llmt::simt::device_memory_guard() << ": it opens every thread at once";
  }
  // The other thread is made before this one opens: a thread starts with its maker's PKRU.
  auto touch_from_another_thread = [d] {
    std::atomic<bool> go{false};
    std::thread other([d, &go] {
      while (!go) std::this_thread::yield();
      volatile float x = d[5];
      (void)x;
    });
    llmt::simt::HostAccess open;
    d[3] = 1.0f;  // this thread may
    go = true;
    other.join();
  };
  EXPECT_DEATH(touch_from_another_thread(), "the host touched device memory");
  ASSERT_EQ(cudaFree(d), cudaSuccess);
}
#endif

// cuDNN's graph-API stand-in (simt/cudnn_frontend_simt.h) refuses what cuDNN's documentation rules
// out, so a mistake in kernels/cuda/cudnn_attention.cpp's graphs fails here as it would on a GPU.
namespace {
namespace fe = cudnn_frontend;
using TA = fe::graph::Tensor_attributes;

// A forward graph over one [1, 2, 16, hs] q, k and v (dense), o and stats outputs, built as far as
// it goes; the error of the first step that refuses it. left >= 0: a diagonal band left bound (a
// sliding window); causal: the causal mask.
fe::error_t forward_graph(fe::graph::Graph& g, int64_t hs, bool stats_flag, bool o_uid, int left = -1,
                          bool causal = true) {
  g.set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto t = [&](const char* name, int64_t uid) {
    return g.tensor(TA().set_name(name).set_uid(uid).set_dim({1, 2, 16, hs}).set_stride({32 * hs, 16 * hs, hs, 1}));
  };
  auto q = t("q", 1), k = t("k", 2), v = t("v", 3);
  auto attrs = fe::graph::SDPA_attributes().set_causal_mask(causal).set_attn_scale(0.5f);
  if (stats_flag) attrs.set_generate_stats(true);
  if (left >= 0) attrs.set_diagonal_band_left_bound(left);
  auto [o, stats] = g.sdpa(q, k, v, attrs);
  o->set_output(true).set_dim({1, 2, 16, hs}).set_stride({32 * hs, 16 * hs, hs, 1});
  if (o_uid) o->set_uid(4);
  stats->set_output(true).set_uid(5).set_dim({1, 2, 16, 1}).set_stride({32, 16, 1, 1}).set_data_type(fe::DataType_t::FLOAT);
  cudnnHandle_t h = nullptr;
  EXPECT_EQ(fe::detail::create_handle(&h), CUDNN_STATUS_SUCCESS);
  fe::error_t e = g.validate();
  if (e.is_good()) e = g.build_operation_graph(h);
  if (e.is_good()) e = g.create_execution_plans({fe::HeurMode_t::A});
  if (e.is_good()) e = g.check_support(h);
  if (e.is_good()) e = g.build_plans(h);
  EXPECT_EQ(fe::detail::destroy_handle(h), CUDNN_STATUS_SUCCESS);
  return e;
}
}  // namespace

TEST(CudnnStandIn, RefusesGraphsCudnnRulesOut) {
  {
    fe::graph::Graph g;
    EXPECT_TRUE(forward_graph(g, 64, true, true).is_good());
    int64_t ws = -1;
    EXPECT_TRUE(g.get_workspace_size(ws).is_good());
    EXPECT_EQ(ws, 0);
    std::unordered_map<int64_t, void*> pack = {{1, nullptr}};
    cudnnHandle_t h = nullptr;
    ASSERT_EQ(fe::detail::create_handle(&h), CUDNN_STATUS_SUCCESS);
    fe::error_t e = g.execute(h, pack, nullptr);
    EXPECT_FALSE(e.is_good());
    EXPECT_NE(e.get_message().find("no pointer"), std::string::npos) << e.get_message();
    pack[77] = &ws;
    e = g.execute(h, pack, nullptr);
    EXPECT_NE(e.get_message().find("uid 77"), std::string::npos) << e.get_message();
    EXPECT_EQ(fe::detail::destroy_handle(h), CUDNN_STATUS_SUCCESS);
  }
  struct Bad {
    int64_t hs;
    bool stats_flag, o_uid;
    const char* says;
  };
  for (Bad b : {Bad{12, true, true, "multiple of 8"}, Bad{264, true, true, "at most 256"},
                Bad{64, false, true, "generate_stats"}, Bad{64, true, false, "no uid"}}) {
    fe::graph::Graph g;
    fe::error_t e = forward_graph(g, b.hs, b.stats_flag, b.o_uid);
    EXPECT_FALSE(e.is_good()) << b.says;
    EXPECT_NE(e.get_message().find(b.says), std::string::npos) << e.get_message();
  }
  {
    fe::graph::Graph g;
    EXPECT_FALSE(g.validate().is_good()) << "a graph with no node";
  }
  // a sliding window is the band's left bound: positive, as the frontend requires, and (the stand-in
  // implements no other) with the causal mask
  {
    fe::graph::Graph g;
    EXPECT_TRUE(forward_graph(g, 64, true, true, 8).is_good());
  }
  struct BadBand {
    int left;
    bool causal;
    const char* says;
  };
  for (BadBand b : {BadBand{0, true, "greater than zero"}, BadBand{8, false, "causal mask"}}) {
    fe::graph::Graph g;
    fe::error_t e = forward_graph(g, 64, true, true, b.left, b.causal);
    EXPECT_FALSE(e.is_good()) << b.says;
    EXPECT_NE(e.get_message().find(b.says), std::string::npos) << e.get_message();
  }
}
