#include <algorithm>
#include <cstdio>

#include "cli/commands.h"
#include "engine/core/error.h"
#include "train/flags.h"
#include "train/lora_run.h"
#include "train/plan.h"
#include "train/predict.h"
#include "train/session.h"
#include "train/train_args.h"

namespace llmt {

int cli_plan(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::printf(
        "llmt plan: per-rank memory and communication of a run, computed without allocating\n\n"
        "  --model NAME|FILE|DIR        preset, config.json or Hugging Face directory (gpt2)\n"
        "  --world_size N (1)           --ranks_per_node N (all on one node)\n"
        "  --fsdp SPEC                  full_shard auto_wrap (default) | shard_grad_op | hybrid_shard | no_shard\n"
        "  --hybrid_shard_group_size N  hybrid_shard's shard group (--ranks_per_node)\n"
        "  --per_device_train_batch_size N (1)  --seq_len N (512)  --gradient_accumulation_steps N (1)\n"
        "  --gradient_checkpointing True|False\n"
        "  --bf16 True|False            bf16 compute copy, gathers and activations (fp32 master and moments)\n"
        "  --mixed_precision_reduce float32|bfloat16   what gradients are reduced in (float32)\n"
        "  --use_peft True              a LoRA run: the model frozen, the adapter trained, with train's LoRA flags\n"
        "                               (--lora_r, --lora_target_modules, --lora_modules_to_save, --adapter_name_or_path)\n"
        "  (train's other parallelism and precision flags are read as train reads them: --device, --tf32, ...)\n"
        "  --json                       one JSON line instead of the table\n"
        "  --predict                    also the step time, tokens/s per GPU and MFU on a cluster of:\n"
        "    --gpu a100|h100|h100-hbm2e|h200 (h100)   --gpus_per_node N (8; also --ranks_per_node's default)\n"
        "    --nvlink_busbw GB/s          --nic_gbps Gb/s per GPU between nodes (the preset's)\n"
        "    --matmul_efficiency X (0.7)  --attention_efficiency X (0.5): achieved fractions of the bf16 peak\n"
        "    --recompute none|selective|full (full with --gradient_checkpointing)\n");
    return 0;
  }
  Flags f("plan", args);
  // the parallelism and precision parts as llmt train reads them (--fsdp, --hybrid_shard_group_size, --bf16, ...)
  ParallelismConfig parallelism;
  parallelism.fsdp = "full_shard auto_wrap";  // what a plan is usually asked about
  read_parallelism(f, parallelism);
  PrecisionConfig precision;
  read_precision(f, precision);
  LoraArgs lora;  // the LoRA flags as llmt train reads them
  read_lora(f, lora);
  SessionSettings s = session_settings(parallelism, precision);
  s.batch = f.get_int("per_device_train_batch_size", 1);
  s.seq_len = f.get_int("seq_len", 512);
  s.accum = f.get_int("gradient_accumulation_steps", 1);
  const std::string model = f.get_string("model", "gpt2");
  const int world = f.get_int("world_size", 1);
  int ranks_per_node = f.get_int("ranks_per_node", 0);
  bool json = f.get_bool("json", false);
  const bool predict = f.get_bool("predict", false);
  ClusterSpec c = cluster_preset(f.get_string("gpu", "h100"));
  c.gpus_per_node = f.get_int("gpus_per_node", c.gpus_per_node);
  c.nvlink_busbw_gbps = f.get_double("nvlink_busbw", c.nvlink_busbw_gbps);
  c.nic_gbits_per_gpu = f.get_double("nic_gbps", c.nic_gbits_per_gpu);
  c.matmul_efficiency = f.get_double("matmul_efficiency", c.matmul_efficiency);
  c.attention_efficiency = f.get_double("attention_efficiency", c.attention_efficiency);
  c.recompute = f.get_string("recompute", s.gradient_checkpointing ? "full" : "none");
  f.finish();
  if (predict && ranks_per_node == 0) ranks_per_node = std::min(world, c.gpus_per_node);
  LLMT_CHECK(world > 0, "llmt plan: --world_size %d: expected at least 1 rank", world);
  LLMT_CHECK(ranks_per_node >= 0, "llmt plan: --ranks_per_node %d: expected 0 (every rank on one node) or more",
             ranks_per_node);
  LLMT_CHECK(ranks_per_node == 0 || world % ranks_per_node == 0, "llmt plan: --world_size %d does not fill nodes of "
             "--ranks_per_node %d", world, ranks_per_node);
  PlanArgs a = plan_args(s, world, ranks_per_node);
  a.model = model;
  const ModelConfig cfg = resolve_model_config(model);
  if (lora.use_peft) a.lora = lora_run_config(lora, cfg);
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
