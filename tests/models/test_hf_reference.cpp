// GPT-2 and LLaMA against Hugging Face transformers: logits, loss, every gradient and the
// parameters after 3 AdamW steps, from fixtures made by tests/reference/make_fixtures.py; in fp32
// against transformers in fp32, and with --bf16's policy against transformers under
// torch.autocast(bfloat16). The limits are tests/tolerances.h's.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/formats/safetensors.h"
#include "engine/fsdp/fsdp.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "models/hf_checkpoint.h"
#include "models/transformer.h"
#include "tests/models/hf_fixture.h"
#include "tests/test_util.h"
#include "tests/tolerances.h"

using namespace llmt;
using llmt_test::rel_error;
using llmt_test::to_host;

namespace {

namespace tol = llmt_test::tol;
const float kLr = llmt_test::kFixtureLr;
const int kSteps = llmt_test::kFixtureSteps;
using llmt_test::hf_view;
using llmt_test::Limits;
using llmt_test::limits_for;
using llmt_test::read_all;

// The model's logits as host floats, [rows, V]: the padding of each row (logits_stride) dropped.
std::vector<float> logits_to_host(Backend& be, const Transformer& model) {
  const std::vector<float> padded = to_host(be, model.logits());
  const int64_t V = model.config().vocab_size, stride = model.logits_stride(), rows = (int64_t)padded.size() / stride;
  std::vector<float> out((size_t)(rows * V));
  for (int64_t r = 0; r < rows; r++)
    std::copy(padded.begin() + r * stride, padded.begin() + r * stride + V, out.begin() + r * V);
  return out;
}

// In bf16, llmt's distance from the fp32 reference against transformers autocast's own distance
// from it: llmt's mixed precision must be about as accurate as PyTorch's (a different policy: our
// residual stream is bf16, autocast's fp32; our attention keeps scores and probabilities in fp32,
// autocast's eager attention rounds them to bf16).
void expect_no_worse_than_autocast(const SafetensorsFile& ref32, const SafetensorsFile& ref, const std::string& key,
                                   const std::vector<float>& ours, const std::string& tag) {
  if (&ref32 == &ref || tag.find("bf16") == std::string::npos) return;
  std::vector<float> exact = read_all(ref32, key), theirs = read_all(ref, key);
  double e_ours = rel_error(ours.data(), exact.data(), (int64_t)exact.size());
  double e_theirs = rel_error(theirs.data(), exact.data(), (int64_t)exact.size());
  double bound = tol::kBf16VsAutocast * e_theirs + tol::kUnitBf16;
  EXPECT_LT(e_ours, bound) << tag << " " << key << ": llmt bf16 is " << e_ours << " from fp32, autocast " << e_theirs;
  if (std::getenv("LLMT_TEST_MARGINS"))
    std::printf("margin %s vs-autocast %s %.3g (ours %.3g, autocast %.3g)\n", tag.c_str(), key.c_str(),
                e_ours / bound, e_ours, e_theirs);
}

// device: "cpu", or "cuda" (the SIMT emulator in ctest, the GPU in scripts/gpu_selftest.sh)
void check_model(const std::string& name, DType compute, const std::string& device = "cpu") {
  std::string dir = llmt_test::reference_dir() + "/" + name;
  ModelConfig cfg = config_from_json_file(dir + "/config.json");
  SafetensorsFile ref32(dir + "/reference.safetensors");
  SafetensorsFile ref(dir + (compute == DType::f32 ? "/reference.safetensors" : "/reference_bf16.safetensors"));
  const Limits lim = limits_for(compute);
  const bool margins = std::getenv("LLMT_TEST_MARGINS") != nullptr;
  const std::string tag = device + " " + name + (compute == DType::f32 ? " f32" : " bf16");
  const llmt_test::HfBatch batch = llmt_test::read_hf_batch(ref32);
  const std::vector<int32_t>&ids = batch.ids, &targets = batch.targets;
  const int B = batch.B, T = batch.T, n_valid = batch.n_valid;

  // one process, unsharded: the trainer's store with a shard group of one
  std::unique_ptr<Backend> be = device == "cpu" ? make_cpu_backend(2, compute) : make_cuda_backend(0, compute, false);
  Transformer model(cfg, *be, B, T);
  const ModelLayout& L = model.layout();
  std::unique_ptr<DataComm> solo = make_solo_data_comm();
  FsdpStore store(*be, L, Strategy::no_shard, *solo, 1);
  SafetensorsCheckpoint ckpt(dir);
  check_hf_tensors(ckpt, cfg, L, dir);
  for (size_t u = 0; u < L.units.size(); u++) {
    std::vector<float> host((size_t)L.units[u].numel);
    load_hf_unit(ckpt, cfg, L, (int)u, host.data());
    store.set_unit((int)u, host.data());
  }
  BackendBuffer loss(*be, DType::f64, {1});
  auto loss_mean = [&] {  // the loss sum so far over the counted tokens, then reset
    double s = 0.0;
    be->copy_to_host(&s, loss.tensor().data, sizeof(s));
    be->zero(loss.tensor().data, sizeof(s));
    return s / n_valid;
  };
  TrainPass pass;
  pass.grad_scale = 1.0f / n_valid;

  // forward: logits and loss
  model.forward(store, ids.data(), targets.data(), 0, loss.tensor());
  std::vector<float> ref_logits = read_all(ref, "logits"), logits = logits_to_host(*be, model);
  double err = rel_error(logits.data(), ref_logits.data(), (int64_t)logits.size());
  EXPECT_LT(err, lim.logits) << tag << " logits";
  if (margins) std::printf("margin %s logits %.3g of %.3g\n", tag.c_str(), err, lim.logits);
  expect_no_worse_than_autocast(ref32, ref, "logits", logits, tag);
  float ref_loss = read_all(ref, "loss")[0];
  double got_loss = loss_mean();
  EXPECT_NEAR(got_loss, ref_loss, lim.loss * std::fabs(ref_loss)) << tag << " loss";
  if (margins) std::printf("margin %s loss %.3g of %.3g\n", tag.c_str(), std::fabs(got_loss / ref_loss - 1), lim.loss);

  // backward: every parameter's gradient
  store.zero_grads();
  model.forward(store, ids.data(), targets.data(), 0, loss.tensor(), &pass);
  model.backward(store);
  loss_mean();
  int checked = 0;
  for (size_t u = 0; u < L.units.size(); u++) {
    // the whole unit: one shard
    const std::vector<float> grad = to_host(*be, store.shard_state((int)u).grad);
    for (const ParamSpec& p : L.units[u].params) {
      std::vector<float> g = hf_view(grad.data(), p), want = read_all(ref, "grad." + p.hf_name);
      ASSERT_EQ(g.size(), want.size()) << p.hf_name;
      double e = rel_error(g.data(), want.data(), p.numel());
      EXPECT_LT(e, lim.grad) << tag << " grad of " << p.hf_name;
      expect_no_worse_than_autocast(ref32, ref, "grad." + p.hf_name, g, tag);
      if (margins) std::printf("margin %s grad %s %.3g of %.3g\n", tag.c_str(), p.hf_name.c_str(), e, lim.grad);
      checked++;
    }
  }
  // the fixture holds logits, loss, losses, and grad. and step3. per parameter (input_ids and labels
  // only in the fp32 one)
  EXPECT_EQ((size_t)((compute == DType::f32 ? 5 : 3) + 2 * checked), ref.tensors().size())
      << "every fixture gradient compared";

  // 3 AdamW steps on the same batch, lr 1e-2, weight decay 0.1 except biases and norm weights
  std::vector<float> losses = read_all(ref, "losses");
  AdamWConfig oc;
  oc.weight_decay = llmt_test::kFixtureWeightDecay;
  for (int step = 0; step < kSteps; step++) {
    store.zero_grads();
    model.forward(store, ids.data(), targets.data(), 0, loss.tensor(), &pass);
    double l = loss_mean();
    EXPECT_NEAR(l, losses[step], lim.loss * std::fabs(losses[step])) << tag << " loss before step " << step;
    if (margins) std::printf("margin %s loss %.3g of %.3g\n", tag.c_str(), std::fabs(l / losses[step] - 1), lim.loss);
    model.backward(store);
    store.optimizer_step(kLr, oc, 1.0f);
  }
  for (size_t u = 0; u < L.units.size(); u++) {
    std::vector<float> unit((size_t)L.units[u].numel);
    store.get_unit((int)u, unit.data());
    for (const ParamSpec& p : L.units[u].params) {
      std::vector<float> w = hf_view(unit.data(), p), want = read_all(ref, "step3." + p.hf_name);
      std::vector<float> g0 = read_all(ref, "grad." + p.hf_name);
      double ratio = 0.0;
      std::string bad =
          tol::check_adam_params(w.data(), want.data(), g0.data(), p.numel(), lim.grad, kLr, kSteps, lim.unit, &ratio);
      EXPECT_EQ(bad, "") << tag << " after " << kSteps << " steps: " << p.hf_name;
      if (margins) std::printf("margin %s step3 %s %.3g\n", tag.c_str(), p.hf_name.c_str(), ratio);
    }
  }
}

}  // namespace

