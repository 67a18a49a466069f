#include "models/moe.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "engine/core/error.h"
#include "engine/core/json_text.h"

namespace llmt {

// ---------------------------------------------------------------- config.json

namespace {

bool has(const nlohmann::json& j, const char* key) { return j.contains(key) && !j.at(key).is_null(); }

int read_int(const nlohmann::json& j, const char* key, int fallback, const std::string& source) {
  if (!has(j, key)) return fallback;
  const nlohmann::json& v = j.at(key);
  LLMT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= (1 << 30),
             "%s: \"%s\" must be a non-negative integer, got %s", source.c_str(), key, clip_for_message(v.dump()).c_str());
  return v.get<int>();
}
bool read_bool(const nlohmann::json& j, const char* key, bool fallback, const std::string& source) {
  if (!has(j, key)) return fallback;
  LLMT_CHECK(j.at(key).is_boolean(), "%s: \"%s\" must be true or false, got %s", source.c_str(), key,
             clip_for_message(j.at(key).dump()).c_str());
  return j.at(key).get<bool>();
}
float read_float(const nlohmann::json& j, const char* key, float fallback, const std::string& source) {
  if (!has(j, key)) return fallback;
  const nlohmann::json& v = j.at(key);
  LLMT_CHECK(v.is_number() && std::isfinite(v.get<double>()) && std::fabs(v.get<double>()) < 1e30,
             "%s: \"%s\" must be a finite number, got %s", source.c_str(), key, clip_for_message(v.dump()).c_str());
  return (float)v.get<double>();
}

// Mixtral's num_local_experts (Qwen3MoeConfig saves that name too; Qwen2MoeConfig and the Hub's Qwen
// files say num_experts): both names are the same field where the config class maps one onto the other
int read_experts(const nlohmann::json& j, const std::string& type, int fallback, const std::string& source) {
  const bool local = has(j, "num_local_experts"), plain = has(j, "num_experts");
  if (type == "qwen2_moe") return read_int(j, "num_experts", fallback, source);  // no alias there
  const int a = read_int(j, "num_local_experts", fallback, source), b = read_int(j, "num_experts", fallback, source);
  LLMT_CHECK(!(local && plain) || a == b, "%s: num_local_experts %d and num_experts %d name one field and disagree",
             source.c_str(), a, b);
  return local ? a : b;
}

}  // namespace

std::string moe_dense_relative(const std::string& t) {
  if (t == "mixtral") return "mistral";
  if (t == "qwen2_moe") return "qwen2";
  if (t == "qwen3_moe") return "qwen3";
  return t;
}

bool is_moe_model_type(const std::string& t) { return t == "mixtral" || t == "qwen2_moe" || t == "qwen3_moe"; }

