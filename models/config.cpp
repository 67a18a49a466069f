#include "models/config.h"

#include <sys/stat.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <fstream>
#include <sstream>
#include <map>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "models/moe.h"

namespace llmt {

namespace {

ModelConfig gpt2(int n_layer, int n_head, int d_model, int vocab = 50257, int ctx = 1024) {
  ModelConfig c = base_config(Arch::gpt2);
  c.vocab_size = vocab;
  c.max_seq_len = ctx;
  c.n_layer = n_layer;
  c.n_head = c.n_kv_head = n_head;
  c.d_model = d_model;
  c.d_ff = 4 * d_model;
  c.norm_eps = 1e-5f;
  c.tied_embeddings = true;
  if (vocab == 50257) c.bos_token_id = 50256, c.eos_token_ids = {50256};
  c.embd_pdrop = c.attn_pdrop = c.resid_pdrop = vocab == 50257 ? 0.1f : 0.0f;  // OpenAI's configs; none in our tiny ones
  return c;
}

ModelConfig llama(int n_layer, int n_head, int n_kv_head, int d_model, int d_ff, int ctx, float eps,
                  int vocab = 32000) {
  ModelConfig c = base_config(Arch::llama);
  c.vocab_size = vocab;
  c.max_seq_len = ctx;
  c.n_layer = n_layer;
  c.n_head = n_head;
  c.n_kv_head = n_kv_head;
  c.d_model = d_model;
  c.d_ff = d_ff;
  c.norm_eps = eps;
  c.rope_theta = 10000.0f;
  c.tied_embeddings = false;
  if (vocab == 32000) c.bos_token_id = 1, c.eos_token_ids = {2};
  return c;
}

// Llama 3.x: vocabulary 128256, rope_theta 500000, rms eps 1e-5, grouped-query attention with 8 kv
// heads; 3.1 and 3.2 add llama3 rope scaling over an original context of 8192.
ModelConfig llama3(int n_layer, int n_head, int d_model, int d_ff, bool tied, float rope_factor) {
  ModelConfig c = llama(n_layer, n_head, 8, d_model, d_ff, rope_factor > 0 ? 131072 : 8192, 1e-5f, 128256);
  c.rope_theta = 500000.0f;
  c.tied_embeddings = tied;
  c.bos_token_id = 128000;
  c.eos_token_ids = {128001};
  if (rope_factor > 0) {
    c.rope_scaling = "llama3";
    c.rope_factor = rope_factor;
    c.rope_low_freq_factor = 1.0f;
    c.rope_high_freq_factor = 4.0f;
    c.rope_original_max = 8192;
  }
  return c;
}

// Qwen3 (dense): vocabulary 151936, rope_theta 1000000, rms eps 1e-6, context 40960, head_dim
// given apart from the hidden size, q/k norms; bos 151643 (<|endoftext|>), eos 151645 (<|im_end|>).
ModelConfig qwen3(int n_layer, int n_head, int n_kv_head, int d_model, int d_ff, int head_dim, bool tied) {
  ModelConfig c = llama(n_layer, n_head, n_kv_head, d_model, d_ff, 40960, 1e-6f, 151936);
  c.model_type = "qwen3";
  c.family.qk_norm = true;
  c.head_dim = head_dim * n_head == d_model ? 0 : head_dim;
  c.rope_theta = 1000000.0f;
  c.tied_embeddings = tied;
  c.bos_token_id = 151643;
  c.eos_token_ids = {151645};
  return c;
}

// Phi-3-mini-4k: LLaMA's block with q|k|v and gate|up stored fused, vocabulary 32064, a sliding
// window of 2047 keys on every layer, untied; bos 1, eos 32000 (<|endoftext|>).
ModelConfig phi3_mini() {
  ModelConfig c = llama(32, 32, 32, 3072, 8192, 4096, 1e-5f, 32064);
  c.model_type = "phi3";
  c.family.fused_qkv_tensor = c.family.fused_gate_up_tensor = true;
  c.sliding_window = 2047;
  c.layer_window.assign((size_t)c.n_layer, c.sliding_window);
  c.bos_token_id = 1;
  c.eos_token_ids = {32000};
  return c;
}

// Phi-4-mini (-instruct): Phi-3's block with grouped-query attention (24 heads over 8 kv heads of
// 128), partial_rotary_factor 0.75 (96 of 128 channels rotate), vocabulary 200064, tied embeddings;
// bos and eos 199999. Its config.json reaches 131072 positions with longrope over an original 4096,
// whose 48-number factor sets the preset does not carry: the preset stays within the original 4096
// with plain RoPE (load the published config.json for the long context).
ModelConfig phi4_mini() {
  ModelConfig c = llama(32, 24, 8, 3072, 8192, 4096, 1e-5f, 200064);
  c.model_type = "phi3";
  c.family.fused_qkv_tensor = c.family.fused_gate_up_tensor = true;
  c.partial_rotary_factor = 0.75;
  c.tied_embeddings = true;
  c.bos_token_id = 199999;
  c.eos_token_ids = {199999};
  return c;
}

// Gemma's switches: GeGLU, RMSNorms of (1 + w), sandwich norms, embeddings times sqrt(hidden),
// tied; Gemma 3 adds q/k norms. The presets and gemma_from_json start from these.
void set_gemma_family(ModelConfig& c, const std::string& type) {
  c.model_type = type;
  c.family.mlp = MlpKind::geglu;
  c.family.norm_offset = 1.0f;
  c.family.sandwich_norms = c.family.scaled_embeddings = true;
  c.family.qk_norm = type == "gemma3_text";
  c.tied_embeddings = true;
}

// Gemma 3 1B (google/gemma-3-1b-pt's config.json): Gemma3ForCausalLM, hidden 1152, 26 layers, 4
// heads over 1 kv head of 256, intermediate 6912, vocabulary 262144, a window of 512 keys on five of
// every six layers (sliding_window_pattern 6) whose RoPE base is 10000, the full layers' 1000000
// unscaled, query_pre_attn_scalar 256, no soft-caps, context 32768, tied; bos 2, eos 1.
ModelConfig gemma3_1b() {
  ModelConfig c = llama(26, 4, 1, 1152, 6912, 32768, 1e-6f, 262144);
  set_gemma_family(c, "gemma3_text");
  c.head_dim = 256;
  c.rope_theta = 1000000.0f;
  c.rope_local_theta = 10000.0f;
  c.query_pre_attn_scalar = 256.0f;
  c.sliding_window = 512;
  for (int l = 0; l < c.n_layer; l++) c.layer_window.push_back((l + 1) % 6 ? c.sliding_window : 0);
  c.bos_token_id = 2;
  c.eos_token_ids = {1};
  return c;
}

// Gemma 2 2B (google/gemma-2-2b's config.json): Gemma2ForCausalLM, hidden 2304, 26 layers, 8 heads
// over 4 kv heads of 256, intermediate 9216, vocabulary 256000, windows of 4096 keys on the even
// layers (0, 2, ...), RoPE base 10000, query_pre_attn_scalar 256, attention scores soft-capped at 50
// and final logits at 30, context 8192, tied; bos 2, eos 1. 2,614,341,888 parameters.
ModelConfig gemma2_2b() {
  ModelConfig c = llama(26, 8, 4, 2304, 9216, 8192, 1e-6f, 256000);
  set_gemma_family(c, "gemma2");
  c.head_dim = 256;
  c.query_pre_attn_scalar = 256.0f;
  c.attn_softcap = 50.0f;
  c.final_softcap = 30.0f;
  c.sliding_window = 4096;
  for (int l = 0; l < c.n_layer; l++) c.layer_window.push_back((l + 1) % 2 ? c.sliding_window : 0);
  c.bos_token_id = 2;
  c.eos_token_ids = {1};
  return c;
}

// Sizes from the published Hugging Face config.json files of each model.
const std::map<std::string, ModelConfig>& presets() {
  static const std::map<std::string, ModelConfig> p = {
      {"gpt2", gpt2(12, 12, 768)},
      {"gpt2-medium", gpt2(24, 16, 1024)},
      {"gpt2-large", gpt2(36, 20, 1280)},
      {"gpt2-xl", gpt2(48, 25, 1600)},
      {"llama-7b", llama(32, 32, 32, 4096, 11008, 2048, 1e-6f)},
      {"llama-13b", llama(40, 40, 40, 5120, 13824, 2048, 1e-6f)},
      {"llama2-7b", llama(32, 32, 32, 4096, 11008, 4096, 1e-5f)},
      {"llama3-8b", llama3(32, 32, 4096, 14336, false, 0.0f)},
      {"llama3.1-8b", llama3(32, 32, 4096, 14336, false, 8.0f)},
      {"llama3.1-70b", llama3(80, 64, 8192, 28672, false, 8.0f)},
      {"llama3.2-1b", llama3(16, 32, 2048, 8192, true, 32.0f)},
      {"llama3.2-3b", llama3(28, 24, 3072, 8192, true, 32.0f)},
      {"qwen3-0.6b", qwen3(28, 16, 8, 1024, 3072, 128, true)},
      {"phi3-mini-4k", phi3_mini()},
      {"phi4-mini", phi4_mini()},
      {"gemma2-2b", gemma2_2b()},
      {"gemma3-1b", gemma3_1b()},
      {"mixtral-8x7b", mixtral_8x7b()},
      {"qwen3-30b-a3b", qwen3_30b_a3b()},
      // tiny sizes for tests and the quickstart (byte-level vocabulary of 256, no dropout)
      {"gpt2-tiny", gpt2(2, 4, 64, 256, 256)},
      {"gpt2-small-byte", gpt2(4, 4, 128, 256, 256)},
      {"llama-tiny", llama(2, 4, 2, 64, 176, 256, 1e-5f, 256)},
  };
  return p;
}

// The value as transformers' config classes need it: integers are JSON integers within int's range
// (not 32.5, not true), booleans are true or false (not 1, not "yes"), floats are finite numbers,
// strings are strings. The message quotes the value the file holds.
template <typename T>
T get_required(const nlohmann::json& j, const char* key, const std::string& source) {
  LLMT_CHECK(j.contains(key), "%s: missing key \"%s\"", source.c_str(), key);
  const nlohmann::json& v = j.at(key);
  const std::string held = clip_for_message(v.dump());
  if constexpr (std::is_same_v<T, bool>) {
    LLMT_CHECK(v.is_boolean(), "%s: \"%s\" must be true or false, got %s", source.c_str(), key, held.c_str());
    return v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    LLMT_CHECK(v.is_number_integer(), "%s: \"%s\" must be an integer, got %s", source.c_str(), key, held.c_str());
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= (uint64_t)std::numeric_limits<T>::max()
                                             : v.get<int64_t>() >= (int64_t)std::numeric_limits<T>::min() &&
                                                   v.get<int64_t>() <= (int64_t)std::numeric_limits<T>::max();
    LLMT_CHECK(fits, "%s: \"%s\" is %s, beyond what llmt can hold (at most %lld)", source.c_str(), key, held.c_str(),
               (long long)std::numeric_limits<T>::max());
    return v.get<T>();
  } else if constexpr (std::is_floating_point_v<T>) {
    LLMT_CHECK(v.is_number() && std::isfinite(v.get<double>()), "%s: \"%s\" must be a finite number, got %s",
               source.c_str(), key, held.c_str());
    // a float field holds what a float can (a rope factor of 1e300 became inf)
    LLMT_CHECK(std::fabs(v.get<double>()) <= (double)std::numeric_limits<T>::max(),
               "%s: \"%s\" is %s, beyond the range of a %s", source.c_str(), key, held.c_str(),
               sizeof(T) == 4 ? "float" : "double");
    return (T)v.get<double>();
  } else {
    LLMT_CHECK(v.is_string(), "%s: \"%s\" must be a string, got %s", source.c_str(), key, held.c_str());
    return v.get<T>();
  }
}

template <typename T>
T get_optional(const nlohmann::json& j, const char* key, T fallback, const std::string& source) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  return get_required<T>(j, key, source);
}

// A field whose other values change the model in a way llmt does not compute: its value must be the
// one llmt implements (absent or null is the default), else the error names it and says why.
template <typename T>
void require_default(const nlohmann::json& j, const char* key, T implemented, const std::string& source,
                     const char* why) {
  const T v = get_optional<T>(j, key, implemented, source);
  LLMT_CHECK(v == implemented, "%s: \"%s\": %s is not supported: %s", source.c_str(), key,
             clip_for_message(j.at(key).dump()).c_str(), why);
}

// A float as the shortest decimal that reads back as it (0.1f as 0.1, not 0.10000000149011612; 1e-6f
// as 1e-06, not 9.999999974752427e-07) for config.json.
double decimal(float x) {
  for (int digits = 6; digits < 9; digits++) {
    const double d = std::stod(strformat("%.*g", digits, x));
    if ((float)d == x) return d;
  }
  return std::stod(strformat("%.9g", x));
}

bool is_dir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

ModelConfig base_config(Arch arch) {
  ModelConfig c;
  c.arch = arch;
  Family& f = c.family;
  if (arch == Arch::gpt2) {  // GPT-2: LayerNorm, learned positions, GELU MLP, a bias on every matrix
    f.norm = NormKind::layernorm;
    f.mlp = MlpKind::gelu_tanh;
    f.learned_positions = true, f.rope = false;
    f.scaled_out_init = true;
    f.fused_qkv_tensor = true, f.fused_gate_up_tensor = false;
    c.qkv_bias = c.o_bias = c.mlp_bias = true;
  } else {  // LLaMA: RMSNorm, RoPE, SwiGLU, no biases (Mistral, Qwen2 and Qwen3 start here)
    f.norm = NormKind::rmsnorm;
    f.mlp = MlpKind::swiglu;
    f.learned_positions = false, f.rope = true;
    f.scaled_out_init = false;
    f.fused_qkv_tensor = false, f.fused_gate_up_tensor = false;
    c.qkv_bias = c.o_bias = c.mlp_bias = false;
  }
  return c;
}

std::string ModelConfig::decoder_layer_class() const {
  if (arch == Arch::gpt2) return "GPT2Block";
  if (model_type == "mistral") return "MistralDecoderLayer";
  if (model_type == "qwen2") return "Qwen2DecoderLayer";
  if (model_type == "qwen3") return "Qwen3DecoderLayer";
  if (model_type == "phi3") return "Phi3DecoderLayer";
  if (model_type == "gemma2") return "Gemma2DecoderLayer";
  if (model_type == "gemma3_text") return "Gemma3DecoderLayer";
  if (model_type == "mixtral") return "MixtralDecoderLayer";
  if (model_type == "qwen2_moe") return "Qwen2MoeDecoderLayer";
  if (model_type == "qwen3_moe") return "Qwen3MoeDecoderLayer";
  return "LlamaDecoderLayer";
}

std::string ModelConfig::describe() const {
  std::string s = strformat("%s: %d layers, d_model %d, %d heads", arch_name(), n_layer, d_model, n_head);
  if (n_kv_head != n_head) s += strformat(" (%d kv heads)", n_kv_head);
  s += strformat(", d_ff %d, vocab %d, context %d", d_ff, vocab_size, max_seq_len);
  if (arch == Arch::llama) s += strformat(", rope_theta %g%s", rope_theta, tied_embeddings ? ", tied" : "");
  if (arch == Arch::gpt2 && !tied_embeddings) s += ", untied lm_head";
  if (!rope_scaling.empty())
    s += rope_scaling == "llama3"     ? strformat(", rope llama3 x%g (low %g, high %g, original %d)", rope_factor,
                                                  rope_low_freq_factor, rope_high_freq_factor, rope_original_max)
         : rope_scaling == "longrope" ? strformat(", rope longrope (original %d, attention x%g)", rope_original_max,
                                                  longrope_attention_factor())
                                      : strformat(", rope %s x%g", rope_scaling.c_str(), rope_factor);
  if (partial_rotary_factor != 1.0) s += strformat(", rotary %d of %d", rotary_dim(), head_size());
  if (model_type == "mistral" || model_type == "qwen2" || model_type == "qwen3" || model_type == "phi3" ||
      model_type == "gemma2" || model_type == "gemma3_text")
    s += ", " + model_type;
  if (is_moe_model_type(model_type)) s += ", " + model_type;
  if (moe.active())
    s += strformat(", %d of %d experts of %d (%d MoE layers%s%s)%s", moe.top_k, moe.n_experts, moe.d_ff_expert,
                   moe_layers(), moe.d_ff_shared > 0 ? strformat(", a shared expert of %d", moe.d_ff_shared).c_str() : "",
                   moe.norm_topk ? "" : ", top-k not renormalised",
                   moe.output_router_logits ? strformat(", aux loss x%g", moe.aux_loss_coef).c_str() : "");
  if (rope_local_theta > 0.0f) s += strformat(", sliding layers' rope_theta %g", rope_local_theta);
  if (query_pre_attn_scalar > 0.0f && query_pre_attn_scalar != (float)head_size())
    s += strformat(", attention scale %g^-0.5", query_pre_attn_scalar);
  if (attn_softcap > 0.0f || final_softcap > 0.0f)
    s += strformat(", soft-caps %g (attention) %g (logits)", attn_softcap, final_softcap);
  if (head_dim > 0) s += strformat(", head_dim %d", head_dim);
  if (family.qk_norm) s += ", q/k norms";
  int sliding = 0;
  for (int w : layer_window) sliding += w > 0;
  if (sliding_window > 0 && sliding == n_layer) s += strformat(", window %d", sliding_window);
  else if (sliding_window > 0) s += strformat(", window %d on %d of %d layers", sliding_window, sliding, n_layer);
  if (arch != Arch::gpt2 && (qkv_bias || o_bias || mlp_bias))  // GPT-2 has them all, always
    s += strformat(", biases:%s%s%s", qkv_bias ? " qkv" : "", o_bias ? " o" : "", mlp_bias ? " mlp" : "");
  if (has_dropout()) s += strformat(", dropout %g/%g/%g (embd/attn/resid)", embd_pdrop, attn_pdrop, resid_pdrop);
  return s;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (auto& kv : presets()) names.push_back(kv.first);
  return names;
}

ModelConfig config_from_preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string all;
    for (auto& n : preset_names()) all += (all.empty() ? "" : ", ") + n;
    fail("unknown model preset \"%s\" (presets: %s; or give a config.json path)", name.c_str(), all.c_str());
  }
  return it->second;
}

