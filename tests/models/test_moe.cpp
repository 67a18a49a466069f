// Mixture of experts (models/moe.h) against Hugging Face transformers 5.25: Mixtral, Qwen3-MoE (a dense
// layer among MoE ones; decoder_sparse_step 2) and Qwen2-MoE (the shared expert), with and without the
// load-balancing loss, a router of exact ties: logits, loss, every gradient and the weights after AdamW
// steps, fp32 and bf16 (tests/reference/make_moe_fixtures.py); greedy generation; config.json and the
// Hub's per-expert checkpoint names both ways; the presets' published sizes; what is refused by name.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
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
#include "models/moe.h"
#include "models/transformer.h"
#include "tests/models/hf_fixture.h"
#include "tests/test_util.h"
#include "tests/tolerances.h"

using namespace llmt;
using llmt_test::hf_view;
using llmt_test::read_all;
using llmt_test::rel_error;
using llmt_test::to_host;
namespace tol = llmt_test::tol;

namespace {

// make_moe_fixtures.py's AdamW: lr 1e-3 (a tenth of the dense fixtures': see the script), weight decay 0.1
constexpr float kMoeLr = 1e-3f;

std::string dir_of(const std::string& name) { return llmt_test::reference_dir() + "/" + name; }

// A fixture model on the CPU, unsharded, for the fixture's batch (or B x T tokens).
struct Loaded {
  ModelConfig cfg;
  std::unique_ptr<Backend> be;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<DataComm> solo;
  std::unique_ptr<FsdpStore> store;
};
std::unique_ptr<Loaded> load(const std::string& name, DType compute, int B, int T, const ModelConfig* cfg = nullptr) {
  auto m = std::make_unique<Loaded>();
  m->cfg = cfg ? *cfg : config_from_json_file(dir_of(name) + "/config.json");
  m->be = make_cpu_backend(2, compute);
  m->model = std::make_unique<Transformer>(m->cfg, *m->be, B, T);
  const ModelLayout& L = m->model->layout();
  m->solo = make_solo_data_comm();
  m->store = std::make_unique<FsdpStore>(*m->be, L, Strategy::no_shard, *m->solo, 1);
  SafetensorsCheckpoint ckpt(dir_of(name));
  check_hf_tensors(ckpt, m->cfg, L, dir_of(name));
  for (size_t u = 0; u < L.units.size(); u++) {
    std::vector<float> host((size_t)L.units[u].numel);
    load_hf_unit(ckpt, m->cfg, L, (int)u, host.data());
    m->store->set_unit((int)u, host.data());
  }
  return m;
}

std::vector<float> logits_host(Backend& be, const Transformer& model) {
  const std::vector<float> padded = to_host(be, model.logits());
  const int64_t V = model.config().vocab_size, stride = model.logits_stride(), rows = (int64_t)padded.size() / stride;
  std::vector<float> out((size_t)(rows * V));
  for (int64_t r = 0; r < rows; r++)
    std::copy(padded.begin() + r * stride, padded.begin() + r * stride + V, out.begin() + r * V);
  return out;
}

std::vector<std::string> names_of(const SafetensorsFile& f) {
  std::vector<std::string> n;
  for (const StTensor& t : f.tensors()) n.push_back(t.name);
  return n;
}

double read_f64(Backend& be, const Tensor& t) {
  double v = 0.0;
  be.copy_to_host(&v, t.data, sizeof(v));
  return v;
}

// bf16: llmt's distance from the fp32 reference at most kBf16VsAutocast times autocast's own (plus a
// rounding), as tests/models/test_hf_reference.cpp bounds the dense families
// (gradients: tests/tolerances.h's MoE factor, their few rows a token each)
void expect_no_worse_than_autocast(const SafetensorsFile& ref32, const SafetensorsFile& ref, const std::string& key,
                                   const std::vector<float>& ours, const std::string& tag) {
  std::vector<float> exact = read_all(ref32, key), theirs = read_all(ref, key);
  const double e_ours = rel_error(ours.data(), exact.data(), (int64_t)exact.size());
  const double e_theirs = rel_error(theirs.data(), exact.data(), (int64_t)exact.size());
  const double factor = key.rfind("grad.", 0) == 0 ? tol::kBf16VsAutocastMoe : tol::kBf16VsAutocast;
  EXPECT_LT(e_ours, factor * e_theirs + tol::kUnitBf16)
      << tag << " " << key << ": llmt bf16 is " << e_ours << " from fp32, autocast " << e_theirs;
}

// The fixture's logits, loss (its cross-entropy and aux parts), every gradient and the weights after
// its AdamW steps, within tests/tolerances.h's limits for the compute dtype.
void check_moe_model(const std::string& name, DType compute) {
  SafetensorsFile ref32(dir_of(name) + "/reference.safetensors");
  SafetensorsFile ref(dir_of(name) + (compute == DType::f32 ? "/reference.safetensors" : "/reference_bf16.safetensors"));
  const llmt_test::Limits lim = llmt_test::limits_for(compute);
  const bool bf16 = compute == DType::bf16;
  const std::string tag = name + (bf16 ? " bf16" : " f32");
  const llmt_test::HfBatch batch = llmt_test::read_hf_batch(ref32);
  auto m = load(name, compute, batch.B, batch.T);
  Backend& be = *m->be;
  Transformer& model = *m->model;
  FsdpStore& store = *m->store;
  const ModelLayout& L = model.layout();
  const bool aux = m->cfg.moe.output_router_logits;
  ASSERT_TRUE(m->cfg.moe.active()) << tag;

  BackendBuffer loss(be, DType::f64, {1});
  auto loss_mean = [&] {  // the token mean of the cross-entropy so far, then reset
    double s = read_f64(be, loss.tensor());
    be.zero(loss.tensor().data, sizeof(s));
    return s / batch.n_valid;
  };
  TrainPass pass;
  pass.grad_scale = 1.0f / batch.n_valid;

  model.forward(store, batch.ids.data(), batch.targets.data(), 0, loss.tensor());
  const std::vector<float> logits = logits_host(be, model), ref_logits = read_all(ref, "logits");
  EXPECT_LT(rel_error(logits.data(), ref_logits.data(), (int64_t)logits.size()), lim.logits) << tag << " logits";
  if (bf16) expect_no_worse_than_autocast(ref32, ref, "logits", logits, tag);
  const double ce = loss_mean(), aux_value = read_f64(be, model.router_aux_loss());
  const float ref_ce = read_all(ref, "ce_loss")[0], ref_loss = read_all(ref, "loss")[0];
  EXPECT_NEAR(ce, ref_ce, lim.loss * ref_ce) << tag << " cross-entropy";
  EXPECT_NEAR(ce + aux_value, ref_loss, lim.loss * ref_loss) << tag << " loss (with the aux loss: " << aux << ")";
  if (aux) {  // the aux term itself, far finer than the loss's limit
    const double want = m->cfg.moe.aux_loss_coef * read_all(ref, "aux_loss")[0];
    EXPECT_NEAR(aux_value, want, (bf16 ? 2e-2 : 1e-5) * want) << tag << " router_aux_loss_coef x aux_loss";
  } else {
    EXPECT_EQ(aux_value, 0.0) << tag << " no aux loss without output_router_logits";
  }

  store.zero_grads();
  model.forward(store, batch.ids.data(), batch.targets.data(), 0, loss.tensor(), &pass);
  model.backward(store);
  loss_mean();
  int checked = 0;
  for (size_t u = 0; u < L.units.size(); u++) {
    const std::vector<float> grad = to_host(be, store.shard_state((int)u).grad);
    for (const ParamSpec& p : L.units[u].params) {
      std::vector<float> g = hf_view(grad.data(), p), want = read_all(ref, "grad." + p.hf_name);
      ASSERT_EQ(g.size(), want.size()) << p.hf_name;
      EXPECT_LT(rel_error(g.data(), want.data(), p.numel()), bf16 ? tol::kBf16MoeGrad : lim.grad)
          << tag << " grad of " << p.hf_name;
      if (bf16) expect_no_worse_than_autocast(ref32, ref, "grad." + p.hf_name, g, tag);
      checked++;
    }
  }
  const std::vector<float> losses = read_all(ref, "losses");
  const int steps = (int)losses.size();
  // logits, loss, ce_loss, aux_loss, losses, grad. and step<n>. per parameter (input_ids, labels and the
  // routing record in the fp32 file)
  int extra = 0;
  for (const std::string& n : names_of(ref)) extra += n.rfind("router_", 0) == 0 || n == "input_ids" || n == "labels";
  EXPECT_EQ((size_t)(5 + extra + 2 * checked), ref.tensors().size()) << tag << ": every fixture gradient compared";

  AdamWConfig oc;
  oc.weight_decay = llmt_test::kFixtureWeightDecay;
  for (int step = 0; step < steps; step++) {
    store.zero_grads();
    model.forward(store, batch.ids.data(), batch.targets.data(), 0, loss.tensor(), &pass);
    const double l = loss_mean() + read_f64(be, model.router_aux_loss());
    EXPECT_NEAR(l, losses[step], lim.loss * losses[step]) << tag << " loss before step " << step;
    model.backward(store);
    store.optimizer_step(kMoeLr, oc, 1.0f);
  }
  const std::string after = "step" + std::to_string(steps) + ".";
  for (size_t u = 0; u < L.units.size(); u++) {
    std::vector<float> unit((size_t)L.units[u].numel);
    store.get_unit((int)u, unit.data());
    for (const ParamSpec& p : L.units[u].params) {
      std::vector<float> w = hf_view(unit.data(), p), want = read_all(ref, after + p.hf_name),
                         g0 = read_all(ref, "grad." + p.hf_name);
      EXPECT_EQ(tol::check_adam_params(w.data(), want.data(), g0.data(), p.numel(), bf16 ? tol::kBf16MoeGrad : lim.grad,
                                       kMoeLr, steps, lim.unit),
                "")
          << tag << " after " << steps << " steps: " << p.hf_name;
    }
  }
}

}  // namespace