void read_moe_config(const nlohmann::json& j, const std::string& source, const std::string& type, ModelConfig& c) {
  MoeConfig& m = c.moe;
  m = MoeConfig();
  m.output_router_logits = read_bool(j, "output_router_logits", false, source);
  m.aux_loss_coef = read_float(j, "router_aux_loss_coef", 0.001f, source);
  if (type == "mixtral") {
    // MixtralSparseMoeBlock: softmax over every expert, the top k renormalised, kept fp32
    m.n_experts = read_experts(j, type, 8, source);
    m.top_k = read_int(j, "num_experts_per_tok", 2, source);
    m.d_ff_expert = c.d_ff;
    m.norm_topk = true;
    const float jitter = read_float(j, "router_jitter_noise", 0.0f, source);
    LLMT_CHECK(jitter == 0.0f, "%s: \"router_jitter_noise\": %g is not supported: transformers multiplies the MoE "
               "block's input by uniform noise in [1 - %g, 1 + %g] in training; llmt routes without noise",
               source.c_str(), jitter, jitter, jitter);
    return;
  }
  LLMT_CHECK(type == "qwen2_moe" || type == "qwen3_moe", "read_moe_config: %s is not an MoE family llmt reads",
             type.c_str());
  // Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock: softmax, top k, renormalised with norm_topk_prob,
  // then cast to the logits' dtype; the layers from decoder_sparse_step and mlp_only_layers
  const bool q2 = type == "qwen2_moe";
  m.n_experts = read_experts(j, type, q2 ? 60 : 128, source);
  m.top_k = read_int(j, "num_experts_per_tok", q2 ? 4 : 8, source);
  m.d_ff_expert = read_int(j, "moe_intermediate_size", q2 ? 1408 : 768, source);
  if (q2) m.d_ff_shared = read_int(j, "shared_expert_intermediate_size", 5632, source);
  m.norm_topk = read_bool(j, "norm_topk_prob", false, source);
  m.round_weights = true;
  m.sparse_step = read_int(j, "decoder_sparse_step", 1, source);
  if (has(j, "mlp_only_layers")) {
    const nlohmann::json& list = j.at("mlp_only_layers");
    LLMT_CHECK(list.is_array(), "%s: \"mlp_only_layers\" must be a list of layer indices, got %s", source.c_str(),
               clip_for_message(list.dump()).c_str());
    for (size_t i = 0; i < list.size(); i++) {
      LLMT_CHECK(list[i].is_number_integer(), "%s: mlp_only_layers[%zu] must be a layer index, got %s", source.c_str(),
                 i, clip_for_message(list[i].dump()).c_str());
      m.mlp_only_layers.push_back(list[i].get<int>());
    }
  }
  // Qwen3-MoE's window would be every layer's and Qwen2-MoE's its own alternating rule: neither is done
  LLMT_CHECK(!read_bool(j, "use_sliding_window", false, source), "%s: \"use_sliding_window\": true is not "
             "supported for %s: llmt trains its MoE layers with full causal attention", source.c_str(), type.c_str());
}

void refuse_other_moe(const std::string& type, const std::string& source) {
  static const std::map<std::string, const char*> why = {
      {"deepseek_v2", "DeepSeek's multi-head latent attention (MLA), grouped routing (n_group, topk_group), "
                      "routed_scaling_factor and shared experts"},
      {"deepseek_v3", "DeepSeek-V3's multi-head latent attention (MLA), sigmoid scores with "
                      "e_score_correction_bias, grouped routing (n_group, topk_group), routed_scaling_factor and "
                      "shared experts"},
      {"deepseek_v32", "DeepSeek-V3.2's sparse attention, MLA and grouped sigmoid routing"},
      {"kimi_k2", "DeepSeek-V3's MLA and grouped sigmoid routing"},
      {"gpt_oss", "gpt-oss's attention sinks, clamped SwiGLU with expert biases, softmax over the chosen experts "
                  "only and alternating sliding-window layers"},
      {"llama4", "Llama 4's sigmoid top-1 router with a shared expert, chunked attention and NoPE layers"},
      {"llama4_text", "Llama 4's sigmoid top-1 router with a shared expert, chunked attention and NoPE layers"},
      {"olmoe", "OLMoE's q/k norms over the whole projection (not per head)"},
      {"flex_olmo", "FlexOlmo's q/k norms over the whole projection and post-norms"},
      {"phimoe", "PhiMoE's sparsemixer routing"},
      {"dbrx", "DBRX's clip_qkv and fused expert layout"},
      {"jamba", "Jamba's Mamba layers"},
      {"granitemoe", "Granite MoE's embedding, residual, attention and logit multipliers"},
      {"granitemoeshared", "Granite MoE's multipliers and shared experts"},
      {"granitemoehybrid", "Granite 4's Mamba layers"},
      {"jetmoe", "JetMoE's mixture of attention heads"},
      {"qwen3_next", "Qwen3-Next's gated delta-net layers and gated attention"},
      {"qwen3_5_moe", "Qwen3.5's gated delta-net layers"},
      {"glm4_moe", "GLM-4.5's sigmoid routing with e_score_correction_bias, grouped top-k and routed_scaling_factor"},
      {"ernie4_5_moe", "ERNIE 4.5's routing with e_score_correction_bias"},
      {"minimax", "MiniMax's lightning attention"},
      {"hunyuan_v1_moe", "Hunyuan's cross-layer attention and routing"},
      {"dots1", "dots.llm1's grouped sigmoid routing"},
      {"switch_transformers", "an encoder-decoder"},
      {"nllb_moe", "an encoder-decoder"},
  };
  auto it = why.find(type);
  if (it == why.end()) return;
  fail("%s: model_type \"%s\" is a mixture of experts llmt does not train: %s are not implemented (llmt trains "
       "mixtral, qwen2_moe and qwen3_moe)", source.c_str(), type.c_str(), it->second);
}