TEST(HfReference, Gpt2Tiny) { check_model("gpt2_tiny", DType::f32); }
TEST(HfReference, LlamaTinyGqa) { check_model("llama_tiny", DType::f32); }
TEST(HfReference, LlamaTiedTiny) { check_model("llama_tied_tiny", DType::f32); }
TEST(HfReference, Gpt2TinyBf16) { check_model("gpt2_tiny", DType::bf16); }
TEST(HfReference, LlamaTinyGqaBf16) { check_model("llama_tiny", DType::bf16); }
TEST(HfReference, LlamaTiedTinyBf16) { check_model("llama_tied_tiny", DType::bf16); }
// Llama 3.1's llama3 rope scaling, and Mistral (a window of 5 keys on every layer, within the batch's 13)
TEST(HfReference, Llama31Tiny) { check_model("llama31_tiny", DType::f32); }
TEST(HfReference, Llama31TinyBf16) { check_model("llama31_tiny", DType::bf16); }
TEST(HfReference, MistralTiny) { check_model("mistral_tiny", DType::f32); }
TEST(HfReference, MistralTinyBf16) { check_model("mistral_tiny", DType::bf16); }
// biases on a LLaMA: Qwen2's q/k/v, and attention_bias + mlp_bias on every projection
TEST(HfReference, Qwen2Tiny) { check_model("qwen2_tiny", DType::f32); }
TEST(HfReference, Qwen2TinyBf16) { check_model("qwen2_tiny", DType::bf16); }
// local and global layers mixed: Qwen2's layer 0 full, layer 1 a window of 4 (max_window_layers 1);
// the other placements would be 0.41 (both full) and 0.82 (both sliding) away in the logits
TEST(HfReference, Qwen2WindowTiny) { check_model("qwen2_window_tiny", DType::f32); }
TEST(HfReference, Qwen2WindowTinyBf16) { check_model("qwen2_window_tiny", DType::bf16); }
TEST(HfReference, LlamaBiasTiny) { check_model("llama_bias_tiny", DType::f32); }
TEST(HfReference, LlamaBiasTinyBf16) { check_model("llama_bias_tiny", DType::bf16); }
// Qwen3: per-head q/k RMSNorm, and head_dim 16 where hidden / heads is 8
TEST(HfReference, Qwen3Tiny) { check_model("qwen3_tiny", DType::f32); }
TEST(HfReference, Qwen3TinyBf16) { check_model("qwen3_tiny", DType::bf16); }
// Phi-3: q/k/v and gate/up stored fused (qkv_proj, gate_up_proj)
TEST(HfReference, Phi3Tiny) { check_model("phi3_tiny", DType::f32); }
TEST(HfReference, Phi3TinyBf16) { check_model("phi3_tiny", DType::bf16); }
// longrope past its original context of 8 (the long factors, attention factor sqrt 2) over 6 of 8 channels
TEST(HfReference, Phi3LongropeTiny) { check_model("phi3_longrope_tiny", DType::f32); }
TEST(HfReference, Phi3LongropeTinyBf16) { check_model("phi3_longrope_tiny", DType::bf16); }
// Gemma 3: GeGLU, (1 + w) norms, sandwich norms, scaled embeddings, q/k norms, sliding layers with
// their own RoPE base beside a full one with linear scaling; Gemma 2: the same block, one RoPE
TEST(HfReference, Gemma3Tiny) { check_model("gemma3_tiny", DType::f32); }
TEST(HfReference, Gemma3TinyBf16) { check_model("gemma3_tiny", DType::bf16); }
TEST(HfReference, Gemma2Tiny) { check_model("gemma2_tiny", DType::f32); }
TEST(HfReference, Gemma2TinyBf16) { check_model("gemma2_tiny", DType::bf16); }
// the same fixtures with the CUDA backend
TEST(HfReferenceCuda, Gpt2Tiny) { check_model("gpt2_tiny", DType::f32, "cuda"); }
TEST(HfReferenceCuda, LlamaTinyGqa) { check_model("llama_tiny", DType::f32, "cuda"); }
TEST(HfReferenceCuda, LlamaTiedTiny) { check_model("llama_tied_tiny", DType::f32, "cuda"); }
TEST(HfReferenceCuda, Gpt2TinyBf16) { check_model("gpt2_tiny", DType::bf16, "cuda"); }
TEST(HfReferenceCuda, LlamaTinyGqaBf16) { check_model("llama_tiny", DType::bf16, "cuda"); }
TEST(HfReferenceCuda, LlamaTiedTinyBf16) { check_model("llama_tied_tiny", DType::bf16, "cuda"); }
TEST(HfReferenceCuda, Llama31Tiny) { check_model("llama31_tiny", DType::f32, "cuda"); }
TEST(HfReferenceCuda, Llama31TinyBf16) { check_model("llama31_tiny", DType::bf16, "cuda"); }
TEST(HfReferenceCuda, MistralTiny) { check_model("mistral_tiny", DType::f32, "cuda"); }
TEST(HfReferenceCuda, MistralTinyBf16) { check_model("mistral_tiny", DType::bf16, "cuda"); }
TEST(HfReferenceCuda, Qwen2Tiny) { check_model("qwen2_tiny", DType::f32, "cuda"); }
TEST(HfReferenceCuda, Qwen2TinyBf16) { check_model("qwen2_tiny", DType::bf16, "cuda"); }
TEST(HfReferenceCuda, Qwen2WindowTiny) { check_model("qwen2_window_tiny", DType::f32, "cuda"); }
TEST(HfReferenceCuda, Qwen2WindowTinyBf16) { check_model("qwen2_window_tiny", DType::bf16, "cuda"); }
TEST(HfReferenceCuda, LlamaBiasTiny) { check_model("llama_bias_tiny", DType::f32, "cuda"); }
TEST(HfReferenceCuda, LlamaBiasTinyBf16) { check_model("llama_bias_tiny", DType::bf16, "cuda"); }
TEST(HfReferenceCuda, Qwen3Tiny) { check_model("qwen3_tiny", DType::f32, "cuda"); }
TEST(HfReferenceCuda, Qwen3TinyBf16) { check_model("qwen3_tiny", DType::bf16, "cuda"); }
TEST(HfReferenceCuda, Phi3Tiny) { check_model("phi3_tiny", DType::f32, "cuda"); }
TEST(HfReferenceCuda, Phi3TinyBf16) { check_model("phi3_tiny", DType::bf16, "cuda"); }
TEST(HfReferenceCuda, Phi3LongropeTiny) { check_model("phi3_longrope_tiny", DType::f32, "cuda"); }
TEST(HfReferenceCuda, Phi3LongropeTinyBf16) { check_model("phi3_longrope_tiny", DType::bf16, "cuda"); }
TEST(HfReferenceCuda, Gemma3Tiny) { check_model("gemma3_tiny", DType::f32, "cuda"); }
TEST(HfReferenceCuda, Gemma3TinyBf16) { check_model("gemma3_tiny", DType::bf16, "cuda"); }
TEST(HfReferenceCuda, Gemma2Tiny) { check_model("gemma2_tiny", DType::f32, "cuda"); }
TEST(HfReferenceCuda, Gemma2TinyBf16) { check_model("gemma2_tiny", DType::bf16, "cuda"); }