void validate_config(const ModelConfig& c, const std::string& source) {
  LLMT_CHECK(c.vocab_size > 0 && c.n_layer > 0 && c.n_head > 0 && c.d_model > 0 && c.d_ff > 0 && c.max_seq_len > 0,
             "%s: sizes must be positive (vocab %d, layers %d, heads %d, d_model %d, d_ff %d, context %d)",
             source.c_str(), c.vocab_size, c.n_layer, c.n_head, c.d_model, c.d_ff, c.max_seq_len);
  // Before anything is laid out or allocated: a size typed wrong (n_layer 1000000000) must not grow
  // memory for minutes. In doubles, so no product overflows; 10^13 is 25x the largest Llama.
  const double d = c.d_model, params = (double)c.vocab_size * d * 2 + (double)c.max_seq_len * d +
                                       (double)c.n_layer * (4 * d * d + 3 * d * c.d_ff + 4 * d);
  LLMT_CHECK(params <= 1e13, "%s: %.3g parameters (vocab %d, layers %d, d_model %d, d_ff %d): beyond any model llmt "
             "can train; check the sizes", source.c_str(), params, c.vocab_size, c.n_layer, c.d_model, c.d_ff);
  LLMT_CHECK(c.head_dim > 0 || c.d_model % c.n_head == 0, "%s: hidden size %d is not divisible by %d heads",
             source.c_str(), c.d_model, c.n_head);
  LLMT_CHECK(c.head_dim >= 0, "%s: head_dim %d must be positive", source.c_str(), c.head_dim);
  LLMT_CHECK(c.n_kv_head > 0 && c.n_head % c.n_kv_head == 0, "%s: %d attention heads do not group over %d kv heads",
             source.c_str(), c.n_head, c.n_kv_head);
  LLMT_CHECK(!c.family.rope || c.head_size() % 2 == 0, "%s: RoPE needs an even head size, got %d",
             source.c_str(), c.head_size());
  LLMT_CHECK(c.norm_eps > 0.0f, "%s: the norm epsilon must be positive", source.c_str());
  // theta^(-2i/hs): 0 gives inf and a negative theta NaN, at the first step, where it looked like the
  // learning rate's fault
  LLMT_CHECK(!c.family.rope || (std::isfinite(c.rope_theta) && c.rope_theta > 0.0f),
             "%s: rope_theta must be a positive number, got %g", source.c_str(), c.rope_theta);
  // partial rotary and longrope: an even count of rotated channels within the head, one factor of
  // each set for each rotated pair, as many as a RopeSpec holds
  LLMT_CHECK(c.partial_rotary_factor == 1.0 || (c.family.rope && c.model_type == "phi3"),
             "%s: partial_rotary_factor %g is implemented for phi3 only", source.c_str(), c.partial_rotary_factor);
  LLMT_CHECK(!c.family.rope || (c.partial_rotary_factor > 0.0 && c.partial_rotary_factor <= 1.0 &&
                                c.rotary_dim() > 0 && c.rotary_dim() % 2 == 0),
             "%s: partial_rotary_factor %g rotates %d of a head's %d channels; expected an even, positive count",
             source.c_str(), c.partial_rotary_factor, c.rotary_dim(), c.head_size());
  if (c.rope_scaling == "longrope") {
    const size_t pairs = (size_t)c.rotary_dim() / 2;
    LLMT_CHECK(c.rope_short_factor.size() == pairs && c.rope_long_factor.size() == pairs,
               "%s: longrope's short_factor and long_factor hold %zu and %zu numbers; expected rotary_dim / 2 = %zu "
               "each (head size %d x partial_rotary_factor %g = %d rotated channels)", source.c_str(),
               c.rope_short_factor.size(), c.rope_long_factor.size(), pairs, c.head_size(), c.partial_rotary_factor,
               c.rotary_dim());
    LLMT_CHECK(pairs <= (size_t)RopeSpec::kMaxFactors, "%s: longrope over %d rotated channels: llmt holds at most %d "
               "factors a set", source.c_str(), c.rotary_dim(), RopeSpec::kMaxFactors);
    for (const auto* set : {&c.rope_short_factor, &c.rope_long_factor})
      for (float f : *set)
        LLMT_CHECK(std::isfinite(f) && f > 0.0f, "%s: longrope's %s holds %g; expected positive numbers",
                   source.c_str(), set == &c.rope_short_factor ? "short_factor" : "long_factor", f);
    LLMT_CHECK(c.rope_original_max > 0, "%s: longrope needs a positive original_max_position_embeddings, got %d",
               source.c_str(), c.rope_original_max);
  }
  LLMT_CHECK(c.layer_window.empty() || (int)c.layer_window.size() == c.n_layer,
             "%s: %zu layer windows for %d layers", source.c_str(), c.layer_window.size(), c.n_layer);
  for (int w : c.layer_window)
    LLMT_CHECK(w >= 0 && (w == 0 || c.arch == Arch::llama), "%s: a layer's attention window of %d (0 = none, or "
               "positive on the LLaMA architecture)", source.c_str(), w);
  for (float p : {c.embd_pdrop, c.attn_pdrop, c.resid_pdrop})
    LLMT_CHECK(p >= 0.0f && p < 1.0f, "%s: a dropout probability must lie in [0, 1), got %g", source.c_str(), p);
  LLMT_CHECK(c.arch == Arch::gpt2 || (c.embd_pdrop == 0.0f && c.resid_pdrop == 0.0f),
             "%s: LLaMA applies dropout to attention probabilities only", source.c_str());
  validate_moe_config(c, source);
}