// Mixtral: 4 experts top-2, softmax then the top 2 renormalised
TEST(MoeReference, MixtralTiny) { check_moe_model("mixtral_tiny", DType::f32); }
TEST(MoeReference, MixtralTinyBf16) { check_moe_model("mixtral_tiny", DType::bf16); }
// the load-balancing loss over both layers, coefficient 0.1
TEST(MoeReference, MixtralAuxTiny) { check_moe_model("mixtral_aux_tiny", DType::f32); }
TEST(MoeReference, MixtralAuxTinyBf16) { check_moe_model("mixtral_aux_tiny", DType::bf16); }
// layer 0's router all zero: every token to the same two experts by torch.topk's tie rule, two experts
// with no token, the aux loss over the tied layer
TEST(MoeReference, MixtralTiesTiny) { check_moe_model("mixtral_ties_tiny", DType::f32); }
TEST(MoeReference, MixtralTiesTinyBf16) { check_moe_model("mixtral_ties_tiny", DType::bf16); }
// Qwen3-MoE: norm_topk_prob, q/k norms, head_dim apart, a dense layer between two MoE ones
TEST(MoeReference, Qwen3MoeTiny) { check_moe_model("qwen3_moe_tiny", DType::f32); }
TEST(MoeReference, Qwen3MoeTinyBf16) { check_moe_model("qwen3_moe_tiny", DType::bf16); }
// decoder_sparse_step 2 (layer 0 dense), no renormalisation, the aux loss over the MoE layer's tokens only
TEST(MoeReference, Qwen3MoeStepTiny) { check_moe_model("qwen3_moe_step_tiny", DType::f32); }
TEST(MoeReference, Qwen3MoeStepTinyBf16) { check_moe_model("qwen3_moe_step_tiny", DType::bf16); }
// Qwen2-MoE: the shared expert and its sigmoid gate, q/k/v biases
TEST(MoeReference, Qwen2MoeTiny) { check_moe_model("qwen2_moe_tiny", DType::f32); }
TEST(MoeReference, Qwen2MoeTinyBf16) { check_moe_model("qwen2_moe_tiny", DType::bf16); }

