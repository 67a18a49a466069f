// Generation with a KV cache (models/generate.h) against transformers' generate(do_sample=False) on
// every tiny fixture (tests/reference/<model>/generate.json, made by make_generate_fixtures.py), on
// the CPU and on the CUDA backend (the SIMT emulator in ctest); the KV cache against recomputing the
// whole sequence; seeded sampling repeated bitwise; the token choice's warpers one by one.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/formats/safetensors.h"
#include "engine/fsdp/fsdp.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "models/generate.h"
#include "models/hf_checkpoint.h"
#include "models/lora.h"
#include "models/transformer.h"
#include "tests/test_util.h"
#include "train/plan.h"

using namespace llmt;
using IdRows = std::vector<std::vector<int32_t>>;

namespace {

const char* kFixtures[] = {"gpt2_tiny",    "llama_tiny", "llama_tied_tiny", "llama31_tiny",
                           "mistral_tiny", "qwen2_tiny", "llama_bias_tiny", "qwen3_tiny",
                           "phi3_tiny",    "phi3_longrope_tiny",
                           "gemma3_tiny",  "gemma2_tiny"};

// A fixture model on a backend, its parameters in an unsharded store, for batches of B sequences of
// up to T tokens.
struct Loaded {
  ModelConfig cfg;
  std::unique_ptr<Backend> be;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<DataComm> solo;
  std::unique_ptr<FsdpStore> store;
};
std::unique_ptr<Loaded> load(const std::string& name, const std::string& device, DType compute, int B, int T) {
  const std::string dir = llmt_test::reference_dir() + "/" + name;
  auto m = std::make_unique<Loaded>();
  m->cfg = config_from_json_file(dir + "/config.json");
  m->be = device == "cpu" ? make_cpu_backend(2, compute) : make_cuda_backend(0, compute, false);
  m->model = std::make_unique<Transformer>(m->cfg, *m->be, B, T);
  const ModelLayout& L = m->model->layout();
  m->solo = make_solo_data_comm();
  m->store = std::make_unique<FsdpStore>(*m->be, L, Strategy::no_shard, *m->solo, 1);
  SafetensorsCheckpoint ckpt(dir);
  for (size_t u = 0; u < L.units.size(); u++) {
    std::vector<float> host((size_t)L.units[u].numel);
    load_hf_unit(ckpt, m->cfg, L, (int)u, host.data());
    m->store->set_unit((int)u, host.data());
  }
  return m;
}

// The model's logits, [rows, V] on the host (each row's padding, logits_stride, dropped).
std::vector<float> logits_host(const Transformer& model) {
  const Tensor t = model.logits();
  std::vector<float> padded((size_t)t.numel());
  if (t.dtype == DType::f32) {
    model.backend().copy_to_host(padded.data(), t.data, t.nbytes());
  } else {
    std::vector<uint16_t> h(padded.size());
    model.backend().copy_to_host(h.data(), t.data, t.nbytes());
    for (size_t i = 0; i < h.size(); i++) padded[i] = bf16_to_f32(h[i]);
  }
  const int64_t V = model.config().vocab_size, stride = model.logits_stride(), rows = t.numel() / stride;
  std::vector<float> out((size_t)(rows * V));
  for (int64_t r = 0; r < rows; r++)
    std::copy(padded.begin() + r * stride, padded.begin() + r * stride + V, out.begin() + r * V);
  return out;
}

nlohmann::json reference(const std::string& name) {
  std::ifstream f(llmt_test::reference_dir() + "/" + name + "/generate.json");
  EXPECT_TRUE(f.good()) << name << "/generate.json missing: run tests/reference/make_generate_fixtures.py";
  return nlohmann::json::parse(f);
}

size_t longest(const IdRows& p) {
  size_t n = 0;
  for (const auto& r : p) n = std::max(n, r.size());
  return n;
}

IdRows run(const std::string& name, const std::string& device, DType compute, const IdRows& prompts,
           const GenerateOptions& o) {
  auto m = load(name, device, compute, (int)prompts.size(), (int)longest(prompts));
  IdRows out;
  for (const Generated& g : generate(*m->model, *m->store, prompts, o)) out.push_back(g.ids);
  return out;
}

class GenerateVsTransformers : public ::testing::TestWithParam<const char*> {};

// Greedy ids equal transformers' for each prompt alone, the three left-padded in one batch, and the
// batch with an EOS that stops one prompt early, in fp32 on the CPU and on the CUDA backend.
TEST_P(GenerateVsTransformers, GreedyIdsEqual) {
  const std::string name = GetParam();
  const nlohmann::json ref = reference(name);
  const IdRows prompts = ref["prompts"].get<IdRows>();
  ASSERT_GT(ref["min_margin"].get<double>(), 1e-4) << "the reference is within fp32 noise of a tie";
  GenerateOptions o;
  o.max_new_tokens = ref["max_new_tokens"].get<int>();
  o.pad_id = ref["pad_token_id"].get<int>();
  for (const char* device : {"cpu", "cuda"}) {
    SCOPED_TRACE(device);
    const IdRows alone = ref["alone"].get<IdRows>();
    for (size_t i = 0; i < prompts.size(); i++)
      EXPECT_EQ(run(name, device, DType::f32, {prompts[i]}, o)[0], alone[i]) << "prompt " << i << " alone";
    EXPECT_EQ(run(name, device, DType::f32, prompts, o), ref["batched"].get<IdRows>()) << "the batch, left-padded";
    GenerateOptions stop = o;
    stop.eos_ids = {ref["eos"]["eos_token_id"].get<int32_t>()};
    EXPECT_EQ(run(name, device, DType::f32, prompts, stop), ref["eos"]["ids"].get<IdRows>()) << "with an EOS";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GenerateVsTransformers, ::testing::ValuesIn(kFixtures),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

// Each step's logits with the cache equal those of a forward pass over the whole sequence so far
// (no cache), in fp32 and in bf16, on the CPU and the CUDA backend.
TEST(Generate, KvCacheLogitsEqualRecomputingTheSequence) {
  for (const char* name : {"gpt2_tiny", "llama_tiny"})
    for (const char* device : {"cpu", "cuda"})
      for (DType dt : {DType::f32, DType::bf16}) {
        SCOPED_TRACE(::testing::Message() << name << " " << device << " " << dtype_name(dt));
        const std::vector<int32_t> seq = {5, 77, 200, 3, 41, 9, 130, 250, 17, 60, 99, 4};
        const int P = 5, n = (int)seq.size();
        auto cached = load(name, device, dt, 1, P);
        cached->model->start_generation(n, {0});
        cached->model->decode(*cached->store, seq.data(), P);
        for (int t = P; t <= n; t++) {
          const int rows = t == P ? P : 1;
          if (t > P) cached->model->decode(*cached->store, &seq[(size_t)t - 1], 1);
          std::vector<float> got = logits_host(*cached->model);
          auto whole = load(name, device, dt, 1, t);
          whole->model->forward(*whole->store, seq.data(), nullptr, t, Tensor());
          std::vector<float> want = logits_host(*whole->model);
          const int V = cached->cfg.vocab_size;
          ASSERT_EQ(got.size(), (size_t)rows * V);
          // the last row: the one generation reads
          const double err = llmt_test::rel_error(&got[(size_t)(rows - 1) * V], &want[(size_t)(t - 1) * V], V);
          EXPECT_LT(err, dt == DType::f32 ? 1e-5 : 2e-2) << "position " << t - 1;
        }
      }
}

// LongRoPE: a cache whose keys were rotated with the short factors cannot take a pass past the
// original context (the long factors apply to every key there); decode refuses it, and a cache
// started with the long factors takes it, its logits those of the whole sequence's forward.
TEST(Generate, LongropeCacheSwitchesSetsOnlyFromTheStart) {
  const std::vector<int32_t> seq = {5, 77, 200, 3, 41, 9, 130, 250, 17};  // 9 > the original 8
  const int n = (int)seq.size();
  auto m = load("phi3_longrope_tiny", "cpu", DType::f32, 1, n);
  ASSERT_EQ(m->cfg.rope_original_max, 8);
  m->model->start_generation(n, {0});
  m->model->decode(*m->store, seq.data(), n - 1);
  EXPECT_TRUE(m->model->decode_needs_long_restart(1));
  llmt_test::expect_error([&] { m->model->decode(*m->store, &seq[(size_t)n - 1], 1); }, {"longrope", "long_rope"});
  m->model->start_generation(n, {0}, true);
  m->model->decode(*m->store, seq.data(), n - 1);
  EXPECT_FALSE(m->model->decode_needs_long_restart(1));
  m->model->decode(*m->store, &seq[(size_t)n - 1], 1);
  const std::vector<float> got = logits_host(*m->model);
  auto whole = load("phi3_longrope_tiny", "cpu", DType::f32, 1, n);
  whole->model->forward(*whole->store, seq.data(), nullptr, n, Tensor());
  const std::vector<float> want = logits_host(*whole->model);
  const int V = m->cfg.vocab_size;
  EXPECT_LT(llmt_test::rel_error(got.data(), &want[(size_t)(n - 1) * V], V), 1e-5);
  // and within the original context the short set: a whole forward of 8 differs from the first 8
  // rows of the forward of 9 (long set)
  auto eight = load("phi3_longrope_tiny", "cpu", DType::f32, 1, 8);
  eight->model->forward(*eight->store, seq.data(), nullptr, 8, Tensor());
  EXPECT_GT(llmt_test::rel_error(logits_host(*eight->model).data(), &want[7 * (size_t)V], V), 1e-3);
}

// Sampling draws from (seed, the prompt's index, the step) only: the same seed repeats bitwise, on
// either backend alike, whatever else is in the batch; another seed gives other tokens.
TEST(Generate, SeededSamplingRepeats) {
  const IdRows prompts = {{10, 20, 30}, {7, 8}};
  GenerateOptions o;
  o.do_sample = true, o.max_new_tokens = 10, o.temperature = 1.5f, o.top_k = 100, o.top_p = 0.95f, o.seed = 1234;
  const IdRows a = run("llama_tiny", "cpu", DType::f32, prompts, o);
  EXPECT_EQ(run("llama_tiny", "cpu", DType::f32, prompts, o), a);
  EXPECT_EQ(run("llama_tiny", "cuda", DType::f32, prompts, o), a);
  auto single = load("llama_tiny", "cpu", DType::f32, 1, 3);
  EXPECT_EQ(generate(*single->model, *single->store, {prompts[0]}, o)[0].ids, a[0]) << "prompt 0 alone";
  o.seed = 1235;
  EXPECT_NE(run("llama_tiny", "cpu", DType::f32, prompts, o), a);
}

TEST(Generate, ChooseTokenWarpers) {
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f, -1.0f};
  GenerateOptions greedy;
  EXPECT_EQ(choose_token(logits, greedy, 0.5), 1) << "greedy takes the first largest";
  GenerateOptions s;
  s.do_sample = true, s.top_k = 0;
  // softmax of the logits: cumulative sums tell which token u lands on
  std::vector<double> p;
  double z = 0;
  for (float l : logits) z += std::exp((double)l);
  double cum = 0;
  for (size_t i = 0; i < logits.size(); i++) {
    const double pi = std::exp((double)logits[i]) / z;
    EXPECT_EQ(choose_token(logits, s, cum + pi * 0.5), (int32_t)i) << "u inside token " << i << "'s share";
    cum += pi;
  }
  s.top_k = 2;  // keeps the two 2.0s only
  for (double u : {0.01, 0.3, 0.6, 0.99}) {
    const int32_t id = choose_token(logits, s, u);
    EXPECT_TRUE(id == 1 || id == 3) << "top_k 2 drew " << id;
  }
  s.top_k = 0, s.top_p = 0.5f;  // the two 2.0s hold 0.73 of the mass: token 1 (first in the sort) and 3
  for (double u : {0.01, 0.99}) {
    const int32_t id = choose_token(logits, s, u);
    EXPECT_TRUE(id == 1 || id == 3) << "top_p 0.5 drew " << id;
  }
  s.top_p = 1.0f, s.temperature = 1e-3f;  // a cold temperature is greedy up to the tie
  EXPECT_EQ(choose_token(logits, s, 0.2), 1);
  EXPECT_EQ(choose_token(logits, s, 0.8), 3);
}

// A temperature so small that logit / T overflows (1e-40; 1e-300 is still positive) samples the
// greedy token: x / T was inf, exp(inf - inf) NaN, and the last candidate came back every step.
TEST(Generate, ATinyTemperatureGivesTheGreedyToken) {
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 2.5f, 0.0f};
  GenerateOptions s;
  s.do_sample = true;
  for (double t : {1e-40, 1e-300}) {
    s.temperature = t;
    for (int top_k : {0, 3})
      for (float top_p : {1.0f, 0.9f})
        for (double u : {0.001, 0.5, 0.999}) {
          s.top_k = top_k, s.top_p = top_p;
          EXPECT_EQ(choose_token(logits, s, u), 1) << "temperature " << t << ", top_k " << top_k << ", top_p "
                                                   << top_p << ", u " << u;
        }
  }
}

// llmt plan sizes the cache generate allocates: Llama 3 8B keeps 2 (k, v) x 32 layers x 8 kv heads
// x 128 channels in bf16, 128 KiB a token, so 4 sequences of 4096 tokens take 2 GiB.
TEST(Generate, PlanSizesTheKvCache) {
  PlanArgs a;
  a.model = "llama3-8b", a.batch = 4, a.seq_len = 4096, a.bf16 = true;
  const ModelConfig cfg = config_from_preset(a.model);
  EXPECT_DOUBLE_EQ(plan_run(cfg, a).kv_cache_gib, 2.0);
  EXPECT_EQ(Transformer::kv_cache_bytes(cfg, 1, 1, DType::bf16), 128 * 1024);
  a.bf16 = false;
  EXPECT_DOUBLE_EQ(plan_run(cfg, a).kv_cache_gib, 4.0);
}

// A GPU pads the logits' rows to a multiple of 128 (GPT-2: 50257 -> 50304, 16-byte rows); the CPU
// does not; llmt plan counts what each allocates, and the smaller buffer of a chunked head. Llama 3's
// 128256 is already a multiple.
TEST(Plan, LogitsRowsArePaddedOnAGpu) {
  EXPECT_EQ(Transformer::padded_vocab(config_from_preset("gpt2"), kDeviceVocabPad), 50304);
  EXPECT_EQ(Transformer::padded_vocab(config_from_preset("gpt2"), 1), 50257);
  EXPECT_EQ(Transformer::padded_vocab(config_from_preset("llama3-8b"), kDeviceVocabPad), 128256);
  PlanArgs a;
  a.model = "gpt2", a.batch = 2, a.seq_len = 64;
  const ModelConfig cfg = config_from_preset(a.model);
  const double cpu = plan_run(cfg, a).activations_by_buffer_gib.at("logits");
  a.vocab_pad = kDeviceVocabPad;
  const double gpu = plan_run(cfg, a).activations_by_buffer_gib.at("logits");
  EXPECT_DOUBLE_EQ(cpu * (1u << 30), 2.0 * 64 * 50257 * 4);
  EXPECT_DOUBLE_EQ(gpu * (1u << 30), 2.0 * 64 * 50304 * 4);
  a.logits_chunk_tokens = 16;  // --logits_chunk_tokens: a buffer of 16 rows, and the recomputed loss's scalar
  const Plan chunked = plan_run(cfg, a);
  EXPECT_DOUBLE_EQ(chunked.activations_by_buffer_gib.at("logits") * (1u << 30), 16.0 * 50304 * 4);
  EXPECT_DOUBLE_EQ(chunked.activations_by_buffer_gib.at("chunked head's recomputed loss") * (1u << 30), 8.0);
  auto m = load("gpt2_tiny", "cuda", DType::bf16, 1, 4);  // vocabulary 259: rows of 384 on the device
  EXPECT_EQ(m->model->logits_stride(), 384);
  EXPECT_EQ(load("gpt2_tiny", "cpu", DType::f32, 1, 4)->model->logits_stride(), 259);
}

// llmt plan under --use_peft (LLaMA-7B, 8 ranks, bf16, the figure): the frozen base keeps its
// bf16 shards only (no master, gradients or moments), the adapter keeps a trainable store's 18 bytes
// a parameter, the base's reduce-scatters disappear, and a step's FLOPs drop the base's dW products
// (4 N_matmul + 6 N_adapter). The store's measured bytes are checked in mpi.lora_equivalence.
TEST(Plan, LoraCountsTheFrozenBaseAndTheAdapter) {
  PlanArgs a;
  a.model = "llama-7b", a.world = 8, a.batch = 4, a.seq_len = 512, a.bf16 = true, a.gradient_checkpointing = true;
  const ModelConfig cfg = config_from_preset(a.model);
  const Plan full = plan_run(cfg, a);
  LoraConfig lora;
  lora.target_modules = {"all-linear"};
  a.lora = resolve_lora_config(lora, cfg);
  const Plan p = plan_run(cfg, a);
  const ModelLayout L = make_layout(cfg);
  const LoraLayout AL = make_lora_layout(cfg, *a.lora);
  // r 16 on q, k, v, o, gate, up, down: 16 (in + out) each, 32 blocks
  const int64_t C = 4096, F = 11008;
  EXPECT_EQ(p.adapter_params, 32 * 16 * (4 * (C + C) + 2 * (C + F) + (F + C)));
  EXPECT_EQ(p.adapter_params, AL.total_numel);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  auto shards = [](const ParamLayout& l) {  // a rank's elements over 8 shards
    double n = 0.0;
    for (auto& u : l.units) n += (double)((u.numel + 7) / 8);
    return n;
  };
  EXPECT_NEAR(p.persistent_gib * gib, 2.0 * shards(L) + 18.0 * shards(AL), 1.0);
  EXPECT_NEAR(full.persistent_gib * gib, 18.0 * shards(L), 1.0);
  EXPECT_LT(p.total_gib, full.total_gib / 4);
  // the base gathers as before; the adapter's blocks (its root is empty) gather twice in bf16 and
  // reduce-scatter once in f32, each rank sending 7 of 8 shards
  EXPECT_NEAR(p.comm_all_gather_bytes, full.comm_all_gather_bytes + 7.0 * 2 * shards(AL) * 2, 1.0);
  EXPECT_NEAR(p.comm_reduce_scatter_bytes, 7.0 * shards(AL) * 4, 1.0);
  const double attention = 12.0 * 32 * 4096 * 512;
  EXPECT_DOUBLE_EQ(full.flops_per_token, 6.0 * L.matmul_numel + attention);
  EXPECT_DOUBLE_EQ(p.flops_per_token, 4.0 * L.matmul_numel + 6.0 * p.adapter_params + attention);
}

TEST(Generate, RefusesWhatItCannotDo) {
  auto m = load("mistral_tiny", "cpu", DType::f32, 1, 12);
  GenerateOptions o;
  o.max_new_tokens = 8;
  llmt_test::expect_error([&] { generate(*m->model, *m->store, {{}}, o); }, {"prompt 0 has no tokens"});
  o.max_new_tokens = 2;
  llmt_test::expect_error([&] { m->model->decode(*m->store, std::vector<int32_t>(13, 5).data(), 13); },
                          {"decode"});
}

}  // namespace