void moe_to_hf_json(const ModelConfig& c, nlohmann::json& j) {
  const MoeConfig& m = c.moe;
  if (c.model_type == "mixtral") {
    j["architectures"] = {"MixtralForCausalLM"};
    j["num_local_experts"] = m.n_experts;
    j["router_jitter_noise"] = 0.0;
    j.erase("attention_bias");
    j.erase("mlp_bias");
  } else {
    j["architectures"] = {c.model_type == "qwen2_moe" ? "Qwen2MoeForCausalLM" : "Qwen3MoeForCausalLM"};
    j["num_experts"] = m.n_experts;
    j["moe_intermediate_size"] = m.d_ff_expert;
    j["norm_topk_prob"] = m.norm_topk;
    j["decoder_sparse_step"] = m.sparse_step;
    j["mlp_only_layers"] = m.mlp_only_layers;
    if (c.model_type == "qwen2_moe") {
      j["shared_expert_intermediate_size"] = m.d_ff_shared;
      j["qkv_bias"] = c.qkv_bias;
    }
  }
  j["model_type"] = c.model_type;
  j["num_experts_per_tok"] = m.top_k;
  j["output_router_logits"] = m.output_router_logits;
  j["router_aux_loss_coef"] = m.aux_loss_coef;
}

bool ModelConfig::moe_layer(int l) const {
  if (!moe.active()) return false;
  if (std::find(moe.mlp_only_layers.begin(), moe.mlp_only_layers.end(), l) != moe.mlp_only_layers.end()) return false;
  return (l + 1) % moe.sparse_step == 0;
}

int ModelConfig::moe_layers() const {
  int n = 0;
  for (int l = 0; l < n_layer; l++) n += moe_layer(l);
  return n;
}

void validate_moe_config(const ModelConfig& c, const std::string& source) {
  const MoeConfig& m = c.moe;
  if (!m.active()) return;
  LLMT_CHECK(c.arch == Arch::llama && c.family.mlp == MlpKind::swiglu && !c.mlp_bias,
             "%s: llmt's experts are SwiGLU without biases (a LLaMA-architecture model)", source.c_str());
  LLMT_CHECK(m.top_k >= 1 && m.top_k <= m.n_experts, "%s: num_experts_per_tok %d must lie in [1, %d experts]",
             source.c_str(), m.top_k, m.n_experts);
  LLMT_CHECK(m.d_ff_expert > 0, "%s: the experts' intermediate size must be positive, got %d", source.c_str(),
             m.d_ff_expert);
  LLMT_CHECK(m.d_ff_shared >= 0, "%s: shared_expert_intermediate_size %d", source.c_str(), m.d_ff_shared);
  LLMT_CHECK(m.sparse_step >= 1, "%s: decoder_sparse_step %d must be at least 1", source.c_str(), m.sparse_step);
  for (int l : m.mlp_only_layers)
    LLMT_CHECK(l >= 0 && l < c.n_layer, "%s: mlp_only_layers names layer %d of %d", source.c_str(), l, c.n_layer);
  LLMT_CHECK(std::isfinite(m.aux_loss_coef) && m.aux_loss_coef >= 0.0f, "%s: router_aux_loss_coef %g must be a "
             "non-negative number", source.c_str(), m.aux_loss_coef);
  // the experts' size before anything is laid out (validate_config bounds the dense part)
  const double experts = (double)c.moe_layers() * m.n_experts * 3.0 * c.d_model * m.d_ff_expert;
  LLMT_CHECK(experts <= 1e13, "%s: %.3g expert parameters (%d experts of %d x %d, %d MoE layers): beyond any model "
             "llmt can train; check the sizes", source.c_str(), experts, m.n_experts, c.d_model, m.d_ff_expert,
             c.moe_layers());
}

