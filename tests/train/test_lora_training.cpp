// LoRA training end to end against PEFT (tests/reference/lora, make_lora_fixtures.py): the base model
// in a frozen FsdpStore, the adapter (models/lora.h's LoraAdapters on the model's ProjectionAdapters
// hook) in a trainable one, train_step as the trainer runs it. From PEFT's adapter_init, step 1's
// logits, step 1's adapter gradients, the loss before each of 5 AdamW steps and the final adapter
// must be PEFT's within the fp32 rows of tests/tolerances.h, for every fixture case. The fixtures'
// step is llmt's: two micro-batches of one sequence each (B = 1, accumulation 2), the loss summed
// over both and divided by the step's target tokens, lr 1e-2, no weight decay and no clipping
// (max_grad_norm 0: PEFT's loop calls no clip_grad_norm_). Also: a frozen store holds no gradient,
// moments or master under bf16, and a frozen base's backward gives the adapter the same gradients
// with fewer ops than a trainable base's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/fsdp/fsdp.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "models/hf_checkpoint.h"
#include "models/lora.h"
#include "models/transformer.h"
#include "tests/test_util.h"
#include "tests/tolerances.h"
#include "train/step.h"

using namespace llmt;
using llmt_test::rel_error;
using llmt_test::to_host;
namespace tol = llmt_test::tol;

namespace {

class SoloControl : public ControlComm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void barrier() override {}
  double all_reduce_sum(double x) override { return x; }
  void all_gather(const void* send, void* recv, int64_t count, DType t) override {
    std::memmove(recv, send, (size_t)count * dtype_size(t));
  }
  void broadcast(void*, int64_t, DType, int) override {}
  std::unique_ptr<ControlComm> split(int, int) override { return std::make_unique<SoloControl>(); }
  void* native_handle() override { return nullptr; }
};

std::vector<float> read_f32(const SafetensorsFile& f, const std::string& name) {
  const StTensor* t = f.find(name);
  EXPECT_TRUE(t) << name << " missing from the fixture";
  if (!t) return {};
  std::vector<float> v((size_t)t->numel());
  f.read_f32(*t, v.data());
  return v;
}

const char* const kCases[][2] = {{"gpt2_c_attn_c_proj", "gpt2_tiny"},
                                 {"llama_q_v", "llama_tiny"},
                                 {"llama_all_linear_rslora", "llama_tiny"},
                                 {"qwen2_all_linear_lm_head", "qwen2_tiny"},
                                 {"llama_q_v_embed_tokens", "llama_tiny"},
                                 {"llama_tied_q_v_embed_tokens", "llama_tied_tiny"}};
const int kSteps = 5;
const float kLr = 1e-2f;

// One case's run: base frozen, adapter from PEFT's adapter_init, both stores of one rank.
struct LoraRun {
  std::string dir, base_dir;
  ModelConfig cfg;
  LoraConfig lora;
  LoraLayout AL;
  std::unique_ptr<Backend> be;
  std::unique_ptr<DataComm> solo = make_solo_data_comm();
  std::unique_ptr<Transformer> model;
  std::unique_ptr<FsdpStore> base, adapter;
  std::unique_ptr<LoraAdapters> hook;

  // adapter: which of the case's adapters to start from
  // device: "cpu", or "cuda" (the SIMT emulator in ctest); compute: the backend's compute dtype
  LoraRun(const std::string& name, const std::string& base_name, int T, bool frozen = true,
          const std::string& adapter_dir = "adapter_init", bool checkpointing = false,
          const std::string& device = "cpu", DType compute = DType::f32) {
    dir = llmt_test::reference_dir() + "/lora/" + name;
    base_dir = llmt_test::reference_dir() + "/" + base_name;
    cfg = config_from_json_file(base_dir + "/config.json");
    lora = read_adapter_config(dir + "/" + adapter_dir + "/adapter_config.json");
    AL = make_lora_layout(cfg, lora);
    be = device == "cpu" ? make_cpu_backend(2, compute) : make_cuda_backend(0, compute, false);
    model = std::make_unique<Transformer>(cfg, *be, 1, T, checkpointing);
    const ModelLayout& L = model->layout();
    base = std::make_unique<FsdpStore>(*be, L, Strategy::no_shard, *solo, 1, DType::f32, frozen);
    SafetensorsCheckpoint ckpt(base_dir);
    for (size_t u = 0; u < L.units.size(); u++) {
      std::vector<float> host((size_t)L.units[u].numel);
      load_hf_unit(ckpt, cfg, L, (int)u, host.data());
      base->set_unit((int)u, host.data());
    }
    adapter = std::make_unique<FsdpStore>(*be, AL, Strategy::no_shard, *solo, 1);
    SafetensorsFile init(dir + "/" + adapter_dir + "/adapter_model.safetensors");
    check_adapter_tensors(init, AL);
    for (size_t u = 0; u < AL.units.size(); u++) {
      std::vector<float> host((size_t)AL.units[u].numel);
      load_adapter_unit(init, AL, (int)u, host.data());
      adapter->set_unit((int)u, host.data());
    }
    hook = std::make_unique<LoraAdapters>(cfg, lora, AL, *be, *adapter, 1, T);
    model->set_adapters(hook.get());
  }
};


