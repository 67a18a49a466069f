// The CPU's widened bf16 matmuls keep the fp32 copy of a weight inside parameters a store holds
// unchanged (Backend::params_held), made at its first use: the same results as widening at every
// use, and never a copy of parameters that have changed since (a load, an optimizer step).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/dist/communicator.h"
#include "engine/fsdp/fsdp.h"
#include "kernels/cpu/cpu_backend.h"

using namespace llmt;

namespace {

const int64_t M = 5, N = 24, K = 40;  // out[M, N] = x[M, K] w[N, K]^T: the forward's shape

// A bf16 backend whose matmuls all widen (the path of a CPU without bf16 instructions).
std::unique_ptr<Backend> widening_backend() {
  setenv("LLMT_CPU_BF16_MATMUL", "fp32", 1);
  std::unique_ptr<Backend> be = make_cpu_backend(2, DType::bf16);
  unsetenv("LLMT_CPU_BF16_MATMUL");
  return be;
}

std::vector<uint16_t> bf16_values(int64_t n, float scale, float shift) {
  std::vector<uint16_t> v((size_t)n);
  for (int64_t i = 0; i < n; i++) v[(size_t)i] = f32_to_bf16(scale * (float)((i * 37) % 23 - 11) + shift);
  return v;
}

// x w^T with w copied to a buffer of its own (never held): the widened-at-every-use result.
std::vector<uint16_t> fresh_matmul(Backend& be, const Tensor& x, const void* w_bf16) {
  BackendBuffer w(be, DType::bf16, {N, K}), out(be, DType::bf16, {M, N});
  be.copy(w.tensor().data, w_bf16, (size_t)(N * K) * 2);
  be.matmul(out.tensor(), x, w.tensor(), Tensor(), M, N, K, false, true, false);
  std::vector<uint16_t> host((size_t)(M * N));
  be.copy_to_host(host.data(), out.tensor().data, host.size() * 2);
  return host;
}

std::vector<uint16_t> matmul_with(Backend& be, const Tensor& x, const Tensor& w) {
  BackendBuffer out(be, DType::bf16, {M, N});
  be.matmul(out.tensor(), x, w, Tensor(), M, N, K, false, true, false);
  std::vector<uint16_t> host((size_t)(M * N));
  be.copy_to_host(host.data(), out.tensor().data, host.size() * 2);
  return host;
}

}  // namespace

TEST(CpuWidenedWeights, AHeldWeightGivesTheSameResultsAndIsReleasedWithItsParameters) {
  std::unique_ptr<Backend> be = widening_backend();
  BackendBuffer x(*be, DType::bf16, {M, K}), params(*be, DType::bf16, {N * K + 8});
  const std::vector<uint16_t> xv = bf16_values(M * K, 0.25f, 0.1f), w1 = bf16_values(N * K, 0.5f, -0.3f),
                              w2 = bf16_values(N * K, -0.75f, 0.2f);
  be->copy_from_host(x.tensor().data, xv.data(), xv.size() * 2);
  // the weight sits 8 elements into the unit's flat buffer, as a block's tensors do
  uint16_t* w = (uint16_t*)params.tensor().data + 8;
  const Tensor wt(w, DType::bf16, {N, K});
  be->copy_from_host(w, w1.data(), w1.size() * 2);
  const std::vector<uint16_t> want1 = fresh_matmul(*be, x.tensor(), w);
  be->params_held(params.tensor());
  EXPECT_EQ(matmul_with(*be, x.tensor(), wt), want1);  // widened now
  EXPECT_EQ(matmul_with(*be, x.tensor(), wt), want1);  // its copy
  be->params_released(params.tensor().data);
  // new values at the same address, held again: the copy of the old ones is gone
  be->copy_from_host(w, w2.data(), w2.size() * 2);
  const std::vector<uint16_t> want2 = fresh_matmul(*be, x.tensor(), w);
  ASSERT_NE(want1, want2);
  be->params_held(params.tensor());
  EXPECT_EQ(matmul_with(*be, x.tensor(), wt), want2);
  be->params_released(params.tensor().data);
}

// Through the store: after set_unit and after an optimizer step the compute copy has changed, and a
// matmul on the acquired unit must see the new values (a stale widened copy would train on the old).
TEST(CpuWidenedWeights, TheStoreReleasesWhatItsOptimizerAndLoadsChange) {
  std::unique_ptr<Backend> be = widening_backend();
  ParamLayout layout;
  layout.units.resize(1);
  layout.units[0].add("w", {N, K}, true);
  layout.total_numel = layout.units[0].numel;
  std::unique_ptr<DataComm> solo = make_solo_data_comm();
  FsdpStore store(*be, layout, Strategy::no_shard, *solo, 1);
  BackendBuffer x(*be, DType::bf16, {M, K});
  const std::vector<uint16_t> xv = bf16_values(M * K, 0.25f, 0.1f);
  be->copy_from_host(x.tensor().data, xv.data(), xv.size() * 2);
  std::vector<float> values((size_t)(N * K));
  for (size_t i = 0; i < values.size(); i++) values[i] = 0.01f * (float)((i * 13) % 29) - 0.1f;
  auto use = [&](const char* when) {  // the acquired unit against a fresh copy of it
    const Tensor p = store.acquire(0);
    const std::vector<uint16_t> want = fresh_matmul(*be, x.tensor(), p.data);
    EXPECT_EQ(matmul_with(*be, x.tensor(), Tensor(p.data, DType::bf16, {N, K})), want) << when;
    store.release(0);
    return want;
  };
  store.set_unit(0, values.data());
  const std::vector<uint16_t> first = use("after the first load");
  for (float& v : values) v = -2.0f * v + 0.05f;
  store.set_unit(0, values.data());
  const std::vector<uint16_t> loaded = use("after a second load");
  EXPECT_NE(loaded, first);
  std::vector<float> g((size_t)(N * K));
  for (size_t i = 0; i < g.size(); i++) g[i] = (float)((i * 7) % 5) - 2.0f;
  be->copy_from_host(store.grads(0).data, g.data(), g.size() * sizeof(float));
  store.grads_done(0);
  store.backward_done();
  AdamWConfig cfg;
  store.optimizer_step(0.1f, cfg, 1.0f);
  EXPECT_NE(use("after an optimizer step"), loaded);
}
