// llmt train's arguments, with the Hugging Face TrainingArguments names, and the one table of its
// flags: it reads them (parse_train_args), prints `llmt train --help`, and writes the README's
// flag list (`llmt train --help-markdown`; a test keeps the README equal to it).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "engine/dist/agree.h"
#include "engine/core/tensor.h"
#include "train/flags.h"

namespace llmt {

// The parts of a run's configuration that more than one command takes. A command's arguments
// inherit the parts it takes (llmt train's all of them, llmt bench's these three, llmt plan reads them), and each part is
// read by llmt train's one flag table (read_parallelism, read_precision): every flag is named,
// read, checked and documented once.
struct ParallelismConfig {
  std::string device = "cpu";
  int threads = 0;                   // CPU threads per rank; 0 = this rank's share of the node's cores
  std::string ddp_backend;           // nccl, mpi, or "" (nccl on GPUs when each rank has its own, else mpi)
  double ddp_timeout = 1800;         // seconds a collective may take before the watchdog ends the job (HF's default)
  std::string fsdp;                  // "full_shard auto_wrap", "shard_grad_op", "hybrid_shard", "no_shard" ("" = no_shard)
  int hybrid_shard_group_size = 0;   // ranks a hybrid_shard shard spans; 0 = the ranks of a node
  bool gradient_checkpointing = false;
  int logits_chunk_tokens = 0;       // LM head and loss over this many tokens at a time; 0 = the whole micro-batch
};

struct PrecisionConfig {
  bool bf16 = false;                       // bf16 compute copy, gathers and activations (fp32 master, moments)
  bool tf32 = false;
  std::string mixed_precision_reduce = "float32";  // gradients reduced in float32 or bfloat16 (torchtitan's name)
};

// LoRA, as TRL's ModelConfig names it (--use_peft True): the base frozen, PEFT's adapter trained
struct LoraArgs {
  bool use_peft = false;
  int lora_r = 16;
  double lora_alpha = 32;
  double lora_dropout = 0.05;
  std::string lora_target_modules;         // space/comma list; one entry is PEFT's regular expression; "" = PEFT's default
  std::string lora_modules_to_save;        // space/comma list (lm_head)
  bool use_rslora = false;
  std::string adapter_name_or_path;        // a PEFT adapter directory to continue training
};

struct TrainArgs : ParallelismConfig, PrecisionConfig, LoraArgs {
  std::string model_name_or_path;    // a Hugging Face directory: config.json + safetensors (+ tokenizer)
  std::string model_config;          // or a preset name / config.json, randomly initialised
  std::string tokenizer_name_or_path;  // default: model_name_or_path; "bytes" = byte-level
  std::string llama3_special_tokens = "auto";  // names of a bare Llama 3 tokenizer.model's specials: auto, 3.0, 3.1
  DataArgs data;
  bool packing = false;              // whole examples packed into rows of model_max_length (TRL's SFTConfig)
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
  std::string lr_scheduler_kwargs;   // JSON: {"num_cycles": 2} / {"lr_end": 1e-6, "power": 2}
  std::string optim = "adamw_torch";  // the AdamW variants only
  double warmup_ratio = 0.0;
  int64_t warmup_steps = 0;
  int logging_steps = 500;
  std::string logging_strategy = "steps";  // steps, epoch, no
  bool logging_first_step = false;
  int throughput_warmup_steps = 0;   // steps left out of the throughput summary
  double straggler_threshold = 0.15;  // name a rank whose compute is this far above the median (0: never)
  bool report_tensorboard = false;   // --report_to tensorboard|all
  std::string logging_dir;           // TensorBoard's; "" = output_dir/runs/<date>_<host>
  std::string fsdp_transformer_layer_cls_to_wrap;  // GPT2Block / LlamaDecoderLayer
  bool do_eval = false;
  std::string evaluation_strategy = "no";  // no, steps, epoch
  int64_t eval_steps = 0;
  std::string save_strategy = "steps";     // no, steps, epoch (Hugging Face's default is steps)
  int64_t save_steps = 500;
  int save_total_limit = 0;                // 0 = keep every checkpoint
  std::string resume_from_checkpoint;      // a checkpoint directory, or "latest" / "True"
  bool overwrite_output_dir = false;       // train into an output_dir that holds checkpoints
  bool ignore_data_skip = false;           // resume with data other than the checkpoint's (refused otherwise)
  bool save_only_model = false;            // checkpoints without the training state (they cannot be resumed)
  uint64_t seed = 42;
  std::string torch_dtype;                 // dtype of saved models: float32 (unset), bfloat16, float16, auto
  std::string deepspeed;                   // --deepspeed FILE (or inline JSON): applied to the members above
  std::string deepspeed_summary;           // what was taken from it, for the log (train/deepspeed_config.h)
  int64_t deepspeed_train_batch_size = 0;  // its train_batch_size, checked once the world is known (0: none)
};

// One flag of llmt train: how --help and the README describe it, and how it is read.
struct TrainFlag {
  const char* name;
  const char* group;  // the heading it is listed under
  const char* value;  // what it takes: DIR, N, X, True|False, a|b|c ("" for a flag that is accepted and ignored)
  const char* help;
  void (*read)(Flags& flags, const char* name, TrainArgs& args);
  std::string (*show)(const TrainArgs& args);  // its value, to print the default (nullptr: none worth printing)
};
const std::vector<TrainFlag>& train_flags();

// The resolved values every rank must share, for check_ranks_agree (engine/dist/agree.h): each
// member of TrainArgs except the few a rank may set for itself (threads, tokenizing workers, cache).
ConfigFields train_config_fields(const TrainArgs& args);

// A part's flags from train's table, its own values the defaults, checked as llmt train checks them.
void read_parallelism(Flags& flags, ParallelismConfig& part);
void read_precision(Flags& flags, PrecisionConfig& part);
// The LoRA flags (--use_peft, --lora_*, --adapter_name_or_path, and PEFT's options llmt refuses),
// checked as llmt train checks them on their own.
void read_lora(Flags& flags, LoraArgs& part);

// --threads: 0 (this rank's share of the node's cores) to the node's CPUs, else an error; every
// command that takes it checks it here.
void check_threads(int threads);

// Reads every train flag from `flags` and checks the values (then flags.finish() rejects the rest).
TrainArgs parse_train_args(Flags& flags);
std::string train_help();           // llmt train --help
std::string train_flags_markdown();  // the README's flag list

// The run's optimizer steps: --max_steps, or --num_train_epochs passes of steps_per_epoch, checked
// to be at least one and countable (steps x global_batch sequences within 2^53).
int64_t total_train_steps(const TrainArgs& args, int64_t steps_per_epoch, int64_t global_batch);

// --lora_target_modules / --lora_modules_to_save: the names of a space- or comma-separated list.
std::vector<std::string> split_name_list(const std::string& list);

// --mixed_precision_reduce: float32 (default) or bfloat16.
DType parse_reduce_dtype(const std::string& name);

}  // namespace llmt