// Step 1's logits, step 1's adapter gradients, 5 losses and the final adapter against PEFT's, in fp32;
// in bf16 (the base's bf16 copy, the adapter's fp32 master) against PEFT under torch.autocast(bfloat16)
// within the bf16 model rows, and no further from PEFT's fp32 run than autocast is (the final adapter
// is not compared in bf16: Adam's first steps move each weight by about lr whatever the gradient's
// size, so a gradient a few bf16 roundings away can flip a small weight's step).
void check_case(const char* const c[2], const std::string& device, DType compute) {
  const bool margins = std::getenv("LLMT_TEST_MARGINS") != nullptr;
  const bool bf16 = compute == DType::bf16;
  const std::string tag = std::string(c[0]) + " " + device + (bf16 ? " bf16" : "");
  SCOPED_TRACE(tag);
  SafetensorsFile ref32(llmt_test::reference_dir() + "/lora/" + c[0] + "/reference.safetensors");
  SafetensorsFile ref(llmt_test::reference_dir() + "/lora/" + c[0] +
                      (bf16 ? "/reference_bf16.safetensors" : "/reference.safetensors"));
  const double tol_logits = bf16 ? tol::kBf16ModelLogits : tol::kF32Logits;
  const double tol_loss = bf16 ? tol::kBf16ModelLoss : tol::kF32Loss;
  const double tol_grad = bf16 ? tol::kBf16ModelGrad : tol::kF32Grad;
  // bf16: llmt's distance from PEFT's fp32 run at most kBf16VsAutocast times autocast's own, plus a rounding
  auto no_worse_than_autocast = [&](const std::string& key, const std::vector<float>& ours) {
    if (!bf16) return;
    const std::vector<float> exact = read_f32(ref32, key), theirs = read_f32(ref, key);
    const double e_ours = rel_error(ours.data(), exact.data(), (int64_t)exact.size());
    const double e_theirs = rel_error(theirs.data(), exact.data(), (int64_t)exact.size());
    EXPECT_LT(e_ours, tol::kBf16VsAutocast * e_theirs + tol::kUnitBf16)
        << key << ": llmt bf16 is " << e_ours << " from fp32, autocast " << e_theirs;
    if (margins) std::printf("margin %s vs-autocast %s %.3g (autocast %.3g)\n", tag.c_str(), key.c_str(), e_ours,
                             e_theirs);
  };
  const StTensor* ids_t = ref32.find("input_ids");
  ASSERT_TRUE(ids_t);
  const int B = (int)ids_t->shape[0], T = (int)ids_t->shape[1];
  std::vector<int32_t> ids((size_t)B * T), labels(ids.size()), targets(ids.size(), kIgnoreIndex);
  std::memcpy(ids.data(), ref32.data(*ids_t), ids.size() * 4);
  std::memcpy(labels.data(), ref32.data(*ref32.find("labels")), labels.size() * 4);
  for (int b = 0; b < B; b++)  // transformers' shift: position t predicts labels[t + 1]
    for (int t = 0; t + 1 < T; t++) targets[(size_t)(b * T + t)] = labels[(size_t)(b * T + t + 1)];
  LoraRun run(c[0], c[1], T, true, "adapter_init", false, device, compute);
  Backend& be = *run.be;
  const int64_t V = run.cfg.vocab_size, stride = run.model->logits_stride();

  // step 1's logits, each sequence as its own micro-batch (PEFT's train-mode forward; dropout 0)
  std::vector<float> want_logits = read_f32(ref, "logits"), logits;
  for (int b = 0; b < B; b++) {
    run.model->forward(*run.base, ids.data() + (size_t)b * T, nullptr, 0, Tensor());
    std::vector<float> padded = to_host(be, run.model->logits());
    for (int t = 0; t < T; t++)
      logits.insert(logits.end(), padded.begin() + t * stride, padded.begin() + t * stride + V);
  }
  const double e_logits = rel_error(logits.data(), want_logits.data(), (int64_t)want_logits.size());
  EXPECT_LT(e_logits, tol_logits);
  if (margins) std::printf("margin %s logits %.3g of %.3g\n", tag.c_str(), e_logits, tol_logits);
  no_worse_than_autocast("logits", logits);

  SoloControl control;
  StepScalars scalars(be);
  StepSettings s;
  s.lr = kLr;
  s.max_grad_norm = 0.0;  // PEFT's loop does not clip
  std::vector<MicroBatch> micro;
  for (int b = 0; b < B; b++) micro.push_back({ids.data() + (size_t)b * T, targets.data() + (size_t)b * T, T, b});
  const std::vector<float> want_losses = read_f32(ref, "losses");
  std::vector<std::vector<float>> grad0(run.AL.units.size());
  for (int step = 0; step < kSteps; step++) {
    s.step = step;
    StepResult r = train_step(*run.model, *run.base, control, *run.solo, scalars, micro, s, run.adapter.get());
    const double e = std::fabs(r.loss / want_losses[(size_t)step] - 1.0);
    EXPECT_LT(e, tol_loss) << "loss before step " << step + 1 << ": " << r.loss << ", PEFT "
                           << want_losses[(size_t)step];
    if (margins) std::printf("margin %s loss %d %.3g of %.3g\n", tag.c_str(), step + 1, e, tol_loss);
    if (step > 0) continue;
    int checked = 0;  // step 1's gradients, before AdamW used them (one rank: the shard is the unit)
    for (size_t u = 0; u < run.AL.units.size(); u++) {
      if (run.AL.units[u].numel == 0) continue;
      grad0[u] = to_host(be, run.adapter->shard_state((int)u).grad);
      for (const ParamSpec& p : run.AL.units[u].params) {
        std::vector<float> want = read_f32(ref, "grad." + p.hf_name);
        ASSERT_EQ((int64_t)want.size(), p.numel()) << p.hf_name;
        const double eg = rel_error(grad0[u].data() + p.offset, want.data(), p.numel());
        EXPECT_LT(eg, tol_grad) << "gradient of " << p.hf_name;
        if (margins) std::printf("margin %s grad %s %.3g of %.3g\n", tag.c_str(), p.hf_name.c_str(), eg, tol_grad);
        no_worse_than_autocast("grad." + p.hf_name,
                               std::vector<float>(grad0[u].begin() + p.offset, grad0[u].begin() + p.offset + p.numel()));
        checked++;
      }
    }
    // every adapter gradient PEFT recorded was compared (the fixture: ids, labels, logits,
    // logits_final, losses and one gradient a trainable tensor; the bf16 one: logits, losses, gradients)
    EXPECT_EQ((size_t)checked + (bf16 ? 2 : 5), ref.tensors().size());
  }
  if (bf16) return;

  // the final adapter, element by element within Adam's bound
  SafetensorsFile fin(llmt_test::reference_dir() + "/lora/" + c[0] + "/adapter_final/adapter_model.safetensors");
  for (size_t u = 0; u < run.AL.units.size(); u++) {
    const int64_t n = run.AL.units[u].numel;
    if (n == 0) continue;
    std::vector<float> got((size_t)n), want((size_t)n);
    run.adapter->get_unit((int)u, got.data());
    load_adapter_unit(fin, run.AL, (int)u, want.data());
    double worst = 0.0;
    EXPECT_EQ(tol::check_adam_params(got.data(), want.data(), grad0[u].data(), n, tol::kF32Grad, kLr, kSteps,
                                     tol::kUnitF32, &worst),
              "")
        << "adapter unit " << u;
    if (margins)
      std::printf("margin %s final unit %zu %.3g of its bound (rel %.3g)\n", tag.c_str(), u, worst,
                  rel_error(got.data(), want.data(), n));
  }
}

}  // namespace