// The load-balancing loss of a model trained without it equals transformers' (the fixture records
// load_balancing_loss_func's value whatever the config says): turned on with a coefficient of 1.
TEST(MoeReference, AuxLossValueOfEveryFixture) {
  for (const char* name : {"mixtral_tiny", "qwen3_moe_tiny", "qwen2_moe_tiny"}) {
    SafetensorsFile ref(dir_of(name) + "/reference.safetensors");
    const llmt_test::HfBatch batch = llmt_test::read_hf_batch(ref);
    ModelConfig cfg = config_from_json_file(dir_of(name) + "/config.json");
    cfg.moe.output_router_logits = true;
    cfg.moe.aux_loss_coef = 1.0f;
    auto m = load(name, DType::f32, batch.B, batch.T, &cfg);
    BackendBuffer loss(*m->be, DType::f64, {1});
    m->model->forward(*m->store, batch.ids.data(), batch.targets.data(), 0, loss.tensor());
    const double want = read_all(ref, "aux_loss")[0];
    EXPECT_NEAR(read_f64(*m->be, m->model->router_aux_loss()), want, 1e-5 * want) << name;
  }
}

// Greedy generation equals transformers' generate(do_sample=False): alone, left-padded in a batch,
// stopped by an EOS (make_moe_fixtures.py's generate.json).
TEST(MoeReference, GreedyIdsEqualTransformers) {
  using IdRows = std::vector<std::vector<int32_t>>;
  for (const char* name : {"mixtral_tiny", "qwen3_moe_tiny", "qwen2_moe_tiny"}) {
    SCOPED_TRACE(name);
    std::ifstream f(dir_of(name) + "/generate.json");
    ASSERT_TRUE(f.good());
    const nlohmann::json ref = nlohmann::json::parse(f);
    ASSERT_GT(ref["min_margin"].get<double>(), 1e-4) << "the reference is within fp32 noise of a tie";
    const IdRows prompts = ref["prompts"].get<IdRows>();
    GenerateOptions o;
    o.max_new_tokens = ref["max_new_tokens"].get<int>();
    o.pad_id = ref["pad_token_id"].get<int>();
    auto run = [&](const IdRows& p, const GenerateOptions& opt) {
      size_t longest = 0;
      for (const auto& r : p) longest = std::max(longest, r.size());
      auto m = load(name, DType::f32, (int)p.size(), (int)longest);
      IdRows out;
      for (const Generated& g : generate(*m->model, *m->store, p, opt)) out.push_back(g.ids);
      return out;
    };
    const IdRows alone = ref["alone"].get<IdRows>();
    for (size_t i = 0; i < prompts.size(); i++) EXPECT_EQ(run({prompts[i]}, o)[0], alone[i]) << "prompt " << i;
    EXPECT_EQ(run(prompts, o), ref["batched"].get<IdRows>()) << "the batch, left-padded";
    GenerateOptions stop = o;
    stop.eos_ids = {ref["eos"]["eos_token_id"].get<int32_t>()};
    EXPECT_EQ(run(prompts, stop), ref["eos"]["ids"].get<IdRows>()) << "with an EOS";
  }
}

