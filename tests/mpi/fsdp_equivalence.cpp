// FSDP equivalence under mpirun (ctest runs this at 1, 2, 3 and 4 ranks): every strategy, split
// over ranks and micro-batches in every way the world size allows, must give the loss at every
// step and the final parameters of a single process training on the whole global batch at once:
// in fp32, in bf16 (--bf16, gradients reduced in f32 or bf16), and with dropout (the masks depend on
// the sequence, not the split). Bounds: tests/tolerances.h (sums grouped differently round
// differently, nothing more). And the bytes each rank sends per step equal llmt plan's. And each
// family's transformers fixture, trained sharded at 1 and 2 ranks, gives transformers' losses and weights.
// With LLMT_TEST_DEVICE=cuda the sharded runs use the CUDA backend (the SIMT emulator in ctest),
// their collectives staged through host memory, against the same single-process CPU reference.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "engine/dist/launch.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/fsdp/fsdp.h"
#include "engine/fsdp/staged_comm.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "models/hf_checkpoint.h"
#include "models/transformer.h"
#include "tests/models/hf_fixture.h"
#include "tests/mpi/test_comm.h"
#include "tests/mpi/tiny_models.h"
#include "tests/test_util.h"
#include "tests/tolerances.h"
#include "train/plan.h"
#include "train/step.h"

using namespace llmt;