// Each layer's attention window (ModelConfig::layer_window) from transformers 5's layer_types
// ("full_attention" or "sliding_attention" per layer) and the family's rules. Mistral: its window, when
// set, is every layer's (MistralModel masks every layer alike and ignores layer_types, so a
// layer_types saying otherwise is refused). Qwen2: the layers layer_types names sliding, else
// (Qwen2Config) those from max_window_layers on, and only with use_sliding_window (which
// c.sliding_window already reflects). LLaMA: no window.
static void read_layer_windows(const nlohmann::json& j, const std::string& source, const std::string& type,
                               ModelConfig& c) {
  std::vector<bool> sliding;
  if (j.contains("layer_types") && !j.at("layer_types").is_null()) {
    const nlohmann::json& lt = j.at("layer_types");
    LLMT_CHECK(lt.is_array() && (int)lt.size() == c.n_layer, "%s: \"layer_types\" must list one kind per layer "
               "(%d), got %s", source.c_str(), c.n_layer, clip_for_message(lt.dump()).c_str());
    for (const nlohmann::json& k : lt) {
      LLMT_CHECK(k == "full_attention" || k == "sliding_attention", "%s: \"layer_types\": %s is not supported "
                 "(full_attention or sliding_attention)", source.c_str(), clip_for_message(k.dump()).c_str());
      sliding.push_back(k == "sliding_attention");
    }
  }
  if (type == "mistral" || type == "phi3") {  // Phi3Model masks every layer alike too
    for (size_t l = 0; l < sliding.size(); l++)
      LLMT_CHECK(sliding[l] == (c.sliding_window > 0), "%s: \"layer_types\" makes layer %zu %s, but transformers' "
                 "Mistral and Phi-3 ignore layer_types and give every layer %s (sliding_window %d); remove "
                 "layer_types or make it agree", source.c_str(), l, sliding[l] ? "sliding" : "full",
                 c.sliding_window > 0 ? "the window" : "full attention", c.sliding_window);
    sliding.assign((size_t)c.n_layer, c.sliding_window > 0);
  } else if (type == "qwen2" || type == "qwen3") {
    if (sliding.empty() && c.sliding_window > 0) {
      const int from = get_optional<int>(j, "max_window_layers", 28, source);  // Qwen2Config's default
      for (int l = 0; l < c.n_layer; l++) sliding.push_back(l >= from);
    }
  }
  bool any = false;
  for (bool s : sliding) any = any || s;
  if (!any) return c.layer_window.clear();
  LLMT_CHECK(type != "llama", "%s: \"layer_types\" has sliding_attention layers, but transformers' LLaMA has no "
             "sliding window", source.c_str());
  LLMT_CHECK(c.sliding_window > 0, "%s: \"layer_types\" has sliding_attention layers but no positive sliding_window "
             "(Qwen2 reads sliding_window only with use_sliding_window true)", source.c_str());
  c.layer_window.clear();
  for (bool s : sliding) c.layer_window.push_back(s ? c.sliding_window : 0);
}

