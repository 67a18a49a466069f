// Where every parameter lives: one flat fp32 buffer per FSDP unit (unit 0 is the root:
// embeddings, final norm, head; unit 1 + l is transformer block l), each tensor at a fixed
// offset, with the Hugging Face name it is saved and loaded under.
//
// Matrices are stored [out, in] (y = x W^T). Hugging Face GPT-2 keeps its Conv1D weights
// [in, out]; those specs are marked hf_transposed and transposed on load and save. LLaMA's
// q/k/v projections sit back to back so attention runs one fused [q|k|v] matmul, and gate/up
// likewise form one [gate|up] matmul for SwiGLU.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/config.h"

namespace llmt {

struct ParamSpec {
  std::string hf_name;          // full Hugging Face name, e.g. transformer.h.0.attn.c_attn.weight
  int64_t offset = 0;           // in floats, inside the unit's flat buffer
  std::vector<int64_t> shape;   // as llmt stores it
  bool hf_transposed = false;   // the Hugging Face file holds the transpose (GPT-2 Conv1D)
  bool decay = true;            // AdamW weight decay applies (not to biases and norm weights)
  int64_t numel() const;
  std::vector<int64_t> hf_shape() const;
};

struct UnitLayout {
  std::string name;  // "root", "block.0", ...
  std::vector<ParamSpec> params;
  int64_t numel = 0;
};

// Offsets of a block's tensors inside its unit (-1 where the family has none, e.g. LLaMA biases).
struct BlockOffsets {
  int64_t ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, attn_proj_w = -1, attn_proj_b = -1;
  int64_t ln2_w = -1, ln2_b = -1, mlp_in_w = -1, mlp_in_b = -1, mlp_out_w = -1, mlp_out_b = -1;
};
// Offsets inside the root unit; lm_head == wte when the embeddings are tied.
struct RootOffsets {
  int64_t wte = -1, wpe = -1, lnf_w = -1, lnf_b = -1, lm_head = -1;
};

struct ModelLayout {
  std::vector<UnitLayout> units;  // [root, block.0, ..., block.L-1]
  BlockOffsets block;             // the same in every block
  RootOffsets root;
  int64_t total_numel = 0;
  int64_t matmul_numel = 0;       // weights used in a matrix product (the LM head once): for MFU
};

ModelLayout make_layout(const ModelConfig& cfg);

}  // namespace llmt