// Checkpointing recomputes each block's forward in backward: the same gradients (bitwise: the same ops
// in the same order) and the aux loss's sums taken once.
TEST(MoeReference, CheckpointingGivesTheSameGradients) {
  const std::string name = "mixtral_aux_tiny";
  SafetensorsFile ref(dir_of(name) + "/reference.safetensors");
  const llmt_test::HfBatch batch = llmt_test::read_hf_batch(ref);
  std::vector<std::vector<float>> grads[2];
  double aux[2];
  for (int ck = 0; ck < 2; ck++) {
    auto m = load(name, DType::f32, batch.B, batch.T);
    Transformer model(m->cfg, *m->be, batch.B, batch.T, ck == 1);
    BackendBuffer loss(*m->be, DType::f64, {1});
    TrainPass pass;
    pass.grad_scale = 1.0f / batch.n_valid;
    m->store->zero_grads();
    model.forward(*m->store, batch.ids.data(), batch.targets.data(), 0, loss.tensor(), &pass);
    aux[ck] = read_f64(*m->be, model.router_aux_loss());
    model.backward(*m->store);
    for (size_t u = 0; u < model.layout().units.size(); u++)
      grads[ck].push_back(to_host(*m->be, m->store->shard_state((int)u).grad));
  }
  EXPECT_EQ(aux[0], aux[1]);
  EXPECT_EQ(grads[0], grads[1]);
}