// rope_scaling / rope_parameters: the types transformers defines that change nothing llmt cannot
// compute exactly; any other type or key is refused by name, never ignored. Phi-3 adds longrope
// (with transformers' old names su and yarn for it) and partial_rotary_factor.
static void read_rope_scaling(const nlohmann::json& rp, const std::string& where, ModelConfig& c) {
  LLMT_CHECK(rp.is_object(), "%s: expected an object or null", where.c_str());
  std::string type = rp.contains("rope_type") ? get_required<std::string>(rp, "rope_type", where)
                                              : get_optional<std::string>(rp, "type", "default", where);
  const bool phi3 = c.model_type == "phi3";
  if (phi3 && (type == "su" || type == "yarn")) type = "longrope";  // Phi3Config renames them so
  // the type first: a type llmt does not compute is named as such, not by one of its keys
  LLMT_CHECK(type == "default" || type == "linear" || type == "dynamic" || type == "llama3" ||
                 (phi3 && type == "longrope"),
             "%s: rope_type \"%s\" is not supported (default, linear, llama3, dynamic within the original "
             "context, and longrope for phi3)", where.c_str(), type.c_str());
  for (const auto& [key, value] : rp.items()) {
    static const char* const known[] = {"rope_type", "type", "rope_theta", "factor", "low_freq_factor",
                                        "high_freq_factor", "original_max_position_embeddings",
                                        "partial_rotary_factor", "short_factor", "long_factor", "attention_factor"};
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    const bool longrope_key = key == "short_factor" || key == "long_factor" || key == "attention_factor";
    LLMT_CHECK(ok && (!longrope_key || type == "longrope"),
               "%s: \"%s\": %s is not supported (llmt reads rope_type, rope_theta, factor, low_freq_factor, "
               "high_freq_factor, original_max_position_embeddings, partial_rotary_factor, and longrope's "
               "short_factor, long_factor, attention_factor)", where.c_str(), key.c_str(),
               clip_for_message(value.dump()).c_str());
  }
  c.rope_theta = get_optional<float>(rp, "rope_theta", c.rope_theta, where);
  // transformers 5 keeps Phi-3's partial_rotary_factor here (1.0 unless the file says otherwise)
  if (phi3) c.partial_rotary_factor = get_optional<double>(rp, "partial_rotary_factor", c.partial_rotary_factor, where);
  else require_default(rp, "partial_rotary_factor", 1.0f, where,
                       "llmt rotates part of a head for phi3 only (Phi-4-mini's 0.75)");
  if (type == "default") return;
  c.rope_scaling = type;
  if (type == "longrope") {
    // Phi3Config: short_factor and long_factor required, factor and attention_factor optional; the
    // original context is the file's top-level original_max_position_embeddings (config_from_json)
    for (const char* key : {"short_factor", "long_factor"}) {
      LLMT_CHECK(rp.contains(key) && rp.at(key).is_array(), "%s: longrope needs \"%s\", a list of numbers",
                 where.c_str(), key);
      std::vector<float>& set = std::string(key) == "short_factor" ? c.rope_short_factor : c.rope_long_factor;
      set.clear();
      const nlohmann::json& list = rp.at(key);
      for (size_t i = 0; i < list.size(); i++) {
        const std::string name = strformat("%s[%zu]", key, i);
        set.push_back(get_required<float>(nlohmann::json{{name, list[i]}}, name.c_str(), where));
      }
    }
    c.rope_factor = get_optional<float>(rp, "factor", 0.0f, where);
    LLMT_CHECK(c.rope_factor == 0.0f || c.rope_factor >= 1.0f, "%s: factor %g must be at least 1", where.c_str(),
               c.rope_factor);
    c.rope_attention_factor = get_optional<float>(rp, "attention_factor", 0.0f, where);
    LLMT_CHECK(c.rope_attention_factor >= 0.0f, "%s: attention_factor %g must be positive", where.c_str(),
               c.rope_attention_factor);
    c.rope_original_max = get_optional<int>(rp, "original_max_position_embeddings", 0, where);
    return;
  }
  c.rope_factor = get_required<float>(rp, "factor", where);
  LLMT_CHECK(c.rope_factor >= 1.0f, "%s: factor %g must be at least 1", where.c_str(), c.rope_factor);
  if (type == "llama3") {
    c.rope_low_freq_factor = get_required<float>(rp, "low_freq_factor", where);
    c.rope_high_freq_factor = get_required<float>(rp, "high_freq_factor", where);
    c.rope_original_max = get_required<int>(rp, "original_max_position_embeddings", where);
    LLMT_CHECK(c.rope_low_freq_factor > 0 && c.rope_high_freq_factor > c.rope_low_freq_factor &&
                   c.rope_original_max > 0,
               "%s: llama3 needs 0 < low_freq_factor (%g) < high_freq_factor (%g) and a positive "
               "original_max_position_embeddings (%d)", where.c_str(), c.rope_low_freq_factor,
               c.rope_high_freq_factor, c.rope_original_max);
  } else if (type == "dynamic") {
    c.rope_original_max = get_optional<int>(rp, "original_max_position_embeddings", 0, where);
  }
}

float ModelConfig::longrope_attention_factor() const {
  if (rope_attention_factor > 0.0f) return rope_attention_factor;
  const double factor = rope_factor > 0.0f ? (double)rope_factor : (double)max_seq_len / rope_original_max;
  if (factor <= 1.0) return 1.0f;
  return (float)std::sqrt(1.0 + std::log(factor) / std::log((double)rope_original_max));
}