namespace {

ControlComm* g_world = nullptr;
std::string g_device = "cpu";  // the backend of the runs compared with the reference
int g_local_size = 1;
const int kSteps = 4, kGlobal = 12, kT = 11;
const float kLr = 3e-3f;
namespace tol = llmt_test::tol;

// What a run computes in and reduces in.
struct Precision {
  DType compute = DType::f32, reduce = DType::f32;
  std::string name() const {
    return std::string(compute == DType::f32 ? "f32" : "bf16") + (reduce == DType::f32 ? "" : " bf16-reduce");
  }
};

struct Outcome {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;  // full units at the end
  std::vector<std::vector<float>> grads;   // full units' gradients of the first step (single process only)
};

Outcome train(const ModelConfig& cfg, ControlComm& comm, Strategy s, int local_size, int B, int accum, bool ckpt,
              Precision prec = {}, double* comm_bytes_first_step = nullptr, double* peak_gathered = nullptr,
              const std::string& device = g_device) {
  std::unique_ptr<Backend> be =
      device == "cpu" ? make_cpu_backend(1, prec.compute) : make_cuda_backend(0, prec.compute, false);
  Transformer model(cfg, *be, B, kT, ckpt);
  const ModelLayout& L = model.layout();
  std::unique_ptr<DataComm> data = make_test_data_comm(comm, *be);
  FsdpStore store(*be, L, s, *data, local_size, prec.reduce);
  std::vector<float> host;
  for (size_t u = 0; u < L.units.size(); u++) {
    host.resize((size_t)L.units[u].numel);
    init_unit_params(cfg, L.units[u], (int)u, 7, host.data());
    store.set_unit((int)u, host.data());
  }
  AdamWConfig oc;
  oc.weight_decay = 0.1f;
  Outcome out;
  const int W = comm.size(), r = comm.rank();
  std::vector<int32_t> tokens, targets;
  tiny_global_batch(0, kGlobal, kT, tokens, targets);  // the same every step, so the loss must fall
  StepScalars scalars(*be);
  for (int step = 0; step < kSteps; step++) {
    std::vector<MicroBatch> micro;
    for (int m = 0; m < accum; m++) {
      int64_t first = (int64_t)(m * W + r) * B;  // the sampler's slicing of the global batch
      micro.push_back({tokens.data() + first * kT, targets.data() + first * kT, kT, first});
    }
    StepSettings ss;
    ss.lr = kLr;
    ss.adamw = oc;
    ss.max_grad_norm = 0.5;
    ss.seed = 11;
    ss.step = step;
    StepResult res = train_step(model, store, comm, *data, scalars, micro, ss);
    out.losses.push_back(res.loss);
    if (step == 0 && comm_bytes_first_step) *comm_bytes_first_step = store.comm_bytes() + data->stats().total();
    if (peak_gathered) *peak_gathered = (double)store.peak_gathered_bytes();
    if (step == 0 && comm.size() == 1)
      for (size_t u = 0; u < L.units.size(); u++) {
        out.grads.emplace_back((size_t)L.units[u].numel);
        be->copy_to_host(out.grads.back().data(), store.shard_state((int)u).grad.data, L.units[u].numel * 4);
      }
  }
  for (size_t u = 0; u < L.units.size(); u++) {
    out.params.emplace_back((size_t)L.units[u].numel);
    store.get_unit((int)u, out.params.back().data());
  }
  return out;
}

// Losses within the loss bound; weights element by element within what Adam makes of gradients
// that agree to the reorder bound (tests/tolerances.h), for the precision compared.
void expect_same(const Outcome& got, const Outcome& want, const std::string& what, Precision prec) {
  const bool f32 = prec.compute == DType::f32 && prec.reduce == DType::f32;
  const double loss_tol = f32 ? tol::kF32Loss : tol::kBf16ReorderLoss;
  const double grad_tol = f32 ? tol::kF32ReorderGrad : tol::kBf16ReorderGrad;
  const bool margins = std::getenv("LLMT_TEST_MARGINS") && g_world->rank() == 0;
  for (int i = 0; i < kSteps; i++) {
    EXPECT_NEAR(got.losses[i], want.losses[i], loss_tol * std::fabs(want.losses[i])) << what << " step " << i + 1;
    if (margins)
      std::printf("margin %s loss %d %.3g of %.3g\n", what.c_str(), i, std::fabs(got.losses[i] / want.losses[i] - 1),
                  loss_tol);
  }
  for (size_t u = 0; u < want.params.size(); u++) {
    double ratio = 0.0;
    EXPECT_EQ(tol::check_adam_params(got.params[u].data(), want.params[u].data(), want.grads[u].data(),
                                     (int64_t)want.params[u].size(), grad_tol, kLr, kSteps, tol::kUnitF32, &ratio),
              "")
        << what << " unit " << u;
    if (margins) std::printf("margin %s unit %zu %.3g\n", what.c_str(), u, ratio);
  }
}

void check_family(Arch arch, Precision prec = {}, float dropout = 0.0f, bool llama3_rope = false,
                  bool biases = false, bool qwen3 = false, bool gemma = false) {
  ModelConfig cfg = tiny_model(arch);
  if (qwen3) cfg.family.qk_norm = true, cfg.head_dim = 8;  // q/k norms, head_dim 8 beside hidden 18 / 3 heads
  if (gemma) {  // Gemma 3's switches: GeGLU, (1 + w) and sandwich norms, scaled embeddings, q/k norms, and
                // layer 0 sliding (window 5 < T) with its own RoPE base
    cfg.family.mlp = MlpKind::geglu;
    cfg.family.norm_offset = 1.0f;
    cfg.family.sandwich_norms = cfg.family.scaled_embeddings = cfg.family.qk_norm = true;
    cfg.head_dim = 8;
    cfg.sliding_window = 5;
    cfg.layer_window = {5, 0};
    cfg.rope_local_theta = 10000.0f;
    cfg.rope_theta = 1000000.0f;
  }
  if (biases) cfg.qkv_bias = cfg.o_bias = cfg.mlp_bias = true;  // attention_bias + mlp_bias (Qwen2: qkv only)
  if (llama3_rope) {  // Llama 3.1's rope scaling, its bands inside the 16-token context
    cfg.rope_theta = 500000.0f;
    cfg.rope_scaling = "llama3";
    cfg.rope_factor = 8.0f;
    cfg.rope_low_freq_factor = 1.0f;
    cfg.rope_high_freq_factor = 4.0f;
    cfg.rope_original_max = 8;
  }
  cfg.attn_pdrop = dropout;
  if (arch == Arch::gpt2) cfg.embd_pdrop = cfg.resid_pdrop = dropout;
  const int W = g_world->size(), r = g_world->rank();
  // reference: this rank alone, the whole global batch in one micro-batch, unsharded, in the same
  // compute precision (a single process reduces nothing)
  std::unique_ptr<ControlComm> self = g_world->split(r, 0);
  Outcome ref = train(cfg, *self, Strategy::no_shard, 1, kGlobal, 1, false, {prec.compute, DType::f32}, nullptr,
                      nullptr, "cpu");
  ASSERT_LT(ref.losses.back(), ref.losses.front()) << "the reference run learns";
  const std::string family = g_device + " " + std::string(arch == Arch::gpt2 ? "gpt2 " : llama3_rope ? "llama3 " : biases ? "llama biases " : qwen3 ? "qwen3 " : gemma ? "gemma3 " : "llama ") + prec.name() +
                             (dropout > 0.0f ? " dropout " : " ");

  for (Strategy s : {Strategy::full_shard, Strategy::shard_grad_op, Strategy::no_shard, Strategy::hybrid_shard}) {
    // hybrid: shard over pairs of ranks where the world has pairs, so both groups are > 1 at 4 ranks
    int local = s == Strategy::hybrid_shard && W % 2 == 0 ? 2 : g_local_size;
    for (int accum : {1, 2}) {
      if (kGlobal % (W * accum)) continue;
      int B = kGlobal / (W * accum);
      std::string what = family + strategy_name(s) + " W=" + std::to_string(W) + " B=" + std::to_string(B) +
                         " accum=" + std::to_string(accum);
      expect_same(train(cfg, *g_world, s, local, B, accum, false, prec), ref, what, prec);
    }
  }
  // gradient checkpointing changes nothing but memory (its recomputed forward draws the same masks)
  int B = kGlobal / W;
  expect_same(train(cfg, *g_world, Strategy::full_shard, g_local_size, B, 1, true, prec), ref,
              family + "gradient checkpointing, full_shard", prec);
}

// A family's transformers fixture (tests/reference/README.md) trained sharded as `llmt train` does:
// its two sequences one a rank at 2 ranks, as two micro-batches at 1, full_shard, the Trainer's
// AdamW (lr 1e-2, weight decay 0.1 but for biases and norms, no clipping): the loss before each of
// the 3 steps and every weight after them as transformers gives them, in fp32 and in bf16 against
// autocast (limits: tests/models/hf_fixture.h, as the single-process comparison's).
void check_fixture_sharded(const std::string& name, DType compute) {
  namespace lt = llmt_test;
  const std::string dir = lt::reference_dir() + "/" + name;
  const ModelConfig cfg = config_from_json_file(dir + "/config.json");
  SafetensorsFile ref32(dir + "/reference.safetensors");
  SafetensorsFile ref(dir + (compute == DType::f32 ? "/reference.safetensors" : "/reference_bf16.safetensors"));
  const lt::HfBatch batch = lt::read_hf_batch(ref32);
  const lt::Limits lim = lt::limits_for(compute);
  const int W = g_world->size(), r = g_world->rank(), accum = batch.B / W;
  const std::string tag = name + (compute == DType::f32 ? " f32" : " bf16") + " W=" + std::to_string(W);
  ASSERT_EQ(batch.B, 2) << tag;

  std::unique_ptr<Backend> be = make_cpu_backend(1, compute);
  Transformer model(cfg, *be, 1, batch.T);
  const ModelLayout& L = model.layout();
  std::unique_ptr<DataComm> data = make_test_data_comm(*g_world, *be);
  FsdpStore store(*be, L, Strategy::full_shard, *data, g_local_size);
  SafetensorsCheckpoint ckpt(dir);
  std::vector<float> host;
  for (size_t u = 0; u < L.units.size(); u++) {
    host.resize((size_t)L.units[u].numel);
    load_hf_unit(ckpt, cfg, L, (int)u, host.data());
    store.set_unit((int)u, host.data());
  }
  const std::vector<float> losses = lt::read_all(ref, "losses");
  ASSERT_GE(losses.size(), (size_t)lt::kFixtureSteps) << tag;
  StepScalars scalars(*be);
  for (int step = 0; step < lt::kFixtureSteps; step++) {
    std::vector<MicroBatch> micro;
    for (int m = 0; m < accum; m++) {
      const int64_t seq = (int64_t)m * W + r;
      micro.push_back({batch.ids.data() + seq * batch.T, batch.targets.data() + seq * batch.T, batch.T, seq});
    }
    StepSettings ss;
    ss.lr = lt::kFixtureLr;
    ss.adamw.weight_decay = lt::kFixtureWeightDecay;
    ss.max_grad_norm = 0.0;
    ss.step = step;
    const StepResult res = train_step(model, store, *g_world, *data, scalars, micro, ss);
    EXPECT_NEAR(res.loss, losses[(size_t)step], lim.loss * std::fabs(losses[(size_t)step])) << tag << " loss before step "
                                                                                             << step + 1;
  }
  for (size_t u = 0; u < L.units.size(); u++) {
    host.resize((size_t)L.units[u].numel);
    store.get_unit((int)u, host.data());
    for (const ParamSpec& p : L.units[u].params) {
      const std::vector<float> w = lt::hf_view(host.data(), p), want = lt::read_all(ref, "step3." + p.hf_name),
                               g0 = lt::read_all(ref, "grad." + p.hf_name);
      ASSERT_EQ(w.size(), want.size()) << tag << " " << p.hf_name;
      EXPECT_EQ(tol::check_adam_params(w.data(), want.data(), g0.data(), p.numel(), lim.grad, lt::kFixtureLr,
                                       lt::kFixtureSteps, lim.unit),
                "")
          << tag << " after " << lt::kFixtureSteps << " steps: " << p.hf_name;
    }
  }
}

}  // namespace