TEST(LoraTraining, FiveStepsEqualPeft) {
  for (const auto& c : kCases) check_case(c, "cpu", DType::f32);
}
TEST(LoraTraining, FiveStepsBf16EqualPeftAutocast) {
  for (const auto& c : kCases) check_case(c, "cpu", DType::bf16);
}
// The CUDA backend's kernels (the SIMT emulator in ctest) under the same adapters: no op was added
// for LoRA, so this is the existing matmul (strided output columns) and elementwise kernels at
// LoRA's shapes. GPT-2 (Conv1D, the split GELU matmuls) and Qwen2 (all-linear, an lm_head copy): the
// emulator's minute is spent where the CPU cases add nothing new.
TEST(LoraTrainingCuda, FiveStepsEqualPeft) {
  for (int i : {0, 3}) check_case(kCases[i], "cuda", DType::f32);
}
TEST(LoraTrainingCuda, FiveStepsBf16EqualPeftAutocast) {
  for (int i : {0, 3}) check_case(kCases[i], "cuda", DType::bf16);
}

// A frozen store keeps the compute copy only: no gradient or moments (nor, under bf16, an f32
// master), grads() empty, and optimizer steps leave it as it was; it reads back what was set.
TEST(LoraTraining, FrozenStoreHoldsParametersOnly) {
  ModelConfig cfg = config_from_json_file(llmt_test::reference_dir() + "/llama_tiny/config.json");
  ModelLayout L = make_layout(cfg);
  std::unique_ptr<DataComm> solo = make_solo_data_comm();
  for (DType dt : {DType::f32, DType::bf16}) {
    auto be = make_cpu_backend(2, dt);
    FsdpStore frozen(*be, L, Strategy::no_shard, *solo, 1, DType::f32, true);
    FsdpStore trained(*be, L, Strategy::no_shard, *solo, 1);
    int64_t numel = 0;
    for (auto& u : L.units) numel += u.numel;
    EXPECT_EQ(frozen.persistent_bytes(), numel * (int64_t)dtype_size(dt));
    EXPECT_EQ(trained.persistent_bytes(), numel * 16 + (dt == DType::bf16 ? numel * 2 : 0));
    std::vector<float> host((size_t)L.units[1].numel), back(host.size());
    for (size_t i = 0; i < host.size(); i++) host[i] = 0.25f * (float)(i % 13);  // exact in bf16
    frozen.set_unit(1, host.data());
    EXPECT_EQ(frozen.grads(1).data, nullptr);
    frozen.zero_grads();
    frozen.optimizer_step(1.0f, AdamWConfig(), 1.0f);
    BackendBuffer sq(*be, DType::f64, {1});
    frozen.grad_sq_sum(sq.tensor());
    double s = -1;
    be->copy_to_host(&s, sq.tensor().data, sizeof(s));
    EXPECT_EQ(s, 0.0);
    frozen.get_unit(1, back.data());
    EXPECT_EQ(back, host);
    EXPECT_EQ(frozen.shard_state(1).grad.data, nullptr);
  }
}