// Gemma 2 (Gemma2ForCausalLM) and Gemma 3's text model (Gemma3ForCausalLM, model_type gemma3_text),
// as transformers' Gemma2Config / Gemma3TextConfig read them (their defaults where a key is absent):
// LLaMA's names and attention, GeGLU (gelu_pytorch_tanh), RMSNorms of (1 + weight), sandwich norms,
// embeddings times sqrt(hidden_size), tied; Gemma 3 adds q/k norms and its sliding layers' own RoPE
// base. What llmt does not compute yet is refused by name: soft-caps, an attention scale other than
// the head size's, bidirectional attention, biases.
static ModelConfig gemma_from_json(const nlohmann::json& j, const std::string& source, const std::string& type) {
  const bool g3 = type == "gemma3_text";
  ModelConfig c = base_config(Arch::llama);
  set_gemma_family(c, type);
  c.vocab_size = get_required<int>(j, "vocab_size", source);
  c.max_seq_len = get_optional<int>(j, "max_position_embeddings", g3 ? 131072 : 8192, source);
  c.n_layer = get_required<int>(j, "num_hidden_layers", source);
  c.n_head = get_required<int>(j, "num_attention_heads", source);
  c.n_kv_head = get_optional<int>(j, "num_key_value_heads", 4, source);  // both configs' default
  c.d_model = get_required<int>(j, "hidden_size", source);
  c.d_ff = get_required<int>(j, "intermediate_size", source);
  c.norm_eps = get_optional<float>(j, "rms_norm_eps", 1e-6f, source);
  c.tied_embeddings = get_optional<bool>(j, "tie_word_embeddings", true, source);
  c.attn_pdrop = get_optional<float>(j, "attention_dropout", 0.0f, source);
  const int head_dim = get_optional<int>(j, "head_dim", 256, source);
  LLMT_CHECK(head_dim > 0, "%s: head_dim %d must be positive", source.c_str(), head_dim);
  c.head_dim = head_dim;
  const std::string act = get_optional<std::string>(j, "hidden_activation", "gelu_pytorch_tanh", source);
  LLMT_CHECK(act == "gelu_pytorch_tanh", "%s: hidden_activation \"%s\" is not supported (llmt implements Gemma's "
             "gelu_pytorch_tanh)", source.c_str(), act.c_str());
  require_default(j, "attention_bias", false, source, "llmt builds Gemma without biases, as its checkpoints are");
  require_default(j, "use_bidirectional_attention", false, source, "llmt trains causal language models");
  // attention scale query_pre_attn_scalar^-0.5 (Gemma 2 27B's 144 beside head_dim 128); both
  // configs default to 256
  c.query_pre_attn_scalar = get_optional<float>(j, "query_pre_attn_scalar", 256.0f, source);
  LLMT_CHECK(std::isfinite(c.query_pre_attn_scalar) && c.query_pre_attn_scalar > 0.0f,
             "%s: \"query_pre_attn_scalar\": %g must be a positive number", source.c_str(), c.query_pre_attn_scalar);
  // soft-caps: Gemma 2's defaults are 50 (attention scores) and 30 (final logits), Gemma 3's none;
  // null is none
  auto softcap = [&](const char* key, float fallback) {
    if (!j.contains(key) || j.at(key).is_null()) return j.contains(key) ? 0.0f : fallback;
    const float v = get_required<float>(j, key, source);
    LLMT_CHECK(std::isfinite(v) && v > 0.0f, "%s: \"%s\": %g must be a positive number or null", source.c_str(), key,
               v);
    return v;
  };
  c.attn_softcap = softcap("attn_logit_softcapping", g3 ? 0.0f : 50.0f);
  c.final_softcap = softcap("final_logit_softcapping", g3 ? 0.0f : 30.0f);
  // RoPE. Gemma 2: one rope_theta (transformers 4) or rope_parameters (5) for every layer, as LLaMA's.
  // Gemma 3: the full layers' rope_theta (default 1e6) and rope_scaling, the sliding layers'
  // rope_local_base_freq (default 1e4) unscaled; transformers 5 keeps both in rope_parameters keyed
  // by layer type.
  c.rope_theta = get_optional<float>(j, "rope_theta", g3 ? 1000000.0f : 10000.0f, source);
  const bool v5 = j.contains("rope_parameters") && !j.at("rope_parameters").is_null();
  const bool v4 = j.contains("rope_scaling") && !j.at("rope_scaling").is_null();
  ModelConfig v4c = c;
  if (v4) read_rope_scaling(j.at("rope_scaling"), source + " rope_scaling", v4c);
  if (!g3) {
    if (v5) read_rope_scaling(j.at("rope_parameters"), source + " rope_parameters", c);
    else c = v4c;
  } else {
    c.rope_local_theta = get_optional<float>(j, "rope_local_base_freq", 10000.0f, source);
    if (v5) {
      const nlohmann::json& rp = j.at("rope_parameters");
      LLMT_CHECK(rp.is_object(), "%s: rope_parameters must be an object keyed by layer type", source.c_str());
      for (const auto& [key, value] : rp.items())
        LLMT_CHECK(key == "full_attention" || key == "sliding_attention", "%s: rope_parameters: \"%s\" is not "
                   "supported (Gemma 3 keys them by layer type: full_attention, sliding_attention)", source.c_str(),
                   key.c_str());
      const float top_theta = c.rope_theta, top_local = c.rope_local_theta;
      if (rp.contains("full_attention"))
        read_rope_scaling(rp.at("full_attention"), source + " rope_parameters.full_attention", c);
      ModelConfig local = c;
      local.rope_scaling.clear();
      local.rope_theta = c.rope_local_theta;
      if (rp.contains("sliding_attention"))
        read_rope_scaling(rp.at("sliding_attention"), source + " rope_parameters.sliding_attention", local);
      LLMT_CHECK(local.rope_scaling.empty(), "%s: rope_parameters.sliding_attention: rope_type \"%s\" is not "
                 "supported: llmt rotates Gemma 3's sliding layers unscaled", source.c_str(),
                 local.rope_scaling.c_str());
      c.rope_local_theta = local.rope_theta;
      // a file with both spellings (llmt's exports) must agree, as LLaMA's
      if (j.contains("rope_theta") && !j.at("rope_theta").is_null())
        LLMT_CHECK(top_theta == c.rope_theta, "%s: rope_theta %g and rope_parameters.full_attention's %g disagree",
                   source.c_str(), top_theta, c.rope_theta);
      if (j.contains("rope_local_base_freq") && !j.at("rope_local_base_freq").is_null())
        LLMT_CHECK(top_local == c.rope_local_theta, "%s: rope_local_base_freq %g and rope_parameters."
                   "sliding_attention's %g disagree", source.c_str(), top_local, c.rope_local_theta);
      if (v4)
        LLMT_CHECK(v4c.rope_scaling == c.rope_scaling && v4c.rope_factor == c.rope_factor,
                   "%s: rope_scaling and rope_parameters.full_attention disagree", source.c_str());
    } else {
      const float local = c.rope_local_theta;
      c = v4c;  // rope_scaling is the full layers'
      c.rope_local_theta = local;
    }
    LLMT_CHECK(std::isfinite(c.rope_local_theta) && c.rope_local_theta > 0.0f,
               "%s: rope_local_base_freq must be a positive number, got %g", source.c_str(), c.rope_local_theta);
  }
  // layers: layer_types, else Gemma 2's alternation (sliding first) or Gemma 3's sliding_window_pattern
  // (every pattern-th layer full, default 6)
  c.sliding_window = j.contains("sliding_window") && j.at("sliding_window").is_null()
                         ? 0
                         : get_optional<int>(j, "sliding_window", 4096, source);
  LLMT_CHECK(c.sliding_window >= 0, "%s: sliding_window %d must be positive (or null)", source.c_str(),
             c.sliding_window);
  if (j.contains("layer_types") && !j.at("layer_types").is_null()) {
    read_layer_windows(j, source, type, c);
  } else {
    const int pattern = g3 ? get_optional<int>(j, "sliding_window_pattern", 6, source) : 2;
    LLMT_CHECK(pattern > 0, "%s: sliding_window_pattern %d must be positive", source.c_str(), pattern);
    LLMT_CHECK(c.sliding_window > 0, "%s: the layers slide by default (no layer_types) but sliding_window is null",
               source.c_str());
    for (int l = 0; l < c.n_layer; l++) c.layer_window.push_back((l + 1) % pattern ? c.sliding_window : 0);
  }
  return c;
}

