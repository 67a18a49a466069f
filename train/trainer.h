// The training loop: FSDP over a data communicator, gradient accumulation, clipping, AdamW, the LR
// schedule, logging, evaluation and saving. Arguments carry the Hugging Face TrainingArguments names.
#pragma once
#include <cstdint>
#include <string>

#include "data/dataset.h"
#include "engine/dist/communicator.h"
#include "engine/dist/launch.h"
#include "train/flags.h"

namespace llmt {

struct TrainArgs {
  std::string device = "cpu";
  int threads = 0;                   // CPU threads per rank; 0 = this rank's share of the node's cores
  std::string model_name_or_path;    // a Hugging Face directory: config.json + safetensors (+ tokenizer)
  std::string model_config;          // or a preset name / config.json, randomly initialised
  std::string tokenizer_name_or_path;  // default: model_name_or_path; "bytes" = byte-level
  DataArgs data;
  std::string output_dir;
  int64_t max_steps = -1;            // > 0 overrides num_train_epochs
  double num_train_epochs = 3.0;
  int per_device_train_batch_size = 8;
  int per_device_eval_batch_size = 0;  // 0: the train batch size
  int gradient_accumulation_steps = 1;
  double learning_rate = 5e-5;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;
  std::string lr_scheduler_type = "linear";
  double warmup_ratio = 0.0;
  int64_t warmup_steps = 0;
  int logging_steps = 500;
  int throughput_warmup_steps = 0;   // steps left out of the throughput summary
  std::string fsdp;                  // "full_shard auto_wrap", "shard_grad_op", "hybrid_shard", "no_shard" ("" = no_shard)
  std::string fsdp_transformer_layer_cls_to_wrap;  // GPT2Block / LlamaDecoderLayer
  int hybrid_shard_group_size = 0;   // ranks a hybrid_shard shard spans; 0 = the ranks of a node
  bool gradient_checkpointing = false;
  bool do_eval = false;
  std::string evaluation_strategy = "no";  // no, steps, epoch
  int64_t eval_steps = 0;
  std::string save_strategy = "steps";     // no, steps, epoch (Hugging Face's default is steps)
  int64_t save_steps = 500;
  int save_total_limit = 0;                // 0 = keep every checkpoint
  std::string resume_from_checkpoint;      // a checkpoint directory, or "latest" / "True"
  bool overwrite_output_dir = false;       // train into an output_dir that holds checkpoints
  uint64_t seed = 42;
  bool bf16 = false;                       // bf16 compute copy, gathers and activations (fp32 master and moments)
  bool tf32 = false;
  std::string mixed_precision_reduce = "float32";  // what gradients are reduced in: float32 or bfloat16 (torchtitan's name)
};

// --mixed_precision_reduce: float32 (default) or bfloat16.
DType parse_reduce_dtype(const std::string& name);
// Reads every train flag llmt implements from `flags` (then flags.finish() rejects the rest).
TrainArgs parse_train_args(Flags& flags);
// Runs the job on every rank of `world`.
void run_training(const TrainArgs& args, ControlComm& world, const LaunchInfo& launch);

}  // namespace llmt
