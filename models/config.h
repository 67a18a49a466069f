// Model configuration: the families llmt trains, read from a Hugging Face config.json or taken from a
// built-in preset, and written back as a config.json transformers can load. A family is data: the
// switches of ModelConfig::family (and the biases, head_dim, rope fields beside them), filled in by
// config.cpp from model_type; the model code reads the switches and never names a family
// (docs/design.md, "How to add a model family").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace llmt {

// Whose tensor names and storage the checkpoint has: GPT-2's (transformer.h.N.attn.c_attn, Conv1D
// weights stored [in, out]) or LLaMA's (model.layers.N.self_attn.q_proj, nn.Linear [out, in]), which
// Mistral, Qwen2, Qwen3, Phi-3 and Gemma 2/3 share. It names tensors; what the model computes is the Family below.
enum class Arch { gpt2, llama };

enum class NormKind { layernorm, rmsnorm };  // LayerNorm (weight and bias) or RMSNorm (weight)
// The MLP: gelu_tanh is c_fc -> GELU (tanh form, gelu_new) -> c_proj; swiglu is one [gate | up]
// matrix -> silu(gate) * up -> down; geglu the same with the tanh GELU for silu (Gemma's
// gelu_pytorch_tanh)
enum class MlpKind { gelu_tanh, swiglu, geglu };

// What a family computes, switch by switch. config.cpp sets them for each model_type; transformer.cpp,
// layout.cpp and the checkpoint code read them.
struct Family {
  NormKind norm = NormKind::layernorm;  // every norm of the model (the blocks' two and the final one)
  MlpKind mlp = MlpKind::gelu_tanh;
  bool learned_positions = true;  // a position embedding table (wpe) added to the token embeddings
  bool rope = false;              // rotary positions on q and k
  bool qk_norm = false;           // RMSNorm over each head of q and of k (weights [head_dim]) before RoPE
  // every RMSNorm (the blocks', q/k's, the final one) multiplies by norm_offset + weight, the sum in
  // f32: Gemma's (1 + weight), whose weights start at 0
  float norm_offset = 0.0f;
  // Gemma's sandwich: a norm on the attention branch's output and one on the MLP's, each before its
  // residual add (post_attention_layernorm, post_feedforward_layernorm), beside the two pre-norms
  bool sandwich_norms = false;
  // the token embeddings times sqrt(hidden_size), the factor rounded to the compute dtype (Gemma's
  // embed_scale); wte's gradient is scaled alike
  bool scaled_embeddings = false;
  // the random init divides the output projections' (attention's and the MLP's) std by sqrt(2 L)
  bool scaled_out_init = true;
  // the checkpoint stores q, k, v as one tensor (GPT-2's c_attn, Phi-3's qkv_proj), and the SwiGLU's
  // gate and up as one (Phi-3's gate_up_proj); llmt's own matrices are fused either way
  bool fused_qkv_tensor = true, fused_gate_up_tensor = false;
};

// Mixture of experts (models/moe.h): a layer's MLP replaced by a router and n_experts SwiGLU experts,
// each token through the top_k of them (Mixtral, Qwen2-MoE, Qwen3-MoE). n_experts 0: no MoE layer.
struct MoeConfig {
  int n_experts = 0;     // num_local_experts (Mixtral) / num_experts (Qwen)
  int top_k = 0;         // num_experts_per_tok
  int d_ff_expert = 0;   // each expert's intermediate size (Mixtral's intermediate_size, Qwen's moe_intermediate_size)
  int d_ff_shared = 0;   // Qwen2-MoE's shared expert (shared_expert_intermediate_size, with its sigmoid gate); 0 none
  bool norm_topk = true;  // the top-k probabilities divided by their sum (Mixtral always; Qwen's norm_topk_prob)
  // the routing weights rounded to the router logits' dtype before the experts' outputs are weighted
  // (Qwen's router_top_value.to(router_logits.dtype): bf16 under --bf16); Mixtral keeps them fp32
  bool round_weights = false;
  // Qwen's layer pattern: layer l is MoE unless listed in mlp_only_layers, and when (l + 1) %
  // decoder_sparse_step == 0; Mixtral's every layer
  int sparse_step = 1;
  std::vector<int> mlp_only_layers;
  // the load-balancing loss (transformers' load_balancing_loss_func), added times aux_loss_coef to the
  // loss when output_router_logits
  bool output_router_logits = false;
  float aux_loss_coef = 0.001f;
  bool active() const { return n_experts > 0; }
};

