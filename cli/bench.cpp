#include <cstdio>

#include "cli/commands.h"
#include "train/bench.h"

namespace llmt {

int cli_bench(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::printf(
        "llmt bench: time whole training steps (forward, backward, AdamW) on synthetic tokens\n\n"
        "  --model NAME|FILE  preset or config.json (gpt2)\n"
        "  --device cpu|cuda  --threads N (0 = all cores; cpu)\n"
        "  --bf16 True|False  --tf32 True|False (fp32 matmuls on TF32 tensor cores; cuda)\n"
        "  --per_device_train_batch_size N (4)  --seq_len N (64)\n"
        "  --steps N (10)     --warmup N (2)\n"
        "  --fsdp SPEC        full_shard auto_wrap | shard_grad_op | hybrid_shard | no_shard (under mpirun)\n"
        "  --gradient_checkpointing True|False\n"
        "prints one JSON line: step_ms_median, tokens_per_s, model, device, threads, ...; with --device cuda\n"
        "also the GPU, its peak TFLOP/s and the MFU\n");
    return 0;
  }
  Flags flags("bench", args);
  BenchArgs a = parse_bench_args(flags);
  flags.finish();
  std::unique_ptr<ControlComm> world;
  LaunchInfo launch = init_launch(nullptr, nullptr, &world);
  run_bench(a, *world, launch);
  return 0;
}

}  // namespace llmt
