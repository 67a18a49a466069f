// Parameter layouts of every family (engine/params/layout.h): unit 0 is the root (embeddings,
// final norm, head), unit 1 + l is transformer block l, each tensor under its Hugging Face name.
//
// Matrices are stored [out, in] (y = x W^T). Hugging Face GPT-2 keeps its Conv1D weights
// [in, out]; those specs are marked hf_transposed and transposed on load and save. LLaMA's
// q/k/v projections sit back to back so attention runs one fused [q|k|v] matmul, and gate/up
// likewise form one [gate|up] matmul for SwiGLU.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/params/layout.h"
#include "models/config.h"

namespace llmt {

// Offsets of a block's tensors inside its unit (-1 where the family has none, e.g. LLaMA biases).
// Which exist is the config's switches (Family, the bias flags); their names, its Arch.
struct BlockOffsets {
  int64_t ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, attn_proj_w = -1, attn_proj_b = -1;
  int64_t ln2_w = -1, ln2_b = -1, mlp_in_w = -1, mlp_in_b = -1, mlp_out_w = -1, mlp_out_b = -1;
  int64_t q_norm_w = -1, k_norm_w = -1;  // the per-head q and k RMSNorm weights [head_dim] (qk_norm)
  // sandwich_norms: the norms on the attention and MLP branches' outputs (Gemma's
  // post_attention_layernorm and post_feedforward_layernorm; ln2 is then pre_feedforward_layernorm)
  int64_t post_attn_norm_w = -1, post_mlp_norm_w = -1;
};
// A mixture-of-experts block's tensors (models/moe.h), after the attention part and ln2 (which sit
// as in a dense block): the router [E, C]; each expert's [gate | up] [2 I, C] (w1 | w3 in Mixtral's
// names) at mlp_in_w + e * in_stride, its down [C, I] at mlp_out_w + e * out_stride; Qwen2-MoE's
// shared expert ([gate | up] [2 Is, C], down [C, Is]) and its gate [1, C]. -1 where absent.
struct MoeOffsets {
  int64_t router_w = -1, mlp_in_w = -1, in_stride = 0, mlp_out_w = -1, out_stride = 0;
  int64_t shared_in_w = -1, shared_out_w = -1, shared_gate_w = -1;
};
// Offsets inside the root unit; lm_head == wte when the embeddings are tied.
struct RootOffsets {
  int64_t wte = -1, wpe = -1, lnf_w = -1, lnf_b = -1, lm_head = -1;
};

// The engine's ParamLayout plus where the family's tensors sit, for the model's forward and backward.
struct ModelLayout : ParamLayout {
  // the same in every block: the attention part and ln2 everywhere, the dense MLP's in dense blocks
  BlockOffsets block;
  MoeOffsets moe;  // the same in every MoE block (ModelConfig::moe_layer)
  RootOffsets root;
};

ModelLayout make_layout(const ModelConfig& cfg);

}  // namespace llmt