TEST(FsdpEquivalence, Gpt2AllStrategies) { check_family(Arch::gpt2); }
TEST(FsdpEquivalence, LlamaGqaAllStrategies) { check_family(Arch::llama); }
TEST(FsdpEquivalence, Llama3RopeScalingAllStrategies) { check_family(Arch::llama, {}, 0.0f, true); }
TEST(FsdpEquivalence, LlamaBiasesAllStrategies) { check_family(Arch::llama, {}, 0.0f, false, true); }
TEST(FsdpEquivalence, Qwen3QkNormHeadDimAllStrategies) { check_family(Arch::llama, {}, 0.0f, false, false, true); }
TEST(FsdpEquivalence, Gemma3SwitchesAllStrategies) { check_family(Arch::llama, {}, 0.0f, false, false, false, true); }
TEST(FsdpEquivalence, Gpt2AllStrategiesBf16) { check_family(Arch::gpt2, {DType::bf16, DType::f32}); }
TEST(FsdpEquivalence, LlamaGqaAllStrategiesBf16) { check_family(Arch::llama, {DType::bf16, DType::f32}); }
TEST(FsdpEquivalence, Gpt2AllStrategiesBf16Reduce) { check_family(Arch::gpt2, {DType::bf16, DType::bf16}); }
TEST(FsdpEquivalence, LlamaGqaAllStrategiesBf16Reduce) { check_family(Arch::llama, {DType::bf16, DType::bf16}); }
TEST(FsdpEquivalence, Gpt2AllStrategiesDropout) { check_family(Arch::gpt2, {}, 0.1f); }
TEST(FsdpEquivalence, LlamaGqaAllStrategiesDropout) { check_family(Arch::llama, {}, 0.1f); }
TEST(FsdpEquivalence, Gpt2Bf16Dropout) { check_family(Arch::gpt2, {DType::bf16, DType::f32}, 0.1f); }