struct ModelConfig {
  Arch arch = Arch::gpt2;
  Family family;
  int vocab_size = 0;
  int max_seq_len = 0;   // n_positions / max_position_embeddings
  int n_layer = 0;
  int n_head = 0;
  int n_kv_head = 0;     // = n_head for GPT-2
  int d_model = 0;       // n_embd / hidden_size
  int d_ff = 0;          // 4 * n_embd (n_inner) / intermediate_size
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;      // LLaMA only
  // rope_scaling (transformers 5: rope_parameters), LLaMA only: "" none, "linear", "llama3", or
  // "dynamic" (NTK, which changes nothing up to the original context: llmt trains only within it)
  std::string rope_scaling;
  float rope_factor = 1.0f, rope_low_freq_factor = 1.0f, rope_high_freq_factor = 4.0f;
  int rope_original_max = 0;        // original_max_position_embeddings (llama3, longrope; dynamic: the context)
  // "longrope" (Phi-3 only): frequency i divided by rope_short_factor[i] in a pass whose last position
  // + 1 is at most rope_original_max, by rope_long_factor[i] beyond (transformers picks the set per
  // forward); cos and sin times longrope_attention_factor(). rope_factor is the file's "factor" here
  // (0: absent) and rope_attention_factor its "attention_factor" (0: absent), kept for export.
  std::vector<float> rope_short_factor, rope_long_factor;
  float rope_attention_factor = 0.0f;
  // partial_rotary_factor (Phi-3 only; Phi-4-mini's 0.75): the first rotary_dim() channels of each
  // head rotate, the rest pass through
  double partial_rotary_factor = 1.0;
  // > 0: the sliding-window layers' own RoPE base, unscaled (Gemma 3's rope_local_base_freq); the
  // full-attention layers keep rope_theta and rope_scaling. 0: every layer alike.
  float rope_local_theta = 0.0f;
  // Gemma's attention scale query_pre_attn_scalar^-0.5 (0: the head size's), and tanh soft-caps of
  // the attention scores and of the final logits, cap * tanh(x / cap) (0: none).
  float query_pre_attn_scalar = 0.0f, attn_softcap = 0.0f, final_softcap = 0.0f;
  // "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2" or "gemma3_text" for a LLaMA-architecture
  // model ("" = llama)
  std::string model_type = "";
  int head_dim = 0;                 // head_dim of the config; 0: d_model / n_head (head_size())
  // biases: q/k/v (GPT-2's c_attn; attention_bias, and always in Qwen2), o (c_proj; attention_bias),
  // and the MLP's (c_fc and c_proj; gate/up/down with mlp_bias)
  bool qkv_bias = false, o_bias = false, mlp_bias = false;
  int sliding_window = 0;           // the config's sliding_window (Mistral, Qwen2); 0 = none
  // Each layer's attention window (sliding_window on the layers that slide: Mistral's every layer,
  // Qwen2's layer_types or max_window_layers), 0 for full causal attention; empty: every layer full.
  std::vector<int> layer_window;
  bool tied_embeddings = true;      // tie_word_embeddings (GPT-2's default true, LLaMA's false)
  // initializer_range: the normal init's standard deviation (random init only; not written back, as it
  // says nothing about trained weights)
  float init_std = 0.02f;
  // Dropout probabilities, where transformers applies them: GPT-2's embd_pdrop (after wte + wpe),
  // attn_pdrop (attention probabilities), resid_pdrop (each residual branch's output); LLaMA's
  // attention_dropout (attention probabilities). Training only.
  float embd_pdrop = 0.0f, attn_pdrop = 0.0f, resid_pdrop = 0.0f;
  int bos_token_id = -1;             // copied to config.json when known
  // eos_token_id: one id, or several (Llama 3.1 Instruct's [128001, 128008, 128009]); empty when unknown
  std::vector<int> eos_token_ids;
  MoeConfig moe;                     // mixtral, qwen2_moe, qwen3_moe
  // The config.json this was read from (null for a preset): saved models write its keys back in its
  // form (config_to_save), those llmt does not use included.
  nlohmann::json source;

