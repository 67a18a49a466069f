#include <cstdio>

#include "cli/commands.h"
#include "engine/dist/launch.h"
#include "train/trainer.h"

namespace llmt {

bool wants_help(const std::vector<std::string>& args) {
  for (auto& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

int cli_train(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::printf(
        "llmt train: train a GPT-2 or LLaMA model; flags are Hugging Face TrainingArguments names\n"
        "run it alone, or on every rank: mpirun -hostfile H -np N llmt train ... / srun --mpi=pmix llmt train ...\n\n"
        "model (one of):\n"
        "  --model_name_or_path DIR     a Hugging Face directory (config.json + safetensors [+ tokenizer])\n"
        "  --model_config NAME|FILE     a preset (gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-7b, llama-13b,\n"
        "                               llama2-7b, gpt2-tiny, gpt2-small-byte, llama-tiny) or a config.json; random init\n"
        "  --tokenizer_name_or_path P   tokenizer directory/file (default: the model directory); bytes = byte-level\n"
        "data (one of):\n"
        "  --data_path FILE             Alpaca JSON / JSON Lines (Stanford Alpaca's prompts; --model_max_length 512)\n"
        "  --dataset_name wikitext --dataset_config_name wikitext-2-raw-v1 --dataset_dir DIR   (local files)\n"
        "  --train_file FILE [--validation_file FILE]   plain text, grouped into --block_size tokens (run_clm)\n"
        "  --alpaca_instruction_field/--alpaca_input_field/--alpaca_output_field NAME   --cache_dir DIR\n"
        "training:\n"
        "  --output_dir DIR (required)  --max_steps N | --num_train_epochs X (3)\n"
        "  --per_device_train_batch_size N (8)  --per_device_eval_batch_size N  --gradient_accumulation_steps N (1)\n"
        "  --learning_rate X (5e-5)  --weight_decay X (0)  --adam_beta1/--adam_beta2/--adam_epsilon  --max_grad_norm X (1)\n"
        "  --lr_scheduler_type linear|cosine|constant|constant_with_warmup (linear)  --warmup_ratio X | --warmup_steps N\n"
        "  --fsdp \"full_shard auto_wrap\"|shard_grad_op|hybrid_shard|no_shard  --fsdp_transformer_layer_cls_to_wrap CLS\n"
        "  --hybrid_shard_group_size N (ranks per node)  --gradient_checkpointing True|False\n"
        "  --logging_steps N (500)  --throughput_warmup_steps N (0)  --seed N (42)\n"
        "  --do_eval  --evaluation_strategy no|steps|epoch  --eval_steps N\n"
        "  --save_strategy no|steps|epoch (steps)  --save_steps N (500)  --save_total_limit N\n"
        "  --resume_from_checkpoint DIR|latest  --overwrite_output_dir   (any world size and strategy can resume)\n"
        "  --bf16 True|False  --tf32 True|False   (CUDA precisions; the CPU computes fp32)\n"
        "  --device cpu  --threads N (per rank; default: the node's cores / ranks per node)\n"
        "accepted and ignored, with a warning: --use_habana --use_lazy_mode --use_hpu_graphs* --gaudi_config_name\n"
        "  --deepspeed --report_to\n");
    return 0;
  }
  Flags flags("train", args);
  TrainArgs a = parse_train_args(flags);
  flags.finish();
  std::unique_ptr<ControlComm> world;
  LaunchInfo launch = init_launch(nullptr, nullptr, &world);
  run_training(a, *world, launch);
  return 0;
}

}  // namespace llmt