// ---- config.json, names, presets ----

TEST(MoeConfig, FixturesReadAsTheirFamilies) {
  ModelConfig mx = config_from_json_file(dir_of("mixtral_tiny") + "/config.json");
  EXPECT_EQ(mx.model_type, "mixtral");
  EXPECT_EQ(mx.moe.n_experts, 4);
  EXPECT_EQ(mx.moe.top_k, 2);
  EXPECT_EQ(mx.moe.d_ff_expert, 20);
  EXPECT_TRUE(mx.moe.norm_topk);
  EXPECT_FALSE(mx.moe.round_weights);
  EXPECT_EQ(mx.moe_layers(), 2);
  EXPECT_EQ(mx.decoder_layer_class(), "MixtralDecoderLayer");
  ModelConfig q3 = config_from_json_file(dir_of("qwen3_moe_tiny") + "/config.json");
  EXPECT_EQ(q3.model_type, "qwen3_moe");
  EXPECT_TRUE(q3.family.qk_norm);
  EXPECT_EQ(q3.head_size(), 16);
  EXPECT_EQ(q3.moe.n_experts, 8);  // saved as num_local_experts by transformers 5.25
  EXPECT_TRUE(q3.moe.norm_topk);
  EXPECT_TRUE(q3.moe.round_weights);
  EXPECT_TRUE(q3.moe_layer(0) && !q3.moe_layer(1) && q3.moe_layer(2));  // mlp_only_layers [1]
  ModelConfig step = config_from_json_file(dir_of("qwen3_moe_step_tiny") + "/config.json");
  EXPECT_TRUE(!step.moe_layer(0) && step.moe_layer(1));  // decoder_sparse_step 2
  EXPECT_TRUE(step.moe.output_router_logits);
  EXPECT_FLOAT_EQ(step.moe.aux_loss_coef, 0.1f);
  ModelConfig q2 = config_from_json_file(dir_of("qwen2_moe_tiny") + "/config.json");
  EXPECT_EQ(q2.moe.d_ff_shared, 20);
  EXPECT_TRUE(q2.qkv_bias && !q2.o_bias);
  EXPECT_FALSE(q2.moe.norm_topk);
}

// llmt's config.json for each family reads back as the same model, and carries the fields
// transformers' config classes read
TEST(MoeConfig, HfJsonRoundTrips) {
  for (const char* name : {"mixtral_aux_tiny", "qwen3_moe_tiny", "qwen3_moe_step_tiny", "qwen2_moe_tiny"}) {
    const ModelConfig c = config_from_json_file(dir_of(name) + "/config.json");
    const nlohmann::json j = config_to_hf_json(c);
    const ModelConfig back = config_from_json(j, name);
    EXPECT_EQ(config_to_hf_json(back), j) << name;
    EXPECT_EQ(back.moe.n_experts, c.moe.n_experts) << name;
    EXPECT_EQ(back.moe.mlp_only_layers, c.moe.mlp_only_layers) << name;
    EXPECT_EQ(back.moe.output_router_logits, c.moe.output_router_logits) << name;
    EXPECT_EQ(back.head_size(), c.head_size()) << name;
    EXPECT_EQ(j["architectures"][0], c.model_type == "mixtral" ? "MixtralForCausalLM"
                                     : c.model_type == "qwen2_moe" ? "Qwen2MoeForCausalLM"
                                                                   : "Qwen3MoeForCausalLM");
  }
}

