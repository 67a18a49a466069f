// Where every parameter lives: one flat buffer per FSDP unit, each tensor at a fixed element offset,
// with the name it is saved and loaded under. The engine shards, gathers, steps and checkpoints
// units through this description alone; a model family (models/) fills it in.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace llmt {

struct ParamSpec {
  std::string hf_name;          // full Hugging Face name, e.g. transformer.h.0.attn.c_attn.weight
  int64_t offset = 0;           // in elements, inside the unit's flat buffer
  std::vector<int64_t> shape;   // as llmt stores it
  bool hf_transposed = false;   // the Hugging Face file holds the transpose (GPT-2 Conv1D)
  bool decay = true;            // AdamW weight decay applies (not to biases and norm weights)
  int64_t numel() const;
  std::vector<int64_t> hf_shape() const;
};

// Every tensor of a unit starts at a multiple of kParamAlign elements (16 bytes in bf16, 32 in f32),
// so each one's data is 16-byte aligned wherever the unit's buffer is (cuBLASLt's fast kernels, the
// CUDA kernels' 16-byte loads); the gaps hold zeros that no gradient or step ever changes.
constexpr int64_t kParamAlign = 8;

struct UnitLayout {
  std::string name;  // "root", "block.0", ...
  std::vector<ParamSpec> params;
  int64_t numel = 0;  // the unit's flat size, the alignment gaps included
  // Appends a tensor at the next aligned offset and returns its offset.
  int64_t add(const std::string& hf_name, std::vector<int64_t> shape, bool decay, bool hf_transposed = false);
  // Appends a tensor right after the previous one, with no gap: the next part of one fused matrix
  // (LLaMA's [q | k | v], [gate | up]).
  int64_t extend(const std::string& hf_name, std::vector<int64_t> shape, bool decay, bool hf_transposed = false);
};

struct ParamLayout {
  std::vector<UnitLayout> units;  // unit 0 is the root (embeddings, final norm, head), then one per block
  int64_t total_numel = 0;        // the parameters (the units' alignment gaps not counted)
  int64_t matmul_numel = 0;       // weights used in a matrix product (the LM head once): for MFU
};

}  // namespace llmt