// mistralai/Mixtral-8x7B-v0.1's config.json: MixtralForCausalLM, hidden 4096, 32 layers, 32 heads over
// 8 kv heads, 8 experts of intermediate 14336, top 2, vocabulary 32000, rope_theta 1e6, rms eps 1e-5,
// context 32768, no sliding window, untied, router_aux_loss_coef 0.02; bos 1, eos 2.
// 46,702,792,704 parameters (12.9B active).
ModelConfig mixtral_8x7b() {
  ModelConfig c = base_config(Arch::llama);
  c.model_type = "mixtral";
  c.vocab_size = 32000;
  c.max_seq_len = 32768;
  c.n_layer = 32, c.n_head = 32, c.n_kv_head = 8;
  c.d_model = 4096, c.d_ff = 14336;
  c.norm_eps = 1e-5f;
  c.rope_theta = 1000000.0f;
  c.tied_embeddings = false;
  c.bos_token_id = 1, c.eos_token_ids = {2};
  c.moe.n_experts = 8, c.moe.top_k = 2, c.moe.d_ff_expert = 14336;
  c.moe.norm_topk = true;
  c.moe.aux_loss_coef = 0.02f;
  return c;
}

// Qwen/Qwen3-30B-A3B's config.json: Qwen3MoeForCausalLM, hidden 2048, 48 layers, 32 heads over 4 kv
// heads of head_dim 128, q/k norms, 128 experts of moe_intermediate_size 768, top 8, norm_topk_prob,
// every layer MoE, vocabulary 151936, rope_theta 1e6, rms eps 1e-6, context 40960, untied,
// router_aux_loss_coef 0.001; bos 151643, eos 151645. 30,532,122,624 parameters (3.3B active).
ModelConfig qwen3_30b_a3b() {
  ModelConfig c = base_config(Arch::llama);
  c.model_type = "qwen3_moe";
  c.family.qk_norm = true;
  c.vocab_size = 151936;
  c.max_seq_len = 40960;
  c.n_layer = 48, c.n_head = 32, c.n_kv_head = 4, c.head_dim = 128;
  c.d_model = 2048, c.d_ff = 6144;
  c.norm_eps = 1e-6f;
  c.rope_theta = 1000000.0f;
  c.tied_embeddings = false;
  c.bos_token_id = 151643, c.eos_token_ids = {151645};
  c.moe.n_experts = 128, c.moe.top_k = 8, c.moe.d_ff_expert = 768;
  c.moe.norm_topk = true;
  c.moe.round_weights = true;
  c.moe.aux_loss_coef = 0.001f;
  return c;
}

// ---------------------------------------------------------------- parameters

MoeOffsets add_moe_params(UnitLayout& u, const ModelConfig& c, int l) {
  const MoeConfig& m = c.moe;
  const int64_t C = c.d_model, I = m.d_ff_expert, Is = m.d_ff_shared;
  const bool mixtral = c.model_type == "mixtral";
  // the Hub's names: Mixtral's block_sparse_moe.experts.e.w1 (gate), w3 (up), w2 (down); Qwen's
  // mlp.experts.e.gate_proj, up_proj, down_proj
  const std::string p = "model.layers." + std::to_string(l) + (mixtral ? ".block_sparse_moe." : ".mlp.");
  auto expert = [&](int e, const char* qwen, const char* mix) {
    return p + "experts." + std::to_string(e) + "." + (mixtral ? mix : qwen) + ".weight";
  };
  MoeOffsets o;
  o.router_w = u.add(p + "gate.weight", {m.n_experts, C}, true);
  for (int e = 0; e < m.n_experts; e++) {  // each expert's [gate | up], one aligned matrix after another
    const int64_t at = u.add(expert(e, "gate_proj", "w1"), {I, C}, true);
    u.extend(expert(e, "up_proj", "w3"), {I, C}, true);
    if (e == 0) o.mlp_in_w = at;
    if (e == 1) o.in_stride = at - o.mlp_in_w;
  }
  for (int e = 0; e < m.n_experts; e++) {
    const int64_t at = u.add(expert(e, "down_proj", "w2"), {C, I}, true);
    if (e == 0) o.mlp_out_w = at;
    if (e == 1) o.out_stride = at - o.mlp_out_w;
  }
  if (m.n_experts == 1) o.in_stride = 2 * I * C, o.out_stride = C * I;
  if (Is > 0) {
    o.shared_in_w = u.add(p + "shared_expert.gate_proj.weight", {Is, C}, true);
    u.extend(p + "shared_expert.up_proj.weight", {Is, C}, true);
    o.shared_out_w = u.add(p + "shared_expert.down_proj.weight", {C, Is}, true);
    o.shared_gate_w = u.add(p + "shared_expert_gate.weight", {1, C}, true);
  }
  return o;
}