  // whether layer l's MLP is a mixture of experts (MoeConfig's layer pattern)
  bool moe_layer(int l) const;
  int moe_layers() const;  // how many are
  int head_size() const { return head_dim > 0 ? head_dim : d_model / n_head; }
  // the channels of a head that rotate: int(head_size * partial_rotary_factor), as transformers
  int rotary_dim() const { return (int)((double)head_size() * partial_rotary_factor); }
  // longrope's multiplier of cos and sin: attention_factor, or sqrt(1 + ln(factor) / ln(original))
  // with factor the file's or max_position_embeddings / original (1 where factor <= 1)
  float longrope_attention_factor() const;
  // layer l's attention window: a query sees itself and the window - 1 keys before it; 0 = no window
  int window(int l) const { return layer_window.empty() ? 0 : layer_window[(size_t)l]; }
  bool has_dropout() const { return embd_pdrop > 0.0f || attn_pdrop > 0.0f || resid_pdrop > 0.0f; }
  int qkv_dim() const { return (n_head + 2 * n_kv_head) * head_size(); }
  int q_dim() const { return n_head * head_size(); }  // attention's width: q_proj's out, o_proj's in
  bool gated_mlp() const { return family.mlp == MlpKind::swiglu || family.mlp == MlpKind::geglu; }
  int mlp_in_dim() const { return gated_mlp() ? 2 * d_ff : d_ff; }  // [gate | up] for SwiGLU and GeGLU
  const char* arch_name() const { return arch == Arch::gpt2 ? "gpt2" : "llama"; }
  // transformers' class of one block (GPT2Block, LlamaDecoderLayer, Qwen3DecoderLayer, ...), as
  // --fsdp_transformer_layer_cls_to_wrap names it
  std::string decoder_layer_class() const;
  std::string describe() const;
};

// A config of the base family `arch` names (GPT-2 or LLaMA, switches and biases set as theirs), sizes
// left zero: for models built by hand (tests); config.cpp starts every family from one of these.
ModelConfig base_config(Arch arch);
// Names accepted by config_from_preset, in the order `llmt` lists them.
std::vector<std::string> preset_names();
ModelConfig config_from_preset(const std::string& name);  // throws for an unknown name
// Reads a Hugging Face config.json (model_type gpt2, llama, mistral, qwen2, qwen3, phi3, gemma2 or
// gemma3_text); errors name the file and the key.
// A JSON file read whole and parsed after the depth check; `what` ("model config") names it when it
// cannot be opened, and the path names it when it is malformed.
nlohmann::json read_json_file(const std::string& path, const char* what);
ModelConfig config_from_json_file(const std::string& path);
ModelConfig config_from_json(const nlohmann::json& j, const std::string& source);
// The model as llmt computes it, as config.json keys: what checkpoints record and compare (the same
// on every rank and after a round trip through a saved config.json).
nlohmann::json config_to_hf_json(const ModelConfig& cfg);
// The config.json a saved model is written with: the source's keys in the source's form (1e-06 stays
// 1e-06; use_cache, head_dim, reorder_and_upcast_attn and the rest kept), llmt's own where it has no
// such key or says otherwise, llmt's floats as the decimals they stand for, and torch_dtype (and
// transformers 5's dtype, when the source has it) naming the saved weights' dtype.
nlohmann::json config_to_save(const ModelConfig& cfg, const std::string& torch_dtype);
// A preset name, a config.json path, or a directory holding config.json.
ModelConfig resolve_model_config(const std::string& name_or_path);
void validate_config(const ModelConfig& cfg, const std::string& source);

}  // namespace llmt