ModelConfig config_from_json(const nlohmann::json& j, const std::string& source) {
  LLMT_CHECK(j.is_object(), "%s: expected a JSON object", source.c_str());
  std::string type = get_required<std::string>(j, "model_type", source);
  ModelConfig c;
  if (type == "gpt2") {
    c = base_config(Arch::gpt2);
    c.vocab_size = get_required<int>(j, "vocab_size", source);
    c.max_seq_len = get_optional<int>(j, "n_positions", get_optional<int>(j, "n_ctx", 0, source), source);
    c.n_layer = get_required<int>(j, "n_layer", source);
    c.n_head = c.n_kv_head = get_required<int>(j, "n_head", source);
    c.d_model = get_required<int>(j, "n_embd", source);
    c.d_ff = get_optional<int>(j, "n_inner", 4 * c.d_model, source);
    c.norm_eps = get_optional<float>(j, "layer_norm_epsilon", 1e-5f, source);
    std::string act = get_optional<std::string>(j, "activation_function", "gelu_new", source);
    LLMT_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh",
               "%s: activation_function \"%s\" is not supported (llmt implements the tanh GELU, gelu_new)",
               source.c_str(), act.c_str());
    // GPT2LMHeadModel ties lm_head to wte unless tie_word_embeddings is false; then lm_head.weight is
    // a parameter of its own (it used to be tied regardless, and exported as tied)
    c.tied_embeddings = get_optional<bool>(j, "tie_word_embeddings", true, source);
    // GPT2Attention's options that change the scores: llmt divides by sqrt(head size), as the default
    require_default(j, "scale_attn_weights", true, source,
                    "llmt's attention always divides the scores by sqrt(head size), as GPT-2 does by default");
    require_default(j, "scale_attn_by_inverse_layer_idx", false, source,
                    "llmt does not divide attention scores by the layer index + 1");
    require_default(j, "add_cross_attention", false, source,
                    "llmt trains decoder-only GPT-2 (no cross-attention layers)");
    // (reorder_and_upcast_attn only changes the precision of scores transformers computes in fp16 or
    // bf16; llmt's attention keeps scores in fp32 either way, so it is accepted)
    // GPT2Config's defaults are 0.1 each, as OpenAI's checkpoints say
    c.embd_pdrop = get_optional<float>(j, "embd_pdrop", 0.1f, source);
    c.attn_pdrop = get_optional<float>(j, "attn_pdrop", 0.1f, source);
    c.resid_pdrop = get_optional<float>(j, "resid_pdrop", 0.1f, source);
  } else if (type == "llama" || type == "mistral" || type == "qwen2" || type == "qwen3" || type == "phi3" ||
             is_moe_model_type(type)) {
    // an MoE family's attention and norms are its dense relative's (models/moe.h); its experts below
    const std::string moe_type = is_moe_model_type(type) ? type : "";
    type = moe_dense_relative(type);
    c = base_config(Arch::llama);
    c.model_type = type;
    c.vocab_size = get_required<int>(j, "vocab_size", source);
    c.max_seq_len = get_optional<int>(j, "max_position_embeddings", 2048, source);
    c.n_layer = get_required<int>(j, "num_hidden_layers", source);
    c.n_head = get_required<int>(j, "num_attention_heads", source);
    c.n_kv_head = get_optional<int>(j, "num_key_value_heads", c.n_head, source);
    c.d_model = get_required<int>(j, "hidden_size", source);
    c.d_ff = get_required<int>(j, "intermediate_size", source);
    c.norm_eps = get_optional<float>(j, "rms_norm_eps", 1e-6f, source);
    c.rope_theta = get_optional<float>(j, "rope_theta", 10000.0f, source);
    // transformers 4 reads rope_scaling ({"rope_type" or "type": ...} or null) beside rope_theta;
    // transformers 5 reads rope_parameters, which holds rope_theta too. A file with both (llmt's own
    // exports) is read both ways, and the two must agree: each is checked, and none is ignored.
    const bool v5 = j.contains("rope_parameters") && !j.at("rope_parameters").is_null();
    const bool v4 = j.contains("rope_scaling") && !j.at("rope_scaling").is_null();
    ModelConfig from_v4 = c;
    if (v4) read_rope_scaling(j.at("rope_scaling"), source + " rope_scaling", from_v4);
    if (v5) read_rope_scaling(j.at("rope_parameters"), source + " rope_parameters", c);
    else c = from_v4;
    if (v5 && v4) {
      LLMT_CHECK(c.rope_scaling == from_v4.rope_scaling && c.rope_factor == from_v4.rope_factor &&
                     c.rope_low_freq_factor == from_v4.rope_low_freq_factor &&
                     c.rope_high_freq_factor == from_v4.rope_high_freq_factor &&
                     c.rope_original_max == from_v4.rope_original_max &&
                     c.rope_short_factor == from_v4.rope_short_factor &&
                     c.rope_long_factor == from_v4.rope_long_factor &&
                     c.rope_attention_factor == from_v4.rope_attention_factor &&
                     c.partial_rotary_factor == from_v4.partial_rotary_factor,
                 "%s: rope_scaling (%s) and rope_parameters (%s) disagree: transformers 4 reads the first, "
                 "transformers 5 the second; make them equal or remove one", source.c_str(),
                 clip_for_message(j.at("rope_scaling").dump(), 200).c_str(),
                 clip_for_message(j.at("rope_parameters").dump(), 200).c_str());
    }
    if (v5 && j.contains("rope_theta") && !j.at("rope_theta").is_null())
      LLMT_CHECK(c.rope_theta == from_v4.rope_theta, "%s: rope_theta %g and rope_parameters.rope_theta %g disagree: "
                 "transformers 4 reads the first, transformers 5 the second", source.c_str(), from_v4.rope_theta,
                 c.rope_theta);
    if ((type == "mistral" || type == "phi3") && j.contains("sliding_window") && !j.at("sliding_window").is_null()) {
      c.sliding_window = get_required<int>(j, "sliding_window", source);
      LLMT_CHECK(c.sliding_window > 0, "%s: sliding_window %d must be positive (or null)", source.c_str(),
                 c.sliding_window);
    }
    c.tied_embeddings = get_optional<bool>(j, "tie_word_embeddings", false, source);
    c.attn_pdrop = get_optional<float>(j, "attention_dropout", 0.0f, source);
    std::string act = get_optional<std::string>(j, "hidden_act", "silu", source);
    LLMT_CHECK(act == "silu", "%s: hidden_act \"%s\" is not supported (LLaMA uses silu)", source.c_str(), act.c_str());
    if (type == "qwen2") {
      // Qwen2Attention: q, k and v projections with biases, o without (Qwen2-MoE: qkv_bias, default true)
      c.qkv_bias = moe_type.empty() || get_optional<bool>(j, "qkv_bias", true, source);
      // Qwen2's sliding window is off unless use_sliding_window says otherwise
      if (get_optional<bool>(j, "use_sliding_window", false, source)) {
        c.sliding_window = get_required<int>(j, "sliding_window", source);
        LLMT_CHECK(c.sliding_window > 0, "%s: sliding_window %d must be positive", source.c_str(), c.sliding_window);
      }
    } else if (type == "qwen3") {
      // Qwen3Attention: RMSNorm over each head of q and of k (q_norm, k_norm: weights [head_dim], eps
      // rms_norm_eps) after the projections, before RoPE; attention_bias on q, k, v and o; Qwen3MLP
      // without biases
      c.family.qk_norm = true;
      c.qkv_bias = c.o_bias = get_optional<bool>(j, "attention_bias", false, source);
      require_default(j, "mlp_bias", false, source, "transformers builds Qwen3's MLP without biases");
      if (get_optional<bool>(j, "use_sliding_window", false, source)) {  // Qwen3Config: as Qwen2's
        c.sliding_window = get_required<int>(j, "sliding_window", source);
        LLMT_CHECK(c.sliding_window > 0, "%s: sliding_window %d must be positive", source.c_str(), c.sliding_window);
      }
    } else if (type == "phi3") {
      // Phi3: q, k, v stored as one qkv_proj and gate, up as one gate_up_proj ([gate | up], as llmt's),
      // no biases; resid_pdrop on each residual branch (GPT-2's sites); embd_pdrop is read by nothing
      // in transformers' Phi3Model, so it is not applied here either
      c.family.fused_qkv_tensor = c.family.fused_gate_up_tensor = true;
      require_default(j, "attention_bias", false, source, "transformers builds Phi-3 without biases");
      require_default(j, "mlp_bias", false, source, "transformers builds Phi-3 without biases");
      c.resid_pdrop = get_optional<float>(j, "resid_pdrop", 0.0f, source);
      // Phi3Config moves its top-level partial_rotary_factor into rope_parameters unless that has one,
      // and longrope's original context is always the top-level original_max_position_embeddings
      // (default 4096), whatever rope_parameters says: a file where they differ is refused
      auto inner = [&](const char* key) {
        for (const char* obj : {"rope_parameters", "rope_scaling"})
          if (j.contains(obj) && j.at(obj).is_object() && j.at(obj).contains(key) && !j.at(obj).at(key).is_null())
            return true;
        return false;
      };
      if (j.contains("partial_rotary_factor") && !j.at("partial_rotary_factor").is_null()) {
        const double top = get_required<double>(j, "partial_rotary_factor", source);
        LLMT_CHECK(!inner("partial_rotary_factor") || top == c.partial_rotary_factor,
                   "%s: partial_rotary_factor %g and the rope parameters' %g disagree; make them equal or remove one",
                   source.c_str(), top, c.partial_rotary_factor);
        c.partial_rotary_factor = top;
      }
      const int original = get_optional<int>(j, "original_max_position_embeddings", 4096, source);
      if (c.rope_scaling == "longrope") {
        LLMT_CHECK(!inner("original_max_position_embeddings") || c.rope_original_max == original,
                   "%s: the rope parameters' original_max_position_embeddings %d differs from the top-level %d, "
                   "which transformers' Phi-3 uses; make them equal or remove the first", source.c_str(),
                   c.rope_original_max, original);
        c.rope_original_max = original;
      }
    } else if (type == "mistral") {  // MistralAttention and MistralMLP have no biases, whatever the file says
      require_default(j, "attention_bias", false, source, "transformers builds Mistral without biases");
      require_default(j, "mlp_bias", false, source, "transformers builds Mistral without biases");
    } else {
      c.qkv_bias = c.o_bias = get_optional<bool>(j, "attention_bias", false, source);
      c.mlp_bias = get_optional<bool>(j, "mlp_bias", false, source);
    }
    if (type != "phi3")  // LlamaConfig and the rest would move it into the rope parameters
      require_default(j, "partial_rotary_factor", 1.0f, source, "llmt rotates part of a head for phi3 only");
    read_layer_windows(j, source, type, c);
    // head_dim: q_proj's out is num_attention_heads x head_dim, o_proj's in the same; kept as 0 where
    // it is hidden_size / num_attention_heads. Qwen3Config's default is 128 whatever the hidden size.
    const bool has_head_dim = j.contains("head_dim") && !j.at("head_dim").is_null();
    if (has_head_dim || (type == "qwen3" && moe_type.empty())) {  // Qwen3-MoE's: hidden / heads
      const int head_dim = has_head_dim ? get_required<int>(j, "head_dim", source) : 128;
      LLMT_CHECK(head_dim > 0, "%s: head_dim %d must be positive", source.c_str(), head_dim);
      if ((int64_t)head_dim * c.n_head != c.d_model) c.head_dim = head_dim;
    }
    if (!moe_type.empty()) {
      c.model_type = moe_type;
      read_moe_config(j, source, moe_type, c);
    }
  } else if (type == "gemma2" || type == "gemma3_text") {
    c = gemma_from_json(j, source, type);
  } else {
    refuse_other_moe(type, source);
    fail("%s: model_type \"%s\" is not supported (gpt2, llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3_text, "
         "mixtral, qwen2_moe or qwen3_moe)", source.c_str(), type.c_str());
  }
  // Fields of every family (PretrainedConfig's): the random initialisation's spread, read; pruned heads
  // (transformers prunes them when it builds the model) refused
  c.init_std = get_optional<float>(j, "initializer_range", 0.02f, source);
  LLMT_CHECK(c.init_std > 0.0f, "%s: initializer_range must be positive, got %g", source.c_str(), c.init_std);
  LLMT_CHECK(!j.contains("pruned_heads") || j.at("pruned_heads").is_null() || j.at("pruned_heads").empty(),
             "%s: \"pruned_heads\": %s is not supported: llmt trains every attention head", source.c_str(),
             clip_for_message(j.at("pruned_heads").dump()).c_str());
  // eos_token_id: an id, or a list of them (Llama 3.1 Instruct stops at three); each must fit
  if (j.contains("bos_token_id") && j.at("bos_token_id").is_number_integer())
    c.bos_token_id = get_required<int>(j, "bos_token_id", source);
  if (j.contains("eos_token_id") && j.at("eos_token_id").is_number_integer())
    c.eos_token_ids = {get_required<int>(j, "eos_token_id", source)};
  if (j.contains("eos_token_id") && j.at("eos_token_id").is_array())
    for (size_t i = 0; i < j.at("eos_token_id").size(); i++) {
      const std::string where = strformat("eos_token_id[%zu]", i);
      c.eos_token_ids.push_back(get_required<int>(nlohmann::json{{where, j.at("eos_token_id")[i]}}, where.c_str(),
                                                  source));
    }
  validate_config(c, source);
  c.source = j;
  return c;
}