int64_t moe_inactive_numel(const ModelConfig& c) {
  const MoeConfig& m = c.moe;
  return (int64_t)c.moe_layers() * (m.n_experts - m.top_k) * 3 * (int64_t)c.d_model * m.d_ff_expert;
}

// ---------------------------------------------------------------- compute

void MoeBlocks::walk(const ModelConfig& c, int B, int T, bool checkpointing, DType dt, const Take& t, MoeBlocks* mb) {
  if (!c.moe.active() || c.moe_layers() == 0) return;
  const MoeConfig& m = c.moe;
  const int64_t N = (int64_t)B * T, E = m.n_experts, k = m.top_k, P = N * k, C = c.d_model, I = m.d_ff_expert,
                Is = m.d_ff_shared;
  const DType f32 = DType::f32, i32 = DType::i32;
  std::vector<MoeActs> acts;
  for (int l = 0; l < (checkpointing ? 1 : c.n_layer); l++) {
    MoeActs a;
    if (checkpointing || c.moe_layer(l)) {
      a.probs = t("moe router probabilities", f32, {N, E});
      a.topk_idx = t("moe chosen experts", i32, {N, k});
      a.topk_w = t("moe routing weights", f32, {N, k});
      a.offsets = t("moe expert offsets", i32, {E + 1});
      a.pos = t("moe grouped rows", i32, {P});
      a.h = t("moe experts' gate|up", dt, {P, 2 * I});
      a.a = t("moe experts' activation", dt, {P, I});
      a.y = t("moe experts' out", dt, {P, C});
      if (Is > 0) {
        a.sh_in = t("moe shared expert's gate|up", dt, {N, 2 * Is});
        a.sh_act = t("moe shared expert's activation", dt, {N, Is});
        a.sh_out = t("moe shared expert's out", dt, {N, C});
        a.sh_gate = t("moe shared expert's gate", dt, {N});
      }
    }
    acts.push_back(a);
  }
  // scratch: the router's logits and their gradient, the grouped rows (x's, then dy, then dxg), the
  // experts' gradients, the shared expert's
  Tensor logits = t("moe router logits", dt, {N, E}), rows = t("moe grouped rows scratch", dt, {P, C}),
         dh = t("moe grad experts' gate|up", dt, {P, 2 * I}), da = t("moe grad experts' activation", dt, {P, I}),
         dlogits = t("moe grad router logits", dt, {N, E}), dtopk_w = t("moe grad routing weights", f32, {N, k});
  Tensor dsh_out, dsh_in, dsh_act, dgate;
  if (Is > 0) {
    dsh_out = t("moe grad shared expert's out", dt, {N, C});
    dsh_in = t("moe grad shared expert's gate|up", dt, {N, 2 * Is});
    dsh_act = t("moe grad shared expert's activation", dt, {N, Is});
    dgate = t("moe grad shared expert's gate", dt, {N});
  }
  Tensor stats = t("moe aux loss sums", f32, {2 * E}), aux_grad = t("moe aux loss gradient", f32, {E}),
         aux_loss = t("moe aux loss", DType::f64, {1});
  if (!mb) return;
  mb->checkpointing_ = checkpointing;
  mb->acts_ = acts;
  mb->logits_ = logits, mb->rows_ = rows, mb->dh_ = dh, mb->da_ = da, mb->dlogits_ = dlogits, mb->dtopk_w_ = dtopk_w;
  mb->dsh_out_ = dsh_out, mb->dsh_in_ = dsh_in, mb->dsh_act_ = dsh_act, mb->dgate_ = dgate;
  mb->stats_ = stats, mb->aux_grad_ = aux_grad, mb->aux_loss_ = aux_loss;
}

