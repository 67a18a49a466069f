// Hugging Face checkpoints: a model directory's config.json and safetensors weights, mapped
// onto llmt's per-unit flat buffers (models/layout.h) by Hugging Face tensor name.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/formats/safetensors.h"
#include "models/config.h"
#include "models/layout.h"

namespace llmt {

// Checks that the checkpoint holds exactly the tensors the layout needs (known extras, such as
// GPT-2's attn.bias buffers or a tied lm_head.weight, are skipped) with the right shapes;
// errors name the tensor and the file.
void check_hf_tensors(const SafetensorsCheckpoint& ckpt, const ModelConfig& cfg, const ModelLayout& layout,
                      const std::string& dir);
// Reads unit `unit`'s tensors into `host` (layout.units[unit].numel floats), converting F32, BF16
// or F16 to f32 and transposing GPT-2 Conv1D weights.
void load_hf_unit(const SafetensorsCheckpoint& ckpt, const ModelConfig& cfg, const ModelLayout& layout, int unit,
                  float* host);
// A Hugging Face export written one unit at a time (so the whole model never sits in memory at
// once): write_unit for every unit in any order, then finish(), which completes the weights and only
// then writes config.json (config_to_save), so a save that fails leaves no directory that looks like a
// model. Weights as save_pretrained writes them: model.safetensors, split at max_shard_bytes with an index.
class HfExporter {
 public:
  HfExporter(const std::string& dir, const ModelConfig& cfg, const ModelLayout& layout, const std::string& dtype,
             uint64_t max_shard_bytes = 5000000000ull);
  void write_unit(int unit, const float* host);  // layout.units[unit].numel floats
  void finish();

 private:
  std::string dir_;
  const ModelLayout& layout_;
  std::string dtype_;
  nlohmann::json config_;  // written by finish()
  std::vector<std::vector<size_t>> entry_of_;  // [unit][param] -> writer entry
  std::unique_ptr<SafetensorsModelWriter> writer_;
};

// Writes dir/config.json and dir/model.safetensors (split at max_shard_bytes with an index, as
// save_pretrained does) from the units' host buffers; dtype "F32", "BF16" or "F16".
void save_hf_model(const std::string& dir, const ModelConfig& cfg, const ModelLayout& layout,
                   const std::vector<const float*>& unit_host, const std::string& dtype,
                   uint64_t max_shard_bytes = 5000000000ull);
// Copies the tokenizer files a Hugging Face directory carries (tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, vocab.json, merges.txt, tokenizer.model, added_tokens.json) from src_dir
// into dst_dir; a missing one is skipped. Returns how many were copied.
int copy_tokenizer_files(const std::string& src_dir, const std::string& dst_dir);
// Writes dst_dir/generation_config.json as save_pretrained does beside a causal LM: src_dir's (an
// instruct model's EOS ids, its sampling defaults) when src_dir is given and has one, else the one
// transformers derives from the config (GenerationConfig.from_model_config: its BOS and EOS ids).
// Returns whether it copied src_dir's.
bool write_generation_config(const std::string& src_dir, const std::string& dst_dir, const ModelConfig& cfg);

}  // namespace llmt