// Bytes each rank sends in the first step (the store's collectives and the step's loss and norm)
// against llmt plan's prediction, for every strategy in both compute and reduce precisions: bf16
// gathers move half the bytes. The gathered buffers' measured peak stays within the plan's bound.
// Every family llmt reads, sharded, against transformers (the fixture's batch is two sequences: 1 or
// 2 ranks; the single-process comparison with more detail is tests/models/test_hf_reference.cpp).
TEST(FsdpEquivalence, TransformersFixturesSharded) {
  if (g_world->size() > 2) GTEST_SKIP() << "the fixtures' batch holds two sequences: 1 or 2 ranks";
  if (g_device != "cpu") GTEST_SKIP() << "CPU only: the emulated CUDA backend's fixtures run in HfReferenceCuda";
  for (const char* name : {"gpt2_tiny", "llama_tiny", "llama_tied_tiny", "llama31_tiny", "llama_bias_tiny",
                           "mistral_tiny", "qwen2_tiny", "qwen2_window_tiny", "qwen3_tiny", "phi3_tiny",
                           "phi3_longrope_tiny", "gemma3_tiny", "gemma2_tiny"})
    for (DType compute : {DType::f32, DType::bf16}) check_fixture_sharded(name, compute);
}

TEST(FsdpEquivalence, CommBytesEqualThePlan) {
  ModelConfig cfg = tiny_model(Arch::gpt2);
  const int W = g_world->size();
  for (Strategy s : {Strategy::full_shard, Strategy::shard_grad_op, Strategy::no_shard, Strategy::hybrid_shard})
    for (Precision prec : {Precision{DType::f32, DType::f32}, Precision{DType::bf16, DType::f32},
                           Precision{DType::bf16, DType::bf16}})
      for (int accum : {1, 2}) {
        if (kGlobal % (W * accum)) continue;
        int local = s == Strategy::hybrid_shard && W % 2 == 0 ? 2 : g_local_size;
        int B = kGlobal / (W * accum);
        double measured = 0.0, peak = 0.0;
        train(cfg, *g_world, s, local, B, accum, false, prec, &measured, &peak);
        PlanArgs pa;
        pa.world = W;
        pa.ranks_per_node = s == Strategy::hybrid_shard ? local : W;
        pa.fsdp = strategy_name(s);
        pa.batch = B;
        pa.seq_len = kT;
        pa.accum = accum;
        pa.bf16 = prec.compute == DType::bf16;
        pa.reduce_dtype = prec.reduce;
        nlohmann::json plan = make_plan(cfg, pa);
        double planned = plan["comm_total_bytes"].get<double>();
        EXPECT_NEAR(measured, planned, 1e-9 * planned + 1e-6)
            << strategy_name(s) << " " << prec.name() << " W=" << W << " accum=" << accum;
        double peak_bound = plan["gathered_peak_gib"].get<double>() * 1024.0 * 1024.0 * 1024.0;
        EXPECT_LE(peak, peak_bound * (1 + 1e-9)) << "gathered peak, " << strategy_name(s) << " " << prec.name();
        if (std::getenv("LLMT_TEST_MARGINS") && g_world->rank() == 0)
          std::printf("peak %s %s accum %d: %.0f of %.0f\n", strategy_name(s), prec.name().c_str(), accum, peak,
                      peak_bound);
      }
}