namespace {
// [n, cols] at the start of buffer t (the current batch's rows)
Tensor rows_of(const Tensor& t, int64_t n, int64_t cols) { return Tensor(t.data, t.dtype, {n, cols}); }
Tensor P(const Tensor& unit, int64_t off, std::initializer_list<int64_t> dims) {
  return off < 0 || !unit.data ? Tensor() : unit.view(off, dims);
}
}  // namespace

void MoeBlocks::begin_pass(Backend& be, const ModelConfig& c, bool aux) {
  aux_on_ = aux && c.moe.output_router_logits && stats_.data;
  if (!aux_loss_.data) return;
  be.zero(aux_loss_.data, aux_loss_.nbytes());
  if (aux_on_) be.zero(stats_.data, stats_.nbytes());
}

void MoeBlocks::forward(Backend& be, const ModelConfig& c, const MoeOffsets& o, int l, Tensor w, Tensor x,
                        Tensor residual, Tensor out, int64_t N, bool recompute) {
  const MoeConfig& m = c.moe;
  const MoeActs& a = acts(l);
  const int E = m.n_experts, k = m.top_k, C = c.d_model, I = m.d_ff_expert, Is = m.d_ff_shared;
  const int64_t Pr = N * k;
  Tensor logits = rows_of(logits_, N, E), xg = rows_of(rows_, Pr, C);
  Tensor h = rows_of(a.h, Pr, 2 * I), act = rows_of(a.a, Pr, I), y = rows_of(a.y, Pr, C);
  be.matmul(logits, x, P(w, o.router_w, {E, C}), Tensor(), N, E, C, false, true, false);
  be.moe_route(a.topk_idx, a.topk_w, a.probs, aux_on_ && !recompute ? stats_ : Tensor(), logits, N, E, k, m.norm_topk,
               m.round_weights);
  be.moe_dispatch(a.offsets, a.pos, xg, x, a.topk_idx, N, E, k, C);
  be.moe_matmul(h, xg, w.view(o.mlp_in_w, {w.numel() - o.mlp_in_w}), a.offsets, Pr, E, 2 * I, C, o.in_stride, true);
  be.swiglu_forward(act, h, Pr, I, GluAct::silu);
  be.moe_matmul(y, act, w.view(o.mlp_out_w, {w.numel() - o.mlp_out_w}), a.offsets, Pr, E, C, I, o.out_stride, true);
  Tensor sh_out, sh_gate;
  if (Is > 0) {  // the shared expert, a SwiGLU MLP over every token, and its gate's logit
    Tensor sh_in = rows_of(a.sh_in, N, 2 * Is), sh_act = rows_of(a.sh_act, N, Is);
    sh_out = rows_of(a.sh_out, N, C), sh_gate = rows_of(a.sh_gate, N, 1);
    be.matmul(sh_in, x, P(w, o.shared_in_w, {2 * Is, C}), Tensor(), N, 2 * Is, C, false, true, false);
    be.swiglu_forward(sh_act, sh_in, N, Is, GluAct::silu);
    be.matmul(sh_out, sh_act, P(w, o.shared_out_w, {C, Is}), Tensor(), N, C, Is, false, true, false);
    be.matmul(sh_gate, x, P(w, o.shared_gate_w, {1, C}), Tensor(), N, 1, C, false, true, false);
  }
  be.moe_combine(out, residual, y, a.topk_w, a.pos, sh_out, sh_gate, N, k, C);
}

void MoeBlocks::finish_forward(Backend& be, const ModelConfig& c, int64_t N, float grad_scale) {
  if (!aux_on_) return;
  be.moe_aux_loss(aux_loss_, aux_grad_, stats_, c.moe.n_experts, (double)N * c.moe_layers(), c.moe.aux_loss_coef,
                  grad_scale);
}

