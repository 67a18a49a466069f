#include "models/layout.h"

#include "engine/core/error.h"
#include "models/moe.h"

namespace llmt {

ModelLayout make_layout(const ModelConfig& c) {
  ModelLayout L;
  const int64_t C = c.d_model, V = c.vocab_size, F = c.d_ff, hs = c.head_size();
  const int64_t q_dim = (int64_t)c.n_head * hs, kv_dim = (int64_t)c.n_kv_head * hs;

  // Which tensors exist is the family's switches; their names, the naming scheme's (Arch).
  const bool gpt2_names = c.arch == Arch::gpt2;
  const bool ln = c.family.norm == NormKind::layernorm;  // a norm with a bias
  const bool glu = c.gated_mlp();                        // [gate | up]: two matrices in one
  UnitLayout root;
  root.name = "root";
  const std::string rp = gpt2_names ? "transformer." : "model.";
  L.root.wte = root.add(rp + (gpt2_names ? "wte.weight" : "embed_tokens.weight"), {V, C}, true);
  if (c.family.learned_positions) L.root.wpe = root.add(rp + "wpe.weight", {c.max_seq_len, C}, true);
  const std::string lnf = rp + (gpt2_names ? "ln_f." : "norm.");
  L.root.lnf_w = root.add(lnf + "weight", {C}, false);
  if (ln) L.root.lnf_b = root.add(lnf + "bias", {C}, false);
  // lm_head.weight: wte's own storage unless tie_word_embeddings is false
  L.root.lm_head = c.tied_embeddings ? L.root.wte : root.add("lm_head.weight", {V, C}, true);
  L.units.push_back(root);

  // Hugging Face names of a block's tensors: GPT-2's Conv1D weights are stored [in, out] (hf_transposed)
  struct Names {
    const char *ln1, *q, *k, *v, *qkv, *q_norm, *k_norm, *o, *ln2, *gate, *up, *gate_up, *fc, *down;
  };
  static const Names gpt2_n = {"ln_1.",  nullptr, nullptr, nullptr, "attn.c_attn.", nullptr,    nullptr,
                               "attn.c_proj.", "ln_2.", nullptr, nullptr, nullptr,   "mlp.c_fc.", "mlp.c_proj."};
  static const Names llama_n = {"input_layernorm.", "self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj.",
                                "self_attn.qkv_proj.", "self_attn.q_norm.", "self_attn.k_norm.", "self_attn.o_proj.",
                                "post_attention_layernorm.", "mlp.gate_proj.", "mlp.up_proj.", "mlp.gate_up_proj.",
                                nullptr, "mlp.down_proj."};
  Names n = gpt2_names ? gpt2_n : llama_n;
  // Gemma's names: post_attention_layernorm is the attention branch's output norm, not LLaMA's pre-MLP
  // norm, which is pre_feedforward_layernorm there
  const char *post_attn = nullptr, *post_mlp = nullptr;
  if (c.family.sandwich_norms) {
    LLMT_CHECK(!gpt2_names, "make_layout: the gpt2 names have no sandwich norms");
    n.ln2 = "pre_feedforward_layernorm.";
    post_attn = "post_attention_layernorm.", post_mlp = "post_feedforward_layernorm.";
  }
  const bool tr = gpt2_names;  // hf_transposed
  LLMT_CHECK(c.family.fused_qkv_tensor ? n.qkv != nullptr : n.q != nullptr,
             "make_layout: the %s names have no %s q/k/v projection", c.arch_name(),
             c.family.fused_qkv_tensor ? "fused" : "split");
  LLMT_CHECK(!glu || (c.family.fused_gate_up_tensor ? n.gate_up : n.gate), "make_layout: the %s names have no %s "
             "gate/up projection", c.arch_name(), c.family.fused_gate_up_tensor ? "fused" : "split");
  LLMT_CHECK(glu || n.fc, "make_layout: the %s names have no GELU MLP", c.arch_name());
  for (int l = 0; l < c.n_layer; l++) {
    UnitLayout u;
    u.name = "block." + std::to_string(l);
    BlockOffsets b;
    const std::string p = (gpt2_names ? "transformer.h." : "model.layers.") + std::to_string(l) + ".";
    auto W = [&](const char* m) { return p + m + "weight"; };
    auto Bi = [&](const char* m) { return p + m + "bias"; };
    b.ln1_w = u.add(W(n.ln1), {C}, false);
    if (ln) b.ln1_b = u.add(Bi(n.ln1), {C}, false);
    if (c.family.fused_qkv_tensor) {  // one fused [q|k|v] matrix in the file
      b.qkv_w = u.add(W(n.qkv), {q_dim + 2 * kv_dim, C}, true, tr);
      if (c.qkv_bias) b.qkv_b = u.add(Bi(n.qkv), {q_dim + 2 * kv_dim}, false);
    } else {  // q, k, v back to back: one fused [q|k|v] matrix here
      b.qkv_w = u.add(W(n.q), {q_dim, C}, true, tr);
      u.extend(W(n.k), {kv_dim, C}, true, tr);
      u.extend(W(n.v), {kv_dim, C}, true, tr);
      if (c.qkv_bias) {  // likewise one fused [q|k|v] bias
        b.qkv_b = u.add(Bi(n.q), {q_dim}, false);
        u.extend(Bi(n.k), {kv_dim}, false);
        u.extend(Bi(n.v), {kv_dim}, false);
      }
    }
    if (c.family.qk_norm) {  // one weight over each head of q, one over each head of k
      LLMT_CHECK(n.q_norm, "make_layout: %s names no q/k norms", c.arch_name());
      b.q_norm_w = u.add(W(n.q_norm), {hs}, false);
      b.k_norm_w = u.add(W(n.k_norm), {hs}, false);
    }
    b.attn_proj_w = u.add(W(n.o), {C, q_dim}, true, tr);
    if (c.o_bias) b.attn_proj_b = u.add(Bi(n.o), {C}, false);
    if (post_attn) b.post_attn_norm_w = u.add(W(post_attn), {C}, false);
    b.ln2_w = u.add(W(n.ln2), {C}, false);
    if (ln) b.ln2_b = u.add(Bi(n.ln2), {C}, false);
    if (c.moe_layer(l)) {  // a mixture of experts in place of the MLP (models/moe.h); the dense offsets stay
      L.moe = add_moe_params(u, c, l);
      const BlockOffsets dense = L.block;
      b.mlp_in_w = dense.mlp_in_w, b.mlp_in_b = dense.mlp_in_b, b.mlp_out_w = dense.mlp_out_w;
      b.mlp_out_b = dense.mlp_out_b;
      L.block = b;
      L.units.push_back(u);
      continue;
    }
    if (glu && c.family.fused_gate_up_tensor) {  // one [gate|up] matrix in the file too
      b.mlp_in_w = u.add(W(n.gate_up), {2 * F, C}, true, tr);
      if (c.mlp_bias) b.mlp_in_b = u.add(Bi(n.gate_up), {2 * F}, false);
    } else if (glu) {  // gate, then up: one fused [gate|up] matrix
      b.mlp_in_w = u.add(W(n.gate), {F, C}, true, tr);
      u.extend(W(n.up), {F, C}, true, tr);
      if (c.mlp_bias) {
        b.mlp_in_b = u.add(Bi(n.gate), {F}, false);
        u.extend(Bi(n.up), {F}, false);
      }
    } else {
      b.mlp_in_w = u.add(W(n.fc), {F, C}, true, tr);
      if (c.mlp_bias) b.mlp_in_b = u.add(Bi(n.fc), {F}, false);
    }
    b.mlp_out_w = u.add(W(n.down), {C, F}, true, tr);
    if (c.mlp_bias) b.mlp_out_b = u.add(Bi(n.down), {C}, false);
    if (post_mlp) b.post_mlp_norm_w = u.add(W(post_mlp), {C}, false);
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
  L.matmul_numel -= moe_inactive_numel(c);  // a token's products: k experts of E
  return L;
}

}  // namespace llmt
