// A LoRA run (--use_peft True) on a session whose model store is frozen: PEFT's config from TRL's
// flags (or an adapter's adapter_config.json), the adapter's units in an FsdpStore of their own with
// the run's strategy (trained: gradients, AdamW), and the hook that puts them on the model
// (models/lora.h). The trainer builds it, hands its store to train_step and saves it at the end.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/fsdp/fsdp.h"
#include "models/lora.h"
#include "train/session.h"
#include "train/train_args.h"

namespace llmt {

// TRL's ModelConfig flags as the LoraConfig TRL hands PEFT: a one-entry --lora_target_modules becomes
// PEFT's string form (a regular expression, or all-linear); unset, PEFT's default for the model type.
LoraConfig lora_config_from_args(const LoraArgs& a, const ModelConfig& cfg);

// The run's adapter config, resolved against the model: --adapter_name_or_path's adapter_config.json,
// else TRL's flags (lora_config_from_args). What start_lora trains and what the plan counts.
LoraConfig lora_run_config(const LoraArgs& a, const ModelConfig& cfg);

struct LoraRun {
  LoraConfig config;
  LoraLayout layout;
  std::unique_ptr<FsdpStore> store;
  std::unique_ptr<LoraAdapters> hook;
  ModelConfig base_config;  // the frozen base model's
  std::string base_dir;     // --model_name_or_path, read again on resume
  std::string identity;     // lora_state_identity's, once made
};

// The files every checkpoint of a LoRA run holds besides state.h5: PEFT's adapter directory (as the
// Hugging Face Trainer's checkpoints of a PeftModel) and trainer_state.json.
extern const std::vector<std::string> kLoraCheckpointRequiredFiles;

// What a LoRA checkpoint's training state belongs to, as the config JSON state.h5 records and
// compares on resume (engine/ckpt/train_state.h's config_diff names each key that differs): the base
// model's config.json keys, "lora <field>" for the adapter_config.json fields that shape the training
// (not base_model_name_or_path: the same base may move), and "base model weights <file>" with each
// weight file's size and CRC-32C (each rank hashes a slice of every file; the pieces are combined).
// Made on first use and kept in run.identity. Collective.
const std::string& lora_state_identity(ControlComm& world, LoraRun& run);

// The adapter for a session whose base parameters are loaded: from --adapter_name_or_path, or fresh
// (PEFT's init, seeded by --seed), set on the session's model. Collective over the session's ranks.
std::unique_ptr<LoraRun> start_lora(const TrainArgs& a, Session& session, const ModelConfig& cfg);

// output_dir as PEFT's save_pretrained leaves it (adapter_config.json, adapter_model.safetensors) plus
// the tokenizer's files. Collective; rank 0 writes; every rank learns of an error.
void save_lora(ControlComm& world, LoraRun& run, const std::string& dir, const std::string& tokenizer_dir);

}  // namespace llmt
