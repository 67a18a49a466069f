// --deepspeed FILE: a DeepSpeed config, as the Hugging Face Trainer's users pass it, read for what llmt
// has the same thing for, and refused field by field where it would change the run into one llmt
// does not train. docs/config-files.md lists every field and what it becomes.
//
// Mapped (a value "auto" takes the flag's, as the Trainer fills it; a value in the file sets the
// flag, and a flag given with another value is refused, naming both):
//   zero_optimization.stage 3 -> --fsdp "full_shard auto_wrap", 2 -> shard_grad_op, 1 -> shard_grad_op
//   (ZeRO-1 shards only optimizer state; shard_grad_op also shards gradients: the same updates, less
//   memory), 0 or no section -> no_shard;
//   bf16.enabled -> --bf16; train_micro_batch_size_per_gpu -> --per_device_train_batch_size;
//   gradient_accumulation_steps; gradient_clipping -> --max_grad_norm; train_batch_size (checked
//   against ranks x micro-batch x accumulation once the world is known);
//   optimizer AdamW/Adam params lr, betas, eps, weight_decay -> the AdamW flags;
//   scheduler WarmupLR -> constant_with_warmup, WarmupDecayLR -> linear (warmup_num_steps ->
//   --warmup_steps, warmup_max_lr -> --learning_rate, linear warm-up only);
//   communication_data_type -> --mixed_precision_reduce.
// Not used (they tune DeepSpeed's own buckets, prefetch and logging, not what is computed): the
// zero_optimization bucket and prefetch sizes, overlap_comm, steps_per_print, monitors; listed on the
// layout line. Refused by name: offload of parameters or optimizer, fp16/amp enabled, ZeRO++ and MiCS,
// other optimizers and schedulers, and any field llmt does not know.
#pragma once
#include <functional>
#include <string>

#include "train/train_args.h"

namespace llmt {

// Applies the config `text` (the file's content, or the JSON itself given inline; `what` names it in
// messages) to `a`. given(flag) says whether a flag was set on the command line or in a config file.
// Fills a.deepspeed_summary (what was taken, for the layout line) and a.deepspeed_train_batch_size.
void apply_deepspeed_config(const std::string& text, const std::string& what,
                            const std::function<bool(const char*)>& given, TrainArgs& a);

// Reads --deepspeed's value: a path, or a JSON object given inline (a config file's mapping).
void read_deepspeed_flag(const std::string& value, const std::function<bool(const char*)>& given, TrainArgs& a);

}  // namespace llmt