void MoeBlocks::backward(Backend& be, const ModelConfig& c, const MoeOffsets& o, int l, Tensor w, Tensor g, Tensor x,
                         Tensor dout, Tensor dx, int64_t N) {
  const MoeConfig& m = c.moe;
  const MoeActs& a = acts(l);
  const int E = m.n_experts, k = m.top_k, C = c.d_model, I = m.d_ff_expert, Is = m.d_ff_shared;
  const int64_t Pr = N * k;
  const bool grads = g.data != nullptr;
  Tensor rows = rows_of(rows_, Pr, C), dh = rows_of(dh_, Pr, 2 * I), da = rows_of(da_, Pr, I);
  Tensor h = rows_of(a.h, Pr, 2 * I), act = rows_of(a.a, Pr, I), y = rows_of(a.y, Pr, C);
  Tensor dlogits = rows_of(dlogits_, N, E), dtopk_w = rows_of(dtopk_w_, N, k);
  Tensor w_in = w.view(o.mlp_in_w, {w.numel() - o.mlp_in_w}), w_out = w.view(o.mlp_out_w, {w.numel() - o.mlp_out_w});
  Tensor sh_out, sh_gate, dsh_out, dgate;
  if (Is > 0) {
    sh_out = rows_of(a.sh_out, N, C), sh_gate = rows_of(a.sh_gate, N, 1);
    dsh_out = rows_of(dsh_out_, N, C), dgate = rows_of(dgate_, N, 1);
  }
  // out = residual + sum_s w_s y_s (+ sigmoid(gate) shared): dy into the grouped rows' scratch
  be.moe_combine_backward(rows, dtopk_w, dsh_out, dgate, dout, y, a.topk_w, a.pos, sh_out, sh_gate, N, k, C);
  if (grads)
    be.moe_matmul_wgrad(g.view(o.mlp_out_w, {g.numel() - o.mlp_out_w}), rows, act, a.offsets, Pr, E, C, I,
                        o.out_stride);
  be.moe_matmul(da, rows, w_out, a.offsets, Pr, E, I, C, o.out_stride, false);
  be.swiglu_backward(dh, da, h, Pr, I, GluAct::silu);
  if (grads) {  // x's rows grouped again (not kept from forward), for the experts' input weights
    be.moe_dispatch(a.offsets, a.pos, rows, x, a.topk_idx, N, E, k, C);
    be.moe_matmul_wgrad(g.view(o.mlp_in_w, {g.numel() - o.mlp_in_w}), dh, rows, a.offsets, Pr, E, 2 * I, C,
                        o.in_stride);
  }
  be.moe_matmul(rows, dh, w_in, a.offsets, Pr, E, C, 2 * I, o.in_stride, false);  // dxg
  // the router: through the weights (and the aux loss's gradient) to its logits, then its matmul
  be.moe_route_backward(dlogits, dtopk_w, a.probs, a.topk_idx, aux_on_ ? aux_grad_ : Tensor(), N, E, k, m.norm_topk);
  if (grads) be.matmul(P(g, o.router_w, {E, C}), dlogits, x, Tensor(), E, C, N, true, false, true);
  be.matmul(dx, dlogits, P(w, o.router_w, {E, C}), Tensor(), N, C, E, false, false, false);
  be.moe_undispatch(dx, rows, a.pos, N, k, C);
  if (Is > 0) {
    Tensor sh_in = rows_of(a.sh_in, N, 2 * Is), sh_act = rows_of(a.sh_act, N, Is);
    Tensor dsh_in = rows_of(dsh_in_, N, 2 * Is), dsh_act = rows_of(dsh_act_, N, Is);
    if (grads) be.matmul(P(g, o.shared_gate_w, {1, C}), dgate, x, Tensor(), 1, C, N, true, false, true);
    be.matmul(dx, dgate, P(w, o.shared_gate_w, {1, C}), Tensor(), N, C, 1, false, false, true);
    if (grads) be.matmul(P(g, o.shared_out_w, {C, Is}), dsh_out, sh_act, Tensor(), C, Is, N, true, false, true);
    be.matmul(dsh_act, dsh_out, P(w, o.shared_out_w, {C, Is}), Tensor(), N, Is, C, false, false, false);
    be.swiglu_backward(dsh_in, dsh_act, sh_in, N, Is, GluAct::silu);
    if (grads) be.matmul(P(g, o.shared_in_w, {2 * Is, C}), dsh_in, x, Tensor(), 2 * Is, C, N, true, false, true);
    be.matmul(dx, dsh_in, P(w, o.shared_in_w, {2 * Is, C}), Tensor(), N, C, 2 * Is, false, false, true);
  }
}

}  // namespace llmt
