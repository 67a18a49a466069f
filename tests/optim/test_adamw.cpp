// adamw_step_range (engine/optim/adamw.h): one backend call for a unit's shard, with the tensors'
// weight decay as spans, gives bit for bit what a call per tensor gives, over any shard range.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "engine/optim/adamw.h"
#include "kernels/cpu/cpu_backend.h"

namespace llmt {
namespace {

// A GPT-2 block's shape of tensors, small: decaying matrices between biases and norm weights.
UnitLayout block_like() {
  UnitLayout u;
  u.add("ln_1.weight", {8}, false);
  u.add("ln_1.bias", {8}, false);
  u.add("attn.c_attn.weight", {8, 24}, true);
  u.add("attn.c_attn.bias", {24}, false);
  u.add("attn.c_proj.weight", {8, 8}, true);
  u.add("mlp.c_fc.weight", {8, 32}, true);  // two decaying tensors in a row: one span
  u.add("mlp.c_fc.bias", {32}, false);
  u.add("mlp.c_proj.weight", {32, 8}, true);
  u.add("mlp.c_proj.bias", {8}, false);
  return u;
}

struct State {
  std::vector<float> p, g, m, v;
};

// Random values in every tensor of u; the alignment gaps between them zero, as a store keeps them.
State random_state(const UnitLayout& u, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  const int64_t n = u.numel;
  State s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (const ParamSpec& p : u.params)
    for (int64_t i = p.offset; i < p.offset + p.numel(); i++)
      s.p[i] = d(rng), s.g[i] = d(rng), s.m[i] = 0.1f * d(rng), s.v[i] = 0.01f * (1 + d(rng));
  return s;
}

Tensor f32(std::vector<float>& x, int64_t from, int64_t n) { return Tensor(x.data() + from, DType::f32, {n}); }

// The old way, for reference: one call per tensor overlapping [lo, hi), its decay or none.
void per_tensor(Backend& be, const UnitLayout& u, int64_t lo, int64_t hi, State& s, const AdamWConfig& c, int t) {
  for (const ParamSpec& p : u.params) {
    const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel());
    if (a >= b) continue;
    be.adamw(f32(s.p, a, b - a), Tensor(), f32(s.g, a, b - a), f32(s.m, a, b - a), f32(s.v, a, b - a), b - a, 1e-2f,
             c.beta1, c.beta2, c.eps, p.decay ? c.weight_decay : 0.0f, DecaySpans::all(b - a), t, 0.5f);
  }
}

TEST(AdamWStepRange, OneCallPerShardEqualsACallPerTensorBitForBit) {
  const UnitLayout u = block_like();
  auto be = make_cpu_backend(2);
  AdamWConfig c;
  c.weight_decay = 0.5f;
  // shard ranges as FSDP cuts them: the whole unit, halves, thirds, one inside a tensor
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, u.numel}, {0, u.numel / 2}, {u.numel / 2, u.numel}, {u.numel / 3, 2 * u.numel / 3}, {20, 30}};
  for (auto [lo, hi] : ranges) {
    SCOPED_TRACE(::testing::Message() << "range [" << lo << ", " << hi << ")");
    State want = random_state(u, 5), got = want;
    for (int t = 1; t <= 3; t++) {
      per_tensor(*be, u, lo, hi, want, c, t);
      const int64_t ops = be->counters().ops;
      const int64_t n = hi - lo;
      adamw_step_range(*be, u, lo, hi, f32(got.p, lo, n), Tensor(), f32(got.g, lo, n), f32(got.m, lo, n),
                       f32(got.v, lo, n), 1e-2f, c, t, 0.5f);
      EXPECT_EQ(be->counters().ops - ops, 1) << "one call for the shard";
    }
    EXPECT_EQ(got.p, want.p);
    EXPECT_EQ(got.m, want.m);
    EXPECT_EQ(got.v, want.v);
  }
}

TEST(AdamWStepRange, MoreDecaySpansThanACallTakesAreSplitIntoCalls) {
  UnitLayout u;  // 20 decaying matrices, each followed by a bias: 20 spans, over DecaySpans::kMax
  for (int i = 0; i < 20; i++) {
    u.add("w" + std::to_string(i), {4, 4}, true);
    u.add("b" + std::to_string(i), {4}, false);
  }
  auto be = make_cpu_backend(1);
  AdamWConfig c;
  c.weight_decay = 0.5f;
  State want = random_state(u, 6), got = want;
  per_tensor(*be, u, 0, u.numel, want, c, 1);
  const int64_t ops = be->counters().ops;
  adamw_step_range(*be, u, 0, u.numel, f32(got.p, 0, u.numel), Tensor(), f32(got.g, 0, u.numel),
                   f32(got.m, 0, u.numel), f32(got.v, 0, u.numel), 1e-2f, c, 1, 0.5f);
  EXPECT_EQ(be->counters().ops - ops, 2) << "16 spans, then 4";
  ASSERT_EQ(u.params[1].offset + 4 + 4, u.params[2].offset) << "a 4-element gap after each bias, inside the calls";
  for (int i = 0; i < 19; i++)
    for (int k = 4; k < 8; k++) EXPECT_EQ(got.p[(size_t)(u.params[2 * i + 1].offset + k)], 0.0f) << "a gap stays zero";
  EXPECT_EQ(got.p, want.p);
  EXPECT_EQ(got.m, want.m);
  EXPECT_EQ(got.v, want.v);
}

}  // namespace
}  // namespace llmt
