#include <cstdio>

#include "cli/commands.h"
#include "train/flags.h"
#include "train/plan.h"
#include "train/train_args.h"

namespace llmt {

int cli_plan(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::printf(
        "llmt plan: per-rank memory and communication of a run, computed without allocating\n\n"
        "  --model NAME|FILE|DIR        preset, config.json or Hugging Face directory (gpt2)\n"
        "  --world_size N (1)           --ranks_per_node N (all on one node)\n"
        "  --fsdp SPEC                  full_shard auto_wrap | shard_grad_op | hybrid_shard | no_shard\n"
        "  --per_device_train_batch_size N (1)  --seq_len N (512)  --gradient_accumulation_steps N (1)\n"
        "  --gradient_checkpointing True|False\n"
        "  --bf16 True|False            bf16 compute copy, gathers and activations (fp32 master and moments)\n"
        "  --mixed_precision_reduce float32|bfloat16   what gradients are reduced in (float32)\n"
        "  --json                       one JSON line instead of the table\n");
    return 0;
  }
  Flags f("plan", args);
  PlanArgs a;
  a.model = f.get_string("model", a.model);
  a.world = f.get_int("world_size", a.world);
  a.ranks_per_node = f.get_int("ranks_per_node", 0);
  a.fsdp = f.get_string("fsdp", a.fsdp);
  a.batch = f.get_int("per_device_train_batch_size", a.batch);
  a.seq_len = f.get_int("seq_len", a.seq_len);
  a.accum = f.get_int("gradient_accumulation_steps", a.accum);
  a.gradient_checkpointing = f.get_bool("gradient_checkpointing", false);
  a.bf16 = f.get_bool("bf16", false);
  a.reduce_dtype = parse_reduce_dtype(f.get_string("mixed_precision_reduce", "float32"));
  bool json = f.get_bool("json", false);
  f.finish();
  nlohmann::json plan = make_plan(resolve_model_config(a.model), a);
  if (json) std::printf("%s\n", plan.dump().c_str());
  else std::printf("%s", format_plan(plan).c_str());
  return 0;
}

}  // namespace llmt
