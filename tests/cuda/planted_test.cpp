// The emulator as a sanitizer, proven on planted defects (docs/design.md, "The emulator as a
// sanitizer"). CMakeLists.txt builds this file against copies of the project's kernels with four
// defects planted by text (tests/cuda/plant_defects.cmake):
//   1. flash_forward_kernel: the __syncthreads between a K/V tile's cp.async copies landing (each
//      thread's own) and the warps reading the whole tile, deleted;
//   2. column_partials_kernel (bias and norm-weight gradients): the __syncthreads between the row
//      lanes' partial sums and the first lane's reading them, deleted;
//   3. ldmatrix_kernel (the ldmatrix probe): the __syncwarp between the lanes' stores to shared
//      memory and the ldmatrix that reads them, deleted;
//   4. block_sum_all (RMSNorm's and LayerNorm's row sums): the last warp's reading one slot past
//      the warps' partial sums, which no thread wrote.
// Each test runs its kernel once; what must catch it depends on the mode ctest runs it in
// (simt.planted.*): a schedule other than forward (the emulator's error names the kernel), poison
// (NaN where the read slot was never written), racecheck (ThreadSanitizer's report names the kernel;
// the ctest entry matches it). A test whose mode does not apply to its defect skips, saying why.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_platform.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/mma_probe.h"

namespace llmt {
namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool kRacecheck = true;
#else
constexpr bool kRacecheck = false;
#endif

bool schedule_is_forward() { return std::string(simt::schedule_name()) == "forward"; }

template <class T>
struct Device {
  T* p = nullptr;
  size_t n = 0;
  explicit Device(const std::vector<T>& host) : n(host.size()) {
    EXPECT_EQ(cudaMalloc((void**)&p, n * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit Device(size_t count) : Device(std::vector<T>(count)) {}
  ~Device() { cudaFree(p); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

// Runs `launch`; in a schedule other than forward it must throw the emulator's error naming
// `kernel`; under racecheck ThreadSanitizer must have stopped the process before it returns.
template <class F>
void expect_caught(const char* kernel, F launch) {
  if (kRacecheck) {
    launch();
    ADD_FAILURE() << "ThreadSanitizer reported no race in " << kernel;
    return;
  }
  if (schedule_is_forward()) GTEST_SKIP() << "a missing barrier shows under LLMT_SIMT_SCHEDULE=reverse|shuffle:N";
  try {
    launch();
    ADD_FAILURE() << "no error from " << kernel << " under LLMT_SIMT_SCHEDULE=" << simt::schedule_name();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(std::string("kernel ") + kernel), std::string::npos) << what;
    EXPECT_NE(what.find("other results under LLMT_SIMT_SCHEDULE"), std::string::npos) << what;
  }
}

uint16_t bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

TEST(PlantedDefects, FlashForwardWithoutTheBarrierAfterItsTileLoads) {
  const int B = 1, T = 128, NH = 2, NKV = 2, hs = 64;
  std::vector<uint16_t> qkv((size_t)B * T * (NH + 2 * NKV) * hs);
  for (size_t i = 0; i < qkv.size(); i++) qkv[i] = bf16(std::sin(0.37f * (float)i));
  Device<uint16_t> dqkv(qkv), out((size_t)B * T * NH * hs);
  Device<float> lse((size_t)B * NH * T);
  expect_caught("flash_forward_kernel<64, false, false>", [&] {
    cuda::flash_attention_forward(out.p, lse.p, dqkv.p, nullptr, B, T, NH, NKV, hs, Dropout{}, 0,
                                  1.0f / std::sqrt((float)hs), 0.0f, nullptr);
  });
}

TEST(PlantedDefects, ColumnSumsWithoutTheBarrierBeforeTheirFirstLaneReads) {
  const int64_t M = 300;
  const int N = 70;
  std::vector<float> dout((size_t)M * N);
  for (size_t i = 0; i < dout.size(); i++) dout[i] = std::cos(0.11f * (float)i);
  Device<float> d(dout), dbias((size_t)N), partials(cuda::column_partials_bytes(M, N) / sizeof(float));
  expect_caught("column_partials_kernel<T, KIND, 1>",
                [&] { cuda::bias_backward<float>(dbias.p, d.p, M, N, partials.p, nullptr); });
}

TEST(PlantedDefects, LdmatrixProbeWithoutTheSyncwarpAfterItsStores) {
  if (!kRacecheck)
    GTEST_SKIP() << "a missing __syncwarp before ldmatrix shows under racecheck only: the emulator's ldmatrix reads "
                    "its rows once every lane has arrived";
  std::vector<uint16_t> m(4 * 64);
  for (size_t i = 0; i < m.size(); i++) m[i] = (uint16_t)i;
  Device<uint16_t> dm(m);
  Device<uint32_t> out(32 * 4);
  expect_caught("ldmatrix_kernel", [&] { cuda::ldmatrix_probe(out.p, dm.p, 4, false); });
}

// RMSNorm over rows of 64 f32 channels (16 chunks of 16 bytes: a block of one warp), the warp's partial
// sum, and the planted read of a second slot that no warp wrote.
TEST(PlantedDefects, RowSumReadingASharedSlotNoThreadWrote) {
  if (kRacecheck) GTEST_SKIP() << "a read of memory never written is poison's to find, not racecheck's";
  const int64_t N = 4;
  const int C = 64;
  std::vector<float> x((size_t)N * C), w((size_t)C, 1.0f);
  for (size_t i = 0; i < x.size(); i++) x[i] = 1.0f + 0.01f * (float)(i % 7);
  Device<float> dx(x), dw(w), out((size_t)N * C), rstd((size_t)N);
  auto run = [&] { cuda::rmsnorm_forward<float>(out.p, rstd.p, dx.p, dw.p, N, C, 1e-5f, 0.0f, nullptr); };
  if (!schedule_is_forward()) {  // the two runs' shared memory holds different patterns
    try {
      run();
      ADD_FAILURE() << "no error under LLMT_SIMT_SCHEDULE=" << simt::schedule_name();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("kernel rmsnorm_forward_vec_kernel<T, 1>"), std::string::npos) << e.what();
    }
    return;
  }
  run();
  const std::vector<float> r = rstd.host();
  if (simt::poisons_memory()) {
    for (int64_t i = 0; i < N; i++) EXPECT_TRUE(std::isnan(r[(size_t)i])) << "row " << i << ": " << r[(size_t)i];
  } else {  // LLMT_SIMT_POISON=0 (ctest simt.planted.poison_off): the slot holds 0 and hides the defect
    for (int64_t i = 0; i < N; i++) EXPECT_FALSE(std::isnan(r[(size_t)i])) << "row " << i;
  }
}

}  // namespace
}  // namespace llmt