// The layout's names are exactly the Hub's (save_pretrained's per-expert tensors), and an export
// writes every tensor back bitwise under them
TEST(MoeConfig, ExportWritesTheHubsPerExpertTensors) {
  for (const char* name : {"mixtral_tiny", "qwen3_moe_tiny", "qwen2_moe_tiny"}) {
    const ModelConfig c = config_from_json_file(dir_of(name) + "/config.json");
    const ModelLayout L = make_layout(c);
    SafetensorsCheckpoint ckpt(dir_of(name));
    check_hf_tensors(ckpt, c, L, dir_of(name));  // every tensor of the file and only those
    std::vector<std::vector<float>> units;
    std::vector<const float*> ptrs;
    for (size_t u = 0; u < L.units.size(); u++) {
      units.emplace_back((size_t)L.units[u].numel);
      load_hf_unit(ckpt, c, L, (int)u, units.back().data());
    }
    for (auto& u : units) ptrs.push_back(u.data());
    llmt_test::TempDir tmp("moe_export");
    const std::string out = tmp.path + "/model";
    save_hf_model(out, c, L, ptrs, "F32");
    SafetensorsFile a(dir_of(name) + "/model.safetensors"), b(out + "/model.safetensors");
    EXPECT_EQ(names_of(a), names_of(b)) << name;
    for (const std::string& n : names_of(a)) EXPECT_EQ(read_all(a, n), read_all(b, n)) << name << " " << n;
    const ModelConfig back = config_from_json_file(out + "/config.json");
    EXPECT_EQ(config_to_hf_json(back), config_to_hf_json(c)) << name;
  }
}

// Mixtral 8x7B and Qwen3-30B-A3B: the parameter counts of their published checkpoints
TEST(MoeConfig, PresetsHaveThePublishedSizes) {
  const ModelConfig mx = config_from_preset("mixtral-8x7b");
  validate_config(mx, "mixtral-8x7b");
  EXPECT_EQ(make_layout(mx).total_numel, 46702792704LL);  // "46.7B total parameters"
  const ModelConfig q3 = config_from_preset("qwen3-30b-a3b");
  validate_config(q3, "qwen3-30b-a3b");
  const ModelLayout L = make_layout(q3);
  EXPECT_EQ(L.total_numel, 30532122624LL);  // "30.5B total, 3.3B activated"
  // active: embeddings apart, attention, routers and 8 of 128 experts; what FLOPs count (lm_head once)
  const int64_t active = L.matmul_numel + 151936LL * 2048;  // + the input embedding
  EXPECT_NEAR((double)active, 3.3e9, 0.1e9);  // 3.35e9 by this count
  // the config.json the presets write names their classes
  EXPECT_EQ(config_to_hf_json(mx)["architectures"][0], "MixtralForCausalLM");
  EXPECT_EQ(config_to_hf_json(q3)["num_experts"], 128);
}

TEST(MoeConfig, RefusesWhatItDoesNotComputeByName) {
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir_of("mixtral_tiny") + "/config.json"));
  nlohmann::json jitter = j;
  jitter["router_jitter_noise"] = 0.01;
  llmt_test::expect_error([&] { config_from_json(jitter, "x.json"); }, {"x.json", "router_jitter_noise"});
  for (const char* type : {"deepseek_v3", "gpt_oss", "llama4_text", "olmoe"}) {
    nlohmann::json other = j;
    other["model_type"] = type;
    llmt_test::expect_error([&] { config_from_json(other, "x.json"); }, {"x.json", type, "mixture of experts"});
  }
  nlohmann::json q = nlohmann::json::parse(std::ifstream(dir_of("qwen3_moe_tiny") + "/config.json"));
  q["use_sliding_window"] = true;
  q["sliding_window"] = 8;
  llmt_test::expect_error([&] { config_from_json(q, "q.json"); }, {"q.json", "use_sliding_window"});
  nlohmann::json k = q;
  k["use_sliding_window"] = false;
  k["num_experts_per_tok"] = 9;
  llmt_test::expect_error([&] { config_from_json(k, "q.json"); }, {"q.json", "num_experts_per_tok"});
  LoraConfig lc;
  lc.r = 4, lc.alpha = 8;
  lc.target_modules = {"q_proj"};
  llmt_test::expect_error([&] { resolve_lora_config(lc, config_from_json(j, "x")); }, {"mixture-of-experts"});
}