nlohmann::json read_json_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  LLMT_CHECK(f.good(), "cannot open %s %s", what, path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  check_json_depth(text, path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("%s: malformed JSON (%s)", path.c_str(), e.what());
  }
}

ModelConfig config_from_json_file(const std::string& path) {
  return config_from_json(read_json_file(path, "model config"), path);
}

ModelConfig resolve_model_config(const std::string& name_or_path) {
  if (is_dir(name_or_path)) return config_from_json_file(name_or_path + "/config.json");
  if (name_or_path.size() > 5 && name_or_path.substr(name_or_path.size() - 5) == ".json")
    return config_from_json_file(name_or_path);
  return config_from_preset(name_or_path);
}

// Gemma 2 and 3 as their config classes read them (gemma_from_json's keys).
static nlohmann::json gemma_to_hf_json(const ModelConfig& c) {
  const bool g3 = c.model_type == "gemma3_text";
  auto cap = [](float v) { return v > 0.0f ? nlohmann::json(v) : nlohmann::json(nullptr); };
  nlohmann::json j = {{"architectures", {g3 ? "Gemma3ForCausalLM" : "Gemma2ForCausalLM"}},
                      {"model_type", c.model_type},
                      {"vocab_size", c.vocab_size},
                      {"max_position_embeddings", c.max_seq_len},
                      {"hidden_size", c.d_model},
                      {"intermediate_size", c.d_ff},
                      {"num_hidden_layers", c.n_layer},
                      {"num_attention_heads", c.n_head},
                      {"num_key_value_heads", c.n_kv_head},
                      {"head_dim", c.head_size()},
                      {"rms_norm_eps", c.norm_eps},
                      {"hidden_activation", "gelu_pytorch_tanh"},
                      {"attention_bias", false},
                      {"attention_dropout", decimal(c.attn_pdrop)},
                      {"query_pre_attn_scalar", c.query_pre_attn_scalar > 0.0f ? c.query_pre_attn_scalar
                                                                                : (float)c.head_size()},
                      {"attn_logit_softcapping", cap(c.attn_softcap)},
                      {"final_logit_softcapping", cap(c.final_softcap)},
                      {"sliding_window", c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr)},
                      {"tie_word_embeddings", c.tied_embeddings},
                      {"rope_theta", c.rope_theta}};
  nlohmann::json kinds = nlohmann::json::array();
  for (int l = 0; l < c.n_layer; l++) kinds.push_back(c.window(l) > 0 ? "sliding_attention" : "full_attention");
  j["layer_types"] = kinds;
  nlohmann::json full = {{"rope_type", "default"}, {"rope_theta", c.rope_theta}};
  if (!c.rope_scaling.empty()) {
    nlohmann::json rs = {{"rope_type", c.rope_scaling}, {"factor", c.rope_factor}};
    if (c.rope_scaling == "llama3") {
      rs["low_freq_factor"] = c.rope_low_freq_factor;
      rs["high_freq_factor"] = c.rope_high_freq_factor;
    }
    if (c.rope_original_max > 0) rs["original_max_position_embeddings"] = c.rope_original_max;
    j["rope_scaling"] = rs;  // transformers 4
    rs["rope_theta"] = c.rope_theta;
    full = rs;
  }
  if (g3) {
    const float local = c.rope_local_theta > 0.0f ? c.rope_local_theta : c.rope_theta;
    j["rope_local_base_freq"] = local;
    j["rope_parameters"] = {{"full_attention", full},
                            {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", local}}}};
  } else {
    j["rope_parameters"] = full;
  }
  return j;
}

nlohmann::json config_to_hf_json(const ModelConfig& c) {
  nlohmann::json j;
  if (c.model_type == "gemma2" || c.model_type == "gemma3_text") {
    j = gemma_to_hf_json(c);
  } else if (c.arch == Arch::gpt2) {
    j = {{"architectures", {"GPT2LMHeadModel"}},
         {"model_type", "gpt2"},
         {"vocab_size", c.vocab_size},
         {"n_positions", c.max_seq_len},
         {"n_ctx", c.max_seq_len},
         {"n_embd", c.d_model},
         {"n_layer", c.n_layer},
         {"n_head", c.n_head},
         {"n_inner", c.d_ff == 4 * c.d_model ? nlohmann::json(nullptr) : nlohmann::json(c.d_ff)},
         {"activation_function", "gelu_new"},
         {"layer_norm_epsilon", c.norm_eps},
         {"resid_pdrop", decimal(c.resid_pdrop)},
         {"embd_pdrop", decimal(c.embd_pdrop)},
         {"attn_pdrop", decimal(c.attn_pdrop)},
         {"tie_word_embeddings", c.tied_embeddings}};
  } else {
    const std::string type = moe_dense_relative(c.model_type);  // an MoE family: its dense relative's keys, then its own
    const bool mistral = type == "mistral", qwen2 = type == "qwen2", qwen3 = type == "qwen3", phi3 = type == "phi3";
    j = {{"architectures", {mistral  ? "MistralForCausalLM"
                            : qwen2  ? "Qwen2ForCausalLM"
                            : qwen3  ? "Qwen3ForCausalLM"
                            : phi3   ? "Phi3ForCausalLM"
                                     : "LlamaForCausalLM"}},
         {"model_type", mistral ? "mistral" : qwen2 ? "qwen2" : qwen3 ? "qwen3" : phi3 ? "phi3" : "llama"},
         {"vocab_size", c.vocab_size},
         {"max_position_embeddings", c.max_seq_len},
         {"hidden_size", c.d_model},
         {"intermediate_size", c.d_ff},
         {"num_hidden_layers", c.n_layer},
         {"num_attention_heads", c.n_head},
         {"num_key_value_heads", c.n_kv_head},
         {"rms_norm_eps", c.norm_eps},
         {"rope_theta", c.rope_theta},  // read by transformers 4
         {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", c.rope_theta}}},  // transformers 5
         {"hidden_act", "silu"},
         {"attention_bias", c.qkv_bias && c.o_bias},
         {"mlp_bias", c.mlp_bias},
         {"attention_dropout", decimal(c.attn_pdrop)},
         {"tie_word_embeddings", c.tied_embeddings}};
    if (c.rope_scaling == "longrope") {  // both spellings; the factors as the decimals they stand for
      nlohmann::json rs = {{"rope_type", "longrope"}};
      for (const auto* set : {&c.rope_short_factor, &c.rope_long_factor}) {
        nlohmann::json list = nlohmann::json::array();
        for (float f : *set) list.push_back(decimal(f));
        rs[set == &c.rope_short_factor ? "short_factor" : "long_factor"] = list;
      }
      if (c.rope_factor > 0.0f) rs["factor"] = decimal(c.rope_factor);
      if (c.rope_attention_factor > 0.0f) rs["attention_factor"] = decimal(c.rope_attention_factor);
      rs["original_max_position_embeddings"] = c.rope_original_max;
      j["original_max_position_embeddings"] = c.rope_original_max;  // what Phi3Config reads
      j["rope_scaling"] = rs;
      rs["rope_theta"] = c.rope_theta;
      j["rope_parameters"] = rs;
    } else if (!c.rope_scaling.empty()) {  // both spellings, as for rope_theta
      nlohmann::json rs = {{"rope_type", c.rope_scaling}, {"factor", c.rope_factor}};
      if (c.rope_scaling == "llama3") {
        rs["low_freq_factor"] = c.rope_low_freq_factor;
        rs["high_freq_factor"] = c.rope_high_freq_factor;
      }
      if (c.rope_original_max > 0) rs["original_max_position_embeddings"] = c.rope_original_max;
      j["rope_scaling"] = rs;
      rs["rope_theta"] = c.rope_theta;
      j["rope_parameters"] = rs;
    }
    // Qwen3Config's head_dim defaults to 128, not hidden_size / num_attention_heads: always written
    if (c.head_dim > 0 || qwen3) j["head_dim"] = c.head_size();
    if (qwen3) j.erase("mlp_bias");  // Qwen3Config has none
    if (phi3) {  // Phi3Config has no attention_bias or mlp_bias; resid_pdrop and the window are its own
      j.erase("attention_bias");
      j.erase("mlp_bias");
      j["resid_pdrop"] = decimal(c.resid_pdrop);
      if (c.partial_rotary_factor != 1.0) {  // top-level (transformers 4) and in the rope parameters (5)
        j["partial_rotary_factor"] = c.partial_rotary_factor;
        j["rope_parameters"]["partial_rotary_factor"] = c.partial_rotary_factor;
        if (j.contains("rope_scaling")) j["rope_scaling"]["partial_rotary_factor"] = c.partial_rotary_factor;
      }
      j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
    }
    if (mistral) j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
    if (qwen2) {  // Qwen2Config has no attention_bias or mlp_bias: its biases are fixed by the model
      j.erase("attention_bias");
      j.erase("mlp_bias");
    }
    if (qwen2 || qwen3) {  // the window as Qwen2Config and Qwen3Config read it
      j["use_sliding_window"] = c.sliding_window > 0;
      j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
      if (!c.layer_window.empty()) {  // which layers slide, spelled out (max_window_layers would default to 28)
        nlohmann::json kinds = nlohmann::json::array();
        for (int l = 0; l < c.n_layer; l++) kinds.push_back(c.window(l) > 0 ? "sliding_attention" : "full_attention");
        j["layer_types"] = kinds;
      }
    }
    if (is_moe_model_type(c.model_type)) moe_to_hf_json(c, j);
  }
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  if (c.eos_token_ids.size() > 1) j["eos_token_id"] = c.eos_token_ids;
  j["torch_dtype"] = "float32";
  return j;
}

namespace {

// llmt's floats (every float of config_to_hf_json is a float) as the decimals they stand for.
nlohmann::json decimal_floats(nlohmann::json j) {
  if (j.is_number_float()) return decimal((float)j.get<double>());
  if (j.is_structured())
    for (auto& v : j) v = decimal_floats(v);
  return j;
}

// The source's value where it says what llmt's does (1e-06 for llmt's float 1e-06), else llmt's;
// keys only one of them has are kept. llmt writes null where it leaves the default (n_inner of 4 x
// n_embd, Qwen2's sliding_window without use_sliding_window), which the source's value read as.
nlohmann::json prefer_source(const nlohmann::json& src, const nlohmann::json& own) {
  if (src.is_object() && own.is_object()) {
    nlohmann::json out = src;
    for (const auto& [k, v] : own.items()) out[k] = src.contains(k) ? prefer_source(src.at(k), v) : v;
    return out;
  }
  if (own.is_null()) return src;
  if (own.is_number_float() && src.is_number() && (float)src.get<double>() == (float)own.get<double>()) return src;
  return src == own ? src : own;
}

}  // namespace

nlohmann::json config_to_save(const ModelConfig& c, const std::string& torch_dtype) {
  nlohmann::json j = prefer_source(c.source.is_object() ? c.source : nlohmann::json::object(),
                                   decimal_floats(config_to_hf_json(c)));
  j["torch_dtype"] = torch_dtype;
  if (j.contains("dtype")) j["dtype"] = torch_dtype;  // transformers 5's name
  return j;
}

}  // namespace llmt
