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
        "  --ddp_backend nccl|mpi  the data collectives on cuda, as llmt train's (default: nccl when each rank has\n"
        "                     its own GPU and the build has NCCL, else mpi staged through host memory)\n"
        "  --hybrid_shard_group_size N  --ddp_timeout SECONDS  --mixed_precision_reduce float32|bfloat16: as llmt train's\n"
        "  --sweep KEY=V1,V2  repeatable: every combination in turn (per_device_train_batch_size, seq_len, threads,\n"
        "                     model, fsdp, gradient_checkpointing, bf16, tf32, mixed_precision_reduce)\n"
        "  --results FILE     append each point's JSON line to FILE (scripts/plot.py draws them)\n"
        "  --dropout P        every dropout probability of the model set to P (the preset's otherwise), and the\n"
        "                     adapters' input dropout under --use_peft unless --lora_dropout is given\n"
        "  --ops True         instead of steps: each matmul of a block and the LM head (forward, both backward\n"
        "                     products) and attention forward and backward alone at the model's shapes, one JSON\n"
        "                     line each with TFLOP/s and the fraction of the device's peak\n"
        "prints one JSON line per point: step time (median, p10, p90, min, max), tokens/s (global and per rank),\n"
        "achieved FLOP/s and MFU (a GPU's peak; on a CPU the matmul library's peak measured here), memory, bytes\n"
        "sent per step, where the time goes, and what ran (commit, host, CPU, libraries); a point that cannot fit\n"
        "its memory is recorded with \"oom\": true and the sweep goes on\n");
    return 0;
  }
  Flags flags("bench", args);
  BenchArgs a = parse_bench_args(flags);
  flags.finish();
  std::unique_ptr<ControlComm> world;
  LaunchInfo launch = init_launch(nullptr, nullptr, &world, "bench");
  run_bench(a, *world, launch);
  return 0;
}

}  // namespace llmt
