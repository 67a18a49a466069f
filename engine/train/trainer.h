// The training loop: one process for now (FSDP over MPI arrives with the distributed issue).
// Arguments carry the Hugging Face TrainingArguments names.
#pragma once
#include <cstdint>
#include <string>

#include "engine/train/flags.h"

namespace llmt {

struct TrainArgs {
  std::string device = "cpu";
  int threads = 0;                   // CPU threads; 0 = every core
  std::string model_name_or_path;    // a Hugging Face directory: config.json + safetensors
  std::string model_config;          // or a preset name / config.json, randomly initialised
  std::string train_file;            // plain text, byte-level tokens
  std::string output_dir;
  int64_t max_steps = -1;            // > 0 overrides num_train_epochs
  double num_train_epochs = 3.0;
  int per_device_train_batch_size = 8;
  int gradient_accumulation_steps = 1;
  int block_size = 0;                // 0: min(1024, the model's context)
  double learning_rate = 5e-5;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;
  std::string lr_scheduler_type = "linear";
  double warmup_ratio = 0.0;
  int64_t warmup_steps = 0;
  int logging_steps = 500;
  uint64_t seed = 42;
  bool bf16 = false;
  bool tf32 = false;
};

// Reads every train flag llmt implements from `flags` (then flags.finish() rejects the rest).
TrainArgs parse_train_args(Flags& flags);
void run_training(const TrainArgs& args);

}  // namespace llmt
