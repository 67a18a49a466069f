#include <cstdio>

#include "engine/cli/commands.h"
#include "engine/train/trainer.h"

namespace llmt {

bool wants_help(const std::vector<std::string>& args) {
  for (auto& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

int cli_train(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::printf(
        "llmt train: train a GPT-2 or LLaMA model (flags are Hugging Face TrainingArguments names)\n\n"
        "model (one of):\n"
        "  --model_name_or_path DIR     a Hugging Face directory (config.json + safetensors)\n"
        "  --model_config NAME|FILE     a preset (gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-7b, llama-13b,\n"
        "                               llama2-7b, gpt2-tiny, gpt2-small-byte, llama-tiny) or a config.json; random init\n"
        "data:\n"
        "  --train_file FILE            plain text, byte-level tokens (ids 0..255)\n"
        "  --block_size N               tokens per sequence (default: min(1024, context))\n"
        "training:\n"
        "  --output_dir DIR             where metrics.jsonl and the final model go (required)\n"
        "  --max_steps N | --num_train_epochs X (default 3)\n"
        "  --per_device_train_batch_size N (8)   --gradient_accumulation_steps N (1)\n"
        "  --learning_rate X (5e-5)  --weight_decay X (0)  --adam_beta1/--adam_beta2/--adam_epsilon\n"
        "  --max_grad_norm X (1.0)   --lr_scheduler_type linear|cosine|constant|constant_with_warmup (linear)\n"
        "  --warmup_ratio X | --warmup_steps N   --logging_steps N (500)   --seed N (42)\n"
        "  --bf16 True|False  --tf32 True|False  (CUDA precisions; the CPU computes fp32)\n"
        "  --device cpu  --threads N (0 = all cores)\n");
    return 0;
  }
  Flags flags("train", args);
  TrainArgs a = parse_train_args(flags);
  flags.finish();
  run_training(a);
  return 0;
}

}  // namespace llmt
