#include "engine/train/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/optim/adamw.h"
#include "models/transformer.h"

namespace llmt {

BenchArgs parse_bench_args(Flags& f) {
  BenchArgs a;
  a.model = f.get_string("model", a.model);
  a.device = f.get_string("device", a.device);
  a.batch = f.get_int("per_device_train_batch_size", a.batch);
  a.seq_len = f.get_int("seq_len", a.seq_len);
  a.steps = f.get_int("steps", a.steps);
  a.warmup = f.get_int("warmup", a.warmup);
  a.threads = f.get_int("threads", a.threads);
  LLMT_CHECK(a.batch > 0 && a.seq_len > 1 && a.steps > 0 && a.warmup >= 0,
             "llmt bench: batch, seq_len and steps must be positive and warmup not negative");
  LLMT_CHECK(a.device == "cpu", "llmt bench: --device %s is not available yet (cpu)", a.device.c_str());
  return a;
}

void run_bench(const BenchArgs& a) {
  ModelConfig cfg = resolve_model_config(a.model);
  auto be = make_cpu_backend(a.threads);
  Transformer model(cfg, *be, a.batch, a.seq_len);
  const ModelLayout& L = model.layout();
  FullUnitStore store(*be, L);
  for (size_t u = 0; u < L.units.size(); u++) init_unit_params(cfg, L.units[u], (int)u, 1337, store.params((int)u));
  AdamWConfig oc;
  oc.weight_decay = 0.1f;
  AdamW opt(*be, L, oc);
  std::vector<float*> params, grads;
  for (size_t u = 0; u < L.units.size(); u++) params.push_back(store.params((int)u)), grads.push_back(store.grads((int)u));

  const int64_t N = (int64_t)a.batch * a.seq_len;
  std::vector<int32_t> tokens((size_t)N), targets((size_t)N);
  uint64_t s = 12345;
  for (int64_t i = 0; i < N; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    tokens[(size_t)i] = (int32_t)((s >> 33) % (uint64_t)cfg.vocab_size);
  }
  for (int64_t i = 0; i < N; i++) targets[(size_t)i] = (i + 1) % a.seq_len ? tokens[(size_t)i + 1] : -100;

  // per step: total, and its phases (zero grads + forward, backward, norm + AdamW)
  std::vector<double> ms, fwd_ms, bwd_ms, opt_ms;
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  };
  double loss = 0.0;
  for (int it = 0; it < a.warmup + a.steps; it++) {
    auto t0 = std::chrono::steady_clock::now();
    store.zero_grads();
    loss = model.forward(store, tokens.data(), targets.data(), true, 1.0f / (float)N);
    be->synchronize();
    double t_fwd = since(t0);
    model.backward(store);
    be->synchronize();
    double t_bwd = since(t0) - t_fwd;
    double sq = 0.0;
    for (size_t u = 0; u < L.units.size(); u++) sq += be->sum_squares(Tensor(grads[u], DType::f32, {L.units[u].numel}), L.units[u].numel);
    opt.step(params, grads, 1e-4f, sq > 1.0 ? (float)(1.0 / std::sqrt(sq)) : 1.0f);
    be->synchronize();
    double dt = since(t0);
    if (it >= a.warmup) {
      ms.push_back(dt);
      fwd_ms.push_back(t_fwd);
      bwd_ms.push_back(t_bwd);
      opt_ms.push_back(dt - t_fwd - t_bwd);
    }
    std::fprintf(stderr, "step %d/%d%s: %.1f ms, loss %.4f\n", it + 1, a.warmup + a.steps, it < a.warmup ? " (warm-up)" : "",
                 dt, loss / (N - a.batch));
  }
  auto median_of = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  double median = median_of(ms);
  // FLOPs per token by the PaLM convention (DESIGN.md): 6 * matmul weights + 12 * layers * d_model * T.
  double flops_per_token = 6.0 * (double)L.matmul_numel + 12.0 * cfg.n_layer * cfg.d_model * a.seq_len;
  double step_flops = flops_per_token * (double)N;
  nlohmann::json j = {{"model", a.model},
                      {"device", a.device},
                      {"threads", be->threads()},
                      {"batch", a.batch},
                      {"seq_len", a.seq_len},
                      {"params", L.total_numel},
                      {"steps", a.steps},
                      {"step_ms_median", median},
                      {"step_ms_min", *std::min_element(ms.begin(), ms.end())},
                      {"forward_ms_median", median_of(fwd_ms)},
                      {"backward_ms_median", median_of(bwd_ms)},
                      {"optimizer_ms_median", median_of(opt_ms)},
                      {"tokens_per_s", (double)N / (median / 1000.0)},
                      {"gflop_per_step", step_flops / 1e9},
                      {"achieved_gflops", step_flops / (median / 1000.0) / 1e9},
                      {"flops_convention", "6*N_matmul + 12*L*d*T per token (PaLM B)"}};
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace llmt
