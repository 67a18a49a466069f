#include <algorithm>
#include <cstdio>

#include "cli/commands.h"
#include "train/flags.h"
#include "train/plan.h"
#include "train/predict.h"
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
        "  --json                       one JSON line instead of the table\n"
        "  --predict                    also the step time, tokens/s per GPU and MFU on a cluster of:\n"
        "    --gpu a100|h100|h100-hbm2e|h200 (h100)   --gpus_per_node N (8; also --ranks_per_node's default)\n"
        "    --nvlink_busbw GB/s          --nic_gbps Gb/s per GPU between nodes (the preset's)\n"
        "    --matmul_efficiency X (0.7)  --attention_efficiency X (0.5): achieved fractions of the bf16 peak\n"
        "    --recompute none|selective|full (full with --gradient_checkpointing)\n");
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
  const bool predict = f.get_bool("predict", false);
  ClusterSpec c = cluster_preset(f.get_string("gpu", "h100"));
  c.gpus_per_node = f.get_int("gpus_per_node", c.gpus_per_node);
  c.nvlink_busbw_gbps = f.get_double("nvlink_busbw", c.nvlink_busbw_gbps);
  c.nic_gbits_per_gpu = f.get_double("nic_gbps", c.nic_gbits_per_gpu);
  c.matmul_efficiency = f.get_double("matmul_efficiency", c.matmul_efficiency);
  c.attention_efficiency = f.get_double("attention_efficiency", c.attention_efficiency);
  c.recompute = f.get_string("recompute", a.gradient_checkpointing ? "full" : "none");
  f.finish();
  if (predict && a.ranks_per_node == 0) a.ranks_per_node = std::min(a.world, c.gpus_per_node);
  const ModelConfig cfg = resolve_model_config(a.model);
  if (predict) {
    const nlohmann::json p = predict_step(cfg, a, c);
    if (json) std::printf("%s\n", p.dump().c_str());
    else std::printf("%s%s", format_plan(p["plan"]).c_str(), format_prediction(p).c_str());
    return 0;
  }
  nlohmann::json plan = make_plan(cfg, a);
  if (json) std::printf("%s\n", plan.dump().c_str());
  else std::printf("%s", format_plan(plan).c_str());
  return 0;
}

}  // namespace llmt