// The adapter's gradients do not depend on whether the base is frozen (the input-gradient products
// are the same ops either way), and the frozen backward runs fewer ops (no dW, bias or embedding
// gradients).
// One training forward and backward of a fixed 13-token sequence: each block's adapter gradients,
// and in *ops the backend ops the backward issued.
std::vector<std::vector<float>> one_pass_adapter_grads(LoraRun& run, int64_t* ops = nullptr) {
  const int T = 13;
  std::vector<int32_t> ids((size_t)T), targets((size_t)T, kIgnoreIndex);
  for (int t = 0; t < T; t++) ids[(size_t)t] = (t * 37 + 5) % run.cfg.vocab_size;
  for (int t = 0; t + 1 < T; t++) targets[(size_t)t] = ids[(size_t)t + 1];
  BackendBuffer loss(*run.be, DType::f64, {1});
  TrainPass pass;
  pass.grad_scale = 1.0f / (T - 1);
  run.adapter->zero_grads();
  run.model->forward(*run.base, ids.data(), targets.data(), 0, loss.tensor(), &pass);
  const int64_t before = run.be->counters().ops;
  run.model->backward(*run.base);
  if (ops) *ops = run.be->counters().ops - before;
  std::vector<std::vector<float>> grads;
  for (size_t u = 1; u < run.AL.units.size(); u++)
    grads.push_back(to_host(*run.be, run.adapter->shard_state((int)u).grad));
  return grads;
}

