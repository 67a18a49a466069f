// A LoRA run (--use_peft True) on a session whose model store is frozen: PEFT's config from TRL's
// flags (or an adapter's adapter_config.json), the adapter's units in an FsdpStore of their own with
// the run's strategy (trained: gradients, AdamW), and the hook that puts them on the model
// (models/lora.h). The trainer builds it, hands its store to train_step and saves it at the end.
#pragma once
#include <memory>
#include <string>

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
};

// The adapter for a session whose base parameters are loaded: from --adapter_name_or_path, or fresh
// (PEFT's init, seeded by --seed), set on the session's model. Collective over the session's ranks.
std::unique_ptr<LoraRun> start_lora(const TrainArgs& a, Session& session, const ModelConfig& cfg);

// output_dir as PEFT's save_pretrained leaves it (adapter_config.json, adapter_model.safetensors) plus
// the tokenizer's files. Collective; rank 0 writes; every rank learns of an error.
void save_lora(ControlComm& world, LoraRun& run, const std::string& dir, const std::string& tokenizer_dir);

}  // namespace llmt
