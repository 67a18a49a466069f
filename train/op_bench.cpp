// `llmt bench --ops True`: the step's main ops alone, at the shapes one training step of the model
// runs them (docs/performance.md). Attention forward and backward, and every matmul of a block and
// the LM head, each as its forward product and the two products of its backward; each timed on its
// own after warm-up, one JSON line per op with its TFLOP/s against the device's peak.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmt_commit.h"

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "models/config.h"
#include "train/bench.h"
#include "train/session.h"

namespace llmt {

namespace {

// Random values in [-1, 1) in the tensor's dtype: zeros would flatter a tensor core's power draw.
void fill_random(Backend& be, const Tensor& t, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t n = t.numel();
  if (t.dtype == DType::bf16) {
    std::vector<uint16_t> h((size_t)n);
    for (auto& v : h) v = f32_to_bf16(u(rng));
    be.copy_from_host(t.data, h.data(), h.size() * 2);
  } else {
    std::vector<float> h((size_t)n);
    for (auto& v : h) v = u(rng);
    be.copy_from_host(t.data, h.data(), h.size() * 4);
  }
}

// Median milliseconds of `op` over `reps` timed runs after `warmup` untimed ones, each ended by a
// synchronize (a few microseconds on a GPU, small beside the ops measured here).
template <class Op>
double time_ms(Backend& be, int warmup, int reps, Op op) {
  for (int i = 0; i < warmup; i++) op();
  be.synchronize();
  std::vector<double> ms;
  for (int i = 0; i < reps; i++) {
    auto t0 = std::chrono::steady_clock::now();
    op();
    be.synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
}

struct Linear {
  const char* name;
  int64_t out, in;  // the weight is [out, in], as the model stores it
};

}  // namespace

void run_op_bench(const BenchArgs& a, ControlComm& world, const LaunchInfo& launch) {
  const ModelConfig cfg = resolve_model_config(a.model);
  const DType act = a.bf16 ? DType::bf16 : DType::f32;
  const bool cuda = a.device == "cuda";
  const int gpu = cuda ? cuda_device_for_rank(launch) : -1;  // the GPU train and bench would use
  const int threads = a.threads > 0 ? a.threads : default_threads_per_rank(launch);
  std::unique_ptr<Backend> be = cuda ? make_cuda_backend(gpu, act, a.tf32) : make_cpu_backend(threads, act);
  const double peak_tflops = cuda ? cuda_peak_tflops(gpu, act, a.tf32) : measured_matmul_peak_gflops(*be, world) / 1e3;
  const double peak_gbs = cuda ? cuda_peak_bandwidth_gbs(gpu) : 0.0;  // 0: unknown (the CPU, an unknown GPU)
  const char* peak_source = cuda ? "the datasheet's dense figure for this GPU (0: unknown)"
                                 : "measured: the matmul library's 2048^3 product on this rank's threads";
  const int B = a.batch, T = a.seq_len, NH = cfg.n_head, NKV = cfg.n_kv_head, hs = cfg.head_size();
  const int64_t N = (int64_t)B * T, C = cfg.d_model, Q = (int64_t)NH * hs;
  const int warmup = std::max(1, a.warmup), reps = a.steps;

  nlohmann::json common = {{"model", a.model},      {"device", a.device},     {"batch", B},
                           {"seq_len", T},          {"compute_dtype", dtype_name(act)},
                           {"tf32", a.tf32},        {"peak_tflops", peak_tflops}, {"peak_source", peak_source},
                           {"commit", LLMT_GIT_COMMIT}};
  if (cuda) common["gpu"] = cuda_device_description(gpu);
  const char* mm = std::getenv("LLMT_MATMUL");
  common["matmul_impl"] = mm && *mm ? mm : (cuda ? "default (cublaslt on a GPU, native under the emulator)" : "onednn");
  auto emit = [&](nlohmann::json j, double flops, double ms) {
    j.update(common);
    j["ms_median"] = ms;
    j["gflop"] = flops / 1e9;
    j["tflops"] = flops / (ms / 1e3) / 1e12;
    j["fraction_of_peak"] = peak_tflops > 0 ? nlohmann::json(flops / (ms / 1e3) / 1e12 / peak_tflops) : nlohmann::json();
    if (world.rank() == 0) {
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  };

  // attention first (the slowest op, so a run cut short keeps it). FLOPs as FlashAttention-2's paper
  // counts them: the forward's two products (4 T^2 hs per head) halved by the causal mask; the
  // backward 2.5 times the forward.
  {
    const int64_t QKV = cfg.qkv_dim();
    BackendBuffer qkv(*be, act, {N, QKV}), out(*be, act, {N, Q}), dout(*be, act, {N, Q}), dqkv(*be, act, {N, QKV}),
        lse(*be, DType::f32, {B, NH, T});
    fill_random(*be, qkv.tensor(), 4);
    fill_random(*be, dout.tensor(), 5);
    if (world.rank() == 0) std::fprintf(stderr, "bench  ops: attention B=%d T=%d heads %d/%d head size %d\n", B, T, NH,
                                        NKV, hs);
    const Dropout none;
    const double fwd = 2.0 * B * NH * (double)T * T * hs;
    nlohmann::json j = {{"op", "attention"}, {"heads", NH}, {"kv_heads", NKV}, {"head_size", hs}, {"causal", true},
                        {"implementation", cuda ? cuda_attention_kernels(act, hs) : std::string("cpu")}};
    double ms = time_ms(*be, warmup, reps, [&] {
      be->attention_forward(out.tensor(), lse.tensor(), qkv.tensor(), B, T, NH, NKV, hs, none);
    });
    j["name"] = "attention.forward";
    emit(j, fwd, ms);
    ms = time_ms(*be, warmup, reps, [&] {
      be->attention_backward(dqkv.tensor(), dout.tensor(), qkv.tensor(), out.tensor(), lse.tensor(), B, T, NH, NKV,
                             hs, none);
    });
    j["name"] = "attention.backward";
    emit(j, 2.5 * fwd, ms);
    // the same over packed documents (--packing): each row four documents of a quarter of T, the
    // last taking the rest; FLOPs as above, per document
    const int quarter = std::max(1, T / 4);
    std::vector<int32_t> starts((size_t)N);
    int64_t docs = 0;
    for (int64_t i = 0; i < N; i++) {
      const int t = (int)(i % T), d0 = std::min(t / quarter, 3) * quarter;
      starts[(size_t)i] = d0;
      docs += d0 == t;
    }
    double packed_fwd = 0;
    for (int t = 0; t < T; t++) {  // row 0's documents, every row alike
      if (starts[(size_t)t] != t) continue;
      int L = 1;
      while (t + L < T && starts[(size_t)(t + L)] == t) L++;
      packed_fwd += 2.0 * B * NH * (double)L * L * hs;
    }
    BackendBuffer doc_start(*be, DType::i32, {N});
    be->copy_from_host(doc_start.tensor().data, starts.data(), starts.size() * sizeof(int32_t));
    const PackedDocs packed{doc_start.tensor(), docs};
    j["implementation"] = cuda ? cuda_attention_kernels(act, hs, false, true) : std::string("cpu");
    j["documents"] = docs;
    ms = time_ms(*be, warmup, reps, [&] {
      be->attention_forward(out.tensor(), lse.tensor(), qkv.tensor(), B, T, NH, NKV, hs, none, packed);
    });
    j["name"] = "attention.forward.packed";
    emit(j, packed_fwd, ms);
    ms = time_ms(*be, warmup, reps, [&] {
      be->attention_backward(dqkv.tensor(), dout.tensor(), qkv.tensor(), out.tensor(), lse.tensor(), B, T, NH, NKV,
                             hs, none, packed);
    });
    j["name"] = "attention.backward.packed";
    emit(j, 2.5 * packed_fwd, ms);
  }

  // the memory-bound kernels at the step's shapes, with the bytes each call moves (each tensor read
  // or written once: what a kernel at the memory's speed would move), so a GPU's figure is GB/s
  // against its HBM peak: the norm (forward, and backward with its weight gradients), GPT-2's bias
  // gradient, the loss over the logits, AdamW over one block's parameters
  {
    const int64_t V = cfg.vocab_size, act_bytes = (int64_t)dtype_size(act), block_params = C * cfg.qkv_dim() +
                                                                                    Q * C + C * cfg.mlp_in_dim() + cfg.d_ff * C;
    BackendBuffer x(*be, act, {N, C}), y(*be, act, {N, C}), dy(*be, act, {N, C}), dx(*be, act, {N, C}),
        w(*be, act, {C}), b(*be, act, {C}), mean(*be, DType::f32, {N}), rstd(*be, DType::f32, {N}),
        dw(*be, DType::f32, {C}), db(*be, DType::f32, {C});
    fill_random(*be, x.tensor(), 6);
    fill_random(*be, dy.tensor(), 7);
    fill_random(*be, w.tensor(), 8);
    const bool ln = cfg.arch == Arch::gpt2;
    auto emit_bytes = [&](const std::string& name, double bytes, double ms) {
      nlohmann::json j = {{"op", "memory"}, {"name", name}, {"ms_median", ms}, {"bytes", bytes},
                          {"gb_per_s", bytes / (ms / 1e3) / 1e9}, {"peak_gb_per_s", peak_gbs},
                          {"fraction_of_bandwidth", peak_gbs > 0 ? nlohmann::json(bytes / (ms / 1e3) / 1e9 / peak_gbs)
                                                                 : nlohmann::json()}};
      j.update(common);
      if (world.rank() == 0) {
        std::printf("%s\n", j.dump().c_str());
        std::fflush(stdout);
      }
    };
    if (world.rank() == 0) std::fprintf(stderr, "bench  ops: memory-bound kernels on %lld rows of %lld\n", (long long)N,
                                        (long long)C);
    // x read, out written, the statistics written
    double ms = time_ms(*be, warmup, reps, [&] {
      if (ln) be->layernorm_forward(y.tensor(), mean.tensor(), rstd.tensor(), x.tensor(), w.tensor(), b.tensor(), N,
                                    (int)C, 1e-5f);
      else be->rmsnorm_forward(y.tensor(), rstd.tensor(), x.tensor(), w.tensor(), N, (int)C, 1e-6f);
    });
    emit_bytes(ln ? "layernorm.forward" : "rmsnorm.forward", (double)N * C * 2 * act_bytes + N * (ln ? 8.0 : 4.0), ms);
    // x and dout read, dx read and written (+=); the weight gradients read x and dout again
    ms = time_ms(*be, warmup, reps, [&] {
      if (ln) be->layernorm_backward(dx.tensor(), dw.tensor(), db.tensor(), dy.tensor(), x.tensor(), w.tensor(),
                                     mean.tensor(), rstd.tensor(), N, (int)C);
      else be->rmsnorm_backward(dx.tensor(), dw.tensor(), dy.tensor(), x.tensor(), w.tensor(), rstd.tensor(), N, (int)C);
    });
    emit_bytes(ln ? "layernorm.backward" : "rmsnorm.backward", (double)N * C * 6 * act_bytes, ms);
    if (ln) {
      ms = time_ms(*be, warmup, reps, [&] { be->bias_backward(db.tensor(), dy.tensor(), N, C); });
      emit_bytes("bias.backward", (double)N * C * act_bytes, ms);
    }
    {  // the loss: the logits read twice (max and sum, then dlogits) and dlogits written in place
      BackendBuffer logits(*be, act, {N, V}), targets(*be, DType::i32, {N}), loss(*be, DType::f64, {1});
      fill_random(*be, logits.tensor(), 9);
      std::vector<int32_t> t((size_t)N);
      for (int64_t i = 0; i < N; i++) t[(size_t)i] = (int32_t)(i * 7919 % V);
      be->copy_from_host(targets.tensor().data, t.data(), t.size() * sizeof(int32_t));
      ms = time_ms(*be, warmup, reps, [&] {
        be->cross_entropy(loss.tensor(), logits.tensor(), logits.tensor(), targets.tensor(), N, (int)V, 1.0f);
      });
      emit_bytes("cross_entropy", (double)N * V * 3 * act_bytes, ms);
    }
    {  // AdamW over one block's parameters: p, g, m, v read, p, m, v written, and the compute copy in bf16
      BackendBuffer p(*be, DType::f32, {block_params}), g(*be, DType::f32, {block_params}),
          m(*be, DType::f32, {block_params}), v(*be, DType::f32, {block_params}), pc(*be, act, {block_params});
      fill_random(*be, g.tensor(), 10);
      const DecaySpans decay = DecaySpans::all(block_params);
      int t = 0;
      ms = time_ms(*be, warmup, reps, [&] {
        be->adamw(p.tensor(), act == DType::bf16 ? pc.tensor() : Tensor(), g.tensor(), m.tensor(), v.tensor(),
                  block_params, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.1f, decay, ++t, 1.0f);
      });
      emit_bytes("adamw.block", (double)block_params * (28.0 + (act == DType::bf16 ? 2.0 : 0.0)), ms);
    }
  }

  // the matmuls of one block and the head, as models/transformer.cpp calls them
  const std::vector<Linear> linears = {{"qkv", cfg.qkv_dim(), C},
                                       {"attn_proj", C, Q},
                                       {"mlp_in", cfg.mlp_in_dim(), C},
                                       {"mlp_out", C, cfg.d_ff},
                                       {"lm_head", cfg.vocab_size, C}};
  for (const Linear& l : linears) {
    BackendBuffer x(*be, act, {N, l.in}), w(*be, act, {l.out, l.in}), y(*be, act, {N, l.out}),
        dx(*be, act, {N, l.in}), dw(*be, DType::f32, {l.out, l.in});
    fill_random(*be, x.tensor(), 1);
    fill_random(*be, w.tensor(), 2);
    fill_random(*be, y.tensor(), 3);
    const double flops = 2.0 * (double)N * (double)l.out * (double)l.in;
    const std::string name = l.name;
    if (world.rank() == 0) std::fprintf(stderr, "bench  ops: %s [%lld x %lld] on %lld rows\n", l.name,
                                        (long long)l.out, (long long)l.in, (long long)N);
    double ms = time_ms(*be, warmup, reps, [&] {
      be->matmul(y.tensor(), x.tensor(), w.tensor(), Tensor(), N, l.out, l.in, false, true, false);
    });
    emit({{"op", "matmul"}, {"name", name + ".forward"}, {"M", N}, {"N", l.out}, {"K", l.in}}, flops, ms);
    ms = time_ms(*be, warmup, reps, [&] {
      be->matmul(dx.tensor(), y.tensor(), w.tensor(), Tensor(), N, l.in, l.out, false, false, false);
    });
    emit({{"op", "matmul"}, {"name", name + ".backward_input"}, {"M", N}, {"N", l.in}, {"K", l.out}}, flops, ms);
    ms = time_ms(*be, warmup, reps, [&] {
      be->matmul(dw.tensor(), y.tensor(), x.tensor(), Tensor(), l.out, l.in, N, true, false, true);
    });
    emit({{"op", "matmul"}, {"name", name + ".backward_weight"}, {"M", l.out}, {"N", l.in}, {"K", N}}, flops, ms);
  }
}

}  // namespace llmt