TEST(FsdpEquivalence, CollectivesMoveWhatTheyShould) {
  std::unique_ptr<DataComm> data = make_mpi_data_comm(*g_world);
  DataComm& c = *data;
  const int W = c.size(), r = c.rank();
  std::vector<float> send(5), all(5 * W), sum(5);
  for (int i = 0; i < 5; i++) send[i] = (float)(r * 10 + i);
  c.all_gather(send.data(), all.data(), 5, DType::f32);
  for (int q = 0; q < W; q++)
    for (int i = 0; i < 5; i++) EXPECT_EQ(all[q * 5 + i], (float)(q * 10 + i));
  std::vector<float> big(5 * W);
  for (int i = 0; i < 5 * W; i++) big[i] = (float)(i + r);
  c.reduce_scatter(big.data(), sum.data(), 5, DType::f32, ReduceOp::avg);
  for (int i = 0; i < 5; i++) EXPECT_FLOAT_EQ(sum[i], (float)(r * 5 + i) + (W - 1) / 2.0f);
  std::vector<uint16_t> h(3);  // bf16 sums: 1.5 * (r + 1) summed over ranks, exact in bf16 for W <= 4
  for (int i = 0; i < 3; i++) h[i] = f32_to_bf16(1.5f * (r + 1) * (i + 1));
  c.all_reduce(h.data(), 3, DType::bf16, ReduceOp::sum);
  for (int i = 0; i < 3; i++) EXPECT_EQ(bf16_to_f32(h[i]), 1.5f * W * (W + 1) / 2 * (i + 1));
  double x = 0.25 * (r + 1);
  c.all_reduce(&x, 1, DType::f64, ReduceOp::sum);
  EXPECT_DOUBLE_EQ(x, 0.25 * W * (W + 1) / 2);
  EXPECT_DOUBLE_EQ(g_world->all_reduce_sum(1.5), 1.5 * W);
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<ControlComm> world;
  LaunchInfo info = init_launch(&argc, &argv, &world);
  g_world = world.get();
  g_local_size = info.local_size;
  if (const char* d = std::getenv("LLMT_TEST_DEVICE")) g_device = d;
  int rc = RUN_ALL_TESTS();
  // a failure on any rank fails the run on every rank
  double failed = world->all_reduce_sum(rc != 0 ? 1.0 : 0.0);
  world.reset();
  finalize_launch();
  return failed > 0 ? 1 : 0;
}
