#include "models/layout.h"

#include "engine/core/error.h"

namespace llmt {

ModelLayout make_layout(const ModelConfig& c) {
  ModelLayout L;
  const int64_t C = c.d_model, V = c.vocab_size, F = c.d_ff, hs = c.head_size();
  const int64_t q_dim = (int64_t)c.n_head * hs, kv_dim = (int64_t)c.n_kv_head * hs;

  UnitLayout root;
  root.name = "root";
  if (c.arch == Arch::gpt2) {
    L.root.wte = root.add("transformer.wte.weight", {V, C}, true);
    L.root.wpe = root.add("transformer.wpe.weight", {c.max_seq_len, C}, true);
    L.root.lnf_w = root.add("transformer.ln_f.weight", {C}, false);
    L.root.lnf_b = root.add("transformer.ln_f.bias", {C}, false);
    // GPT2LMHeadModel's lm_head.weight: wte's own storage unless tie_word_embeddings is false
    L.root.lm_head = c.tied_embeddings ? L.root.wte : root.add("lm_head.weight", {V, C}, true);
  } else {
    L.root.wte = root.add("model.embed_tokens.weight", {V, C}, true);
    L.root.lnf_w = root.add("model.norm.weight", {C}, false);
    L.root.lm_head = c.tied_embeddings ? L.root.wte : root.add("lm_head.weight", {V, C}, true);
  }
  L.units.push_back(root);

  for (int l = 0; l < c.n_layer; l++) {
    UnitLayout u;
    u.name = "block." + std::to_string(l);
    BlockOffsets b;
    if (c.arch == Arch::gpt2) {
      std::string p = "transformer.h." + std::to_string(l) + ".";
      b.ln1_w = u.add(p + "ln_1.weight", {C}, false);
      b.ln1_b = u.add(p + "ln_1.bias", {C}, false);
      b.qkv_w = u.add(p + "attn.c_attn.weight", {3 * C, C}, true, true);
      b.qkv_b = u.add(p + "attn.c_attn.bias", {3 * C}, false);
      b.attn_proj_w = u.add(p + "attn.c_proj.weight", {C, C}, true, true);
      b.attn_proj_b = u.add(p + "attn.c_proj.bias", {C}, false);
      b.ln2_w = u.add(p + "ln_2.weight", {C}, false);
      b.ln2_b = u.add(p + "ln_2.bias", {C}, false);
      b.mlp_in_w = u.add(p + "mlp.c_fc.weight", {F, C}, true, true);
      b.mlp_in_b = u.add(p + "mlp.c_fc.bias", {F}, false);
      b.mlp_out_w = u.add(p + "mlp.c_proj.weight", {C, F}, true, true);
      b.mlp_out_b = u.add(p + "mlp.c_proj.bias", {C}, false);
    } else {
      std::string p = "model.layers." + std::to_string(l) + ".";
      b.ln1_w = u.add(p + "input_layernorm.weight", {C}, false);
      b.qkv_w = u.add(p + "self_attn.q_proj.weight", {q_dim, C}, true);
      u.extend(p + "self_attn.k_proj.weight", {kv_dim, C}, true);  // follows q: one fused [q|k|v] matrix
      u.extend(p + "self_attn.v_proj.weight", {kv_dim, C}, true);
      if (c.qkv_bias) {  // likewise one fused [q|k|v] bias
        b.qkv_b = u.add(p + "self_attn.q_proj.bias", {q_dim}, false);
        u.extend(p + "self_attn.k_proj.bias", {kv_dim}, false);
        u.extend(p + "self_attn.v_proj.bias", {kv_dim}, false);
      }
      b.attn_proj_w = u.add(p + "self_attn.o_proj.weight", {C, q_dim}, true);
      if (c.o_bias) b.attn_proj_b = u.add(p + "self_attn.o_proj.bias", {C}, false);
      b.ln2_w = u.add(p + "post_attention_layernorm.weight", {C}, false);
      b.mlp_in_w = u.add(p + "mlp.gate_proj.weight", {F, C}, true);
      u.extend(p + "mlp.up_proj.weight", {F, C}, true);  // follows gate: one fused [gate|up] matrix
      if (c.mlp_bias) {
        b.mlp_in_b = u.add(p + "mlp.gate_proj.bias", {F}, false);
        u.extend(p + "mlp.up_proj.bias", {F}, false);
      }
      b.mlp_out_w = u.add(p + "mlp.down_proj.weight", {C, F}, true);
      if (c.mlp_bias) b.mlp_out_b = u.add(p + "mlp.down_proj.bias", {C}, false);
    }
    L.block = b;
    L.units.push_back(u);
  }

  for (auto& u : L.units)
    for (auto& p : u.params) L.total_numel += p.numel();
  // Matmul weights: every block matrix, plus the LM head once (the embedding lookup is no matmul).
  for (size_t i = 1; i < L.units.size(); i++)
    for (auto& p : L.units[i].params)
      if (p.shape.size() == 2) L.matmul_numel += p.numel();
  L.matmul_numel += V * C;
  return L;
}

}  // namespace llmt