TEST(LoraTraining, FrozenBaseGivesTheSameAdapterGradients) {
  const auto& c = kCases[0];  // GPT-2: biases, the split matmul_dgelu, tied embeddings
  std::vector<std::vector<float>> grads[2];
  int64_t ops[2] = {0, 0};
  for (int frozen = 0; frozen < 2; frozen++) {
    LoraRun run(c[0], c[1], 13, frozen == 1, "adapter_final");  // B nonzero: A has gradients too
    grads[frozen] = one_pass_adapter_grads(run, &ops[frozen]);
  }
  double norm = 0.0;
  for (float g : grads[1][0]) norm += (double)g * g;
  EXPECT_GT(norm, 0.0);
  EXPECT_EQ(grads[0], grads[1]);
  EXPECT_LT(ops[1], ops[0]);
}

// Gradient checkpointing recomputes each block's forward, the adapters' h with it: the adapter's
// gradients are those of the run that kept its activations, bit for bit.
TEST(LoraTraining, CheckpointingGivesTheSameAdapterGradients) {
  for (const auto& c : {kCases[0], kCases[2]}) {  // GPT-2 (the split GELU), LLaMA all-linear
    SCOPED_TRACE(c[0]);
    std::vector<std::vector<float>> grads[2];
    for (int ckpt = 0; ckpt < 2; ckpt++) {
      LoraRun run(c[0], c[1], 13, true, "adapter_final", ckpt == 1);
      grads[ckpt] = one_pass_adapter_grads(run);
    }
    EXPECT_EQ(grads[0], grads[1]);
  }
}

// --packing under LoRA: two sequences packed in one row (positions restarting, attention kept inside
// each) give the adapter the gradients and the loss of the same sequences as two micro-batches, to
// the reordering of sums (the adapter's products run over one 26-row matrix instead of two of 13).
TEST(LoraTraining, PackedSequencesGiveTheUnpackedAdapterGradients) {
  for (const auto& c : {kCases[2], kCases[3]}) {  // LLaMA all-linear + rsLoRA, Qwen2 with an lm_head copy
    SCOPED_TRACE(c[0]);
    const int L = 13, T = 2 * L;
    std::vector<int32_t> ids((size_t)T), targets((size_t)T, kIgnoreIndex), doc_start((size_t)T);
    for (int t = 0; t < T; t++) ids[(size_t)t] = (t * 37 + 5) % 259;
    for (int t = 0; t < T; t++) {
      doc_start[(size_t)t] = t < L ? 0 : L;
      if ((t + 1) % L) targets[(size_t)t] = ids[(size_t)t + 1];  // each sequence's last token predicts nothing
    }
    std::vector<float> grads[2];
    double losses[2] = {0.0, 0.0};
    for (int packed = 0; packed < 2; packed++) {
      LoraRun run(c[0], c[1], T, true, "adapter_final");  // B nonzero: A has gradients too
      SoloControl control;
      StepScalars scalars(*run.be);
      StepSettings s;
      s.lr = 0.0f;  // the step's gradients are what is compared
      s.max_grad_norm = 0.0;
      std::vector<MicroBatch> micro;
      if (packed) micro.push_back({ids.data(), targets.data(), T, 0, doc_start.data()});
      else micro = {{ids.data(), targets.data(), L, 0}, {ids.data() + L, targets.data() + L, L, 1}};
      losses[packed] = train_step(*run.model, *run.base, control, *run.solo, scalars, micro, s, run.adapter.get()).loss;
      for (size_t u = 0; u < run.AL.units.size(); u++)
        if (run.AL.units[u].numel) {
          std::vector<float> g = to_host(*run.be, run.adapter->shard_state((int)u).grad);
          grads[packed].insert(grads[packed].end(), g.begin(), g.end());
        }
    }
    EXPECT_NEAR(losses[1], losses[0], tol::kF32Loss * losses[0]);
    EXPECT_LT(rel_error(grads[1].data(), grads[0].data(), (int64_t)grads[0].size()), tol::kF32ReorderGrad);
    double norm = 0.0;
    for (float g : grads[0]) norm += (double)g * g;
    EXPECT_GT(norm, 0.0);
  }
}