// Issue 23: a GPT-2 directory with "tie_word_embeddings": false and its own lm_head.weight trained
// tied (lm_head.weight skipped) and exported as tied. GPT2LMHeadModel untied computes
// logits = ln_f(h) lm_head^T with wte only in the embedding, so with lm_head.weight = wte it gives
// the gpt2_tiny fixture's logits and loss exactly, and the fixture's (tied) wte gradient splits into
// the embedding's and the head's: grad(wte) + grad(lm_head) = the fixture's grad(wte).
TEST(HfReference, Gpt2UntiedHeadFromTheTiedFixture) {
  const std::string src = llmt_test::reference_dir() + "/gpt2_tiny";
  ModelConfig tied = config_from_json_file(src + "/config.json");
  ModelConfig untied = tied;
  untied.tied_embeddings = false;
  const ModelLayout Lt = make_layout(tied), Lu = make_layout(untied);
  SafetensorsCheckpoint fixture(src);
  // the untied directory: every tensor as the fixture's, and lm_head.weight a copy of wte
  llmt_test::TempDir out("untied");
  {
    std::vector<float> t((size_t)Lt.units[0].numel), u((size_t)Lu.units[0].numel);
    load_hf_unit(fixture, tied, Lt, 0, t.data());
    for (const ParamSpec& p : Lu.units[0].params) {
      const std::string from = p.hf_name == "lm_head.weight" ? "transformer.wte.weight" : p.hf_name;
      for (const ParamSpec& q : Lt.units[0].params)
        if (q.hf_name == from) std::copy(t.begin() + q.offset, t.begin() + q.offset + q.numel(), u.begin() + p.offset);
    }
    HfExporter ex(out.path, untied, Lu, "F32");
    ex.write_unit(0, u.data());
    for (size_t k = 1; k < Lt.units.size(); k++) {
      std::vector<float> block((size_t)Lt.units[k].numel);
      load_hf_unit(fixture, tied, Lt, (int)k, block.data());
      ex.write_unit((int)k, block.data());
    }
    ex.finish();
  }
  // read back as a user's directory would be (the config.json is llmt's export: it must say untied)
  ModelConfig cfg = config_from_json_file(out.path + "/config.json");
  ASSERT_FALSE(cfg.tied_embeddings) << "tie_word_embeddings false was read as tied";
  SafetensorsCheckpoint ckpt(out.path);
  ASSERT_TRUE(ckpt.find("lm_head.weight", nullptr)) << "the export dropped lm_head.weight";

  SafetensorsFile ref(src + "/reference.safetensors");
  const llmt_test::HfBatch batch = llmt_test::read_hf_batch(ref);
  const std::vector<int32_t>&ids = batch.ids, &targets = batch.targets;
  const int B = batch.B, T = batch.T, n_valid = batch.n_valid;
  std::unique_ptr<Backend> be = make_cpu_backend(2, DType::f32);
  Transformer model(cfg, *be, B, T);
  const ModelLayout& L = model.layout();
  std::unique_ptr<DataComm> solo = make_solo_data_comm();
  FsdpStore store(*be, L, Strategy::no_shard, *solo, 1);
  check_hf_tensors(ckpt, cfg, L, out.path);
  for (size_t u = 0; u < L.units.size(); u++) {
    std::vector<float> host((size_t)L.units[u].numel);
    load_hf_unit(ckpt, cfg, L, (int)u, host.data());
    store.set_unit((int)u, host.data());
  }
  BackendBuffer loss(*be, DType::f64, {1});
  TrainPass pass;
  pass.grad_scale = 1.0f / n_valid;
  model.forward(store, ids.data(), targets.data(), 0, loss.tensor());  // (with a TrainPass, dlogits replace them)
  std::vector<float> logits = logits_to_host(*be, model), want_logits = read_all(ref, "logits");
  EXPECT_LT(rel_error(logits.data(), want_logits.data(), (int64_t)logits.size()), tol::kF32Logits);
  double sum = 0.0;
  be->copy_to_host(&sum, loss.tensor().data, sizeof(sum));
  const float want_loss = read_all(ref, "loss")[0];
  EXPECT_NEAR(sum / n_valid, want_loss, tol::kF32Loss * std::fabs(want_loss));
  store.zero_grads();
  model.forward(store, ids.data(), targets.data(), 0, loss.tensor(), &pass);
  model.backward(store);
  std::vector<float> head, wte;
  for (size_t u = 0; u < L.units.size(); u++) {
    const std::vector<float> grad = to_host(*be, store.shard_state((int)u).grad);
    for (const ParamSpec& p : L.units[u].params) {
      std::vector<float> g = hf_view(grad.data(), p);
      if (p.hf_name == "lm_head.weight") head = g;
      else if (p.hf_name == "transformer.wte.weight") wte = g;
      else {
        std::vector<float> want = read_all(ref, "grad." + p.hf_name);
        EXPECT_LT(rel_error(g.data(), want.data(), p.numel()), tol::kF32Grad) << p.hf_name;
      }
    }
  }
  ASSERT_EQ(head.size(), wte.size());
  std::vector<float> both(head.size()), want = read_all(ref, "grad.transformer.wte.weight");
  for (size_t i = 0; i < both.size(); i++) both[i] = head[i] + wte[i];
  EXPECT_LT(rel_error(both.data(), want.data(), (int64_t)both.size()), tol::kF32Grad);
  EXPECT_GT(rel_error(head.data(), want.data(), (int64_t)head.size()), tol::kF32Grad)
      << "the head's gradient alone should not be the tied one (the embedding's part is missing)";
}
