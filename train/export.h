// Hugging Face directories from the training state: the one path that writes a model for
// transformers, used by checkpoints, the end of training and `llmt export`.
#pragma once
#include <string>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/dist/launch.h"
#include "engine/fsdp/fsdp.h"
#include "models/config.h"
#include "models/layout.h"

namespace llmt {

// The files every checkpoint the trainer saves holds, besides state.h5 (absent under
// --save_only_model): what checkpoint verification requires the manifest to list.
extern const std::vector<std::string> kCheckpointRequiredFiles;

// Writes dir/model.safetensors (dtype "F32", "BF16" or "F16", split as save_pretrained does) from the
// store's fp32 master weights, one unit at a time, then dir/config.json: every rank takes part in the
// unit's gather, rank 0 writes it; then the tokenizer's files from tokenizer_dir and
// generation_config.json from model_dir ("" for none). A failure on rank 0 (a full disk, a weight
// beyond float16's range) keeps rank 0 in the gathers, and then every rank throws it together: no
// rank is left waiting. Collective over `world`.
void write_hf_model(ControlComm& world, FsdpStore& store, const ModelConfig& cfg, const ModelLayout& layout,
                    const std::string& dir, const std::string& dtype, const std::string& tokenizer_dir,
                    const std::string& model_dir = "");

// `llmt export CHECKPOINT_DIR OUT_DIR`: a Hugging Face directory from a checkpoint's exact training
// state (the fp32 master weights in state.h5), whatever world size wrote it, after verifying its
// checksums. Runs alone or under mpirun.
void run_export(const std::string& checkpoint_dir, const std::string& out_dir, const std::string& dtype,
                ControlComm& world, const LaunchInfo& launch);

// `llmt export SRC OUT_DIR --merge_adapter True`: PEFT's merge_and_unload as a Hugging Face directory.
// SRC is a PEFT adapter directory (adapter_config.json, adapter_model.safetensors) or a LoRA run's
// checkpoint (its checksums verified first); the base is base_dir (--model_name_or_path), else
// adapter_config.json's base_model_name_or_path when that is a directory here; a checkpoint's base is
// checked against the fingerprint its state.h5 records (lora_state_identity), as a resume checks it.
// A modules_to_save copy on a tied base writes an untied model (tie_word_embeddings false,
// lm_head.weight). One process.
void run_merge_adapter_export(const std::string& src, const std::string& base_dir, const std::string& out_dir,
                              const std::string& dtype, ControlComm& world);

}  // namespace llmt
