#!/usr/bin/env bash
# --device cuda through the whole program, under mpirun, as the CPU backend does: two ranks, full
# shard, gradient accumulation, in fp32 and bf16, with the data collectives over MPI (staged) and
# over NCCL, against the same run on the CPU (losses and gradient norms at every step within a
# bound), and the CUDA run twice gives bitwise the same losses and weights. The NCCL runs put each
# rank on a device of its own (two emulated devices). In ctest the CUDA program is llmt_simt (the
# SIMT emulator); on a GPU, scripts/gpu_selftest.sh passes the real llmt.
# Usage: cuda_matches_cpu.sh path/to/llmt-for-cpu path/to/llmt-for-cuda [nccl|no-nccl]
#   no-nccl: skip the NCCL runs (one GPU: NCCL refuses two ranks on one device)
set -euo pipefail
cpu=$1
gpu=$2
comms=(cuda nccl)
[ "${3:-nccl}" = nccl ] || comms=(cuda)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat /usr/share/common-licenses/* > "$work/corpus.txt" 2>/dev/null || true
[ -s "$work/corpus.txt" ] || { for i in $(seq 2000); do echo "the quick brown fox $i jumps over the lazy dog"; done > "$work/corpus.txt"; }
mpi=(mpirun -np 2)
[ "$(id -u)" -ne 0 ] || mpi+=(--allow-run-as-root)
[ "$(nproc)" -ge 2 ] || mpi+=(--oversubscribe)

run() {  # run <program> <device> <out> [flags...]
  local prog=$1 dev=$2 out=$3
  shift 3
  OMP_NUM_THREADS=1 "${mpi[@]}" "$prog" train --device "$dev" --model_config gpt2-tiny --tokenizer_name_or_path bytes \
    --train_file "$work/corpus.txt" --output_dir "$out" --save_strategy no --block_size 64 \
    --per_device_train_batch_size 4 --gradient_accumulation_steps 2 --fsdp "full_shard auto_wrap" \
    --learning_rate 3e-3 --max_steps 8 --logging_steps 1 --seed 5 "$@" > "$out.log" 2>&1 \
    || { echo "FAIL: $prog --device $dev $*"; cat "$out.log"; exit 1; }
}
series() { grep -o "\"$2\":[0-9.e+-]*" "$1/metrics.jsonl" | cut -d: -f2; }

for prec in f32 bf16; do
  flags=()
  bound=1e-5
  if [ $prec = bf16 ]; then flags=(--bf16 True); bound=2e-3; fi
  run "$cpu" cpu "$work/cpu_$prec" "${flags[@]}"
  run "$gpu" cuda "$work/cuda_$prec" "${flags[@]}" --ddp_backend mpi
  grep -q "^gpu    rank 1: cuda:" "$work/cuda_$prec.log" || { echo "FAIL: no per-rank GPU line"; cat "$work/cuda_$prec.log"; exit 1; }
  if [ ${#comms[@]} -eq 2 ]; then
    # two emulated GPUs, one per rank: a CUDA call made on a rank's other device (the watchdog's thread
    # polling events without cudaSetDevice: a context on GPU 0 for every rank) stops the emulator
    LLMT_SIMT_DEVICES=2 run "$gpu" cuda "$work/nccl_$prec" "${flags[@]}" --ddp_backend nccl
    grep -q "^gpu    rank 1: cuda:1" "$work/nccl_$prec.log" || { echo "FAIL: rank 1 is not on device 1"; cat "$work/nccl_$prec.log"; exit 1; }
    grep -q "^comm   data collectives over NCCL" "$work/nccl_$prec.log" || { echo "FAIL: no NCCL line"; cat "$work/nccl_$prec.log"; exit 1; }
    # the transport report from every rank's NCCL log (NCCL_DEBUG_FILE), gathered on rank 0
    grep -q "^nccl   rank 1 .*NCCL " "$work/nccl_$prec.log" && grep -q "^nccl     within a node: " "$work/nccl_$prec.log" \
      || { echo "FAIL: no NCCL transport report"; cat "$work/nccl_$prec.log"; exit 1; }
  fi
  for comm in "${comms[@]}"; do
    for key in loss grad_norm; do
      paste <(series "$work/cpu_$prec" $key) <(series "$work/${comm}_$prec" $key) | awk -v b=$bound -v k=$key -v p="$prec $comm" '
        { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) worst = r; n++
          if (r > b) { printf "FAIL: %s %s step %d: cpu %s, cuda %s (rel %.2g > %g)\n", p, k, n, $1, $2, r, b; bad = 1 } }
        END { if (n != 8) { print "FAIL: " n " logged steps, expected 8"; exit 1 }
              printf "%s %s: cuda within %.2g of cpu over %d steps (bound %g)\n", p, k, worst, n, b; exit bad }'
    done
  done
done

# determinism: the same CUDA run again, bitwise
run "$gpu" cuda "$work/again_bf16" --bf16 True --ddp_backend mpi
cmp <(series "$work/cuda_bf16" loss) <(series "$work/again_bf16" loss) || { echo "FAIL: two identical cuda runs gave different losses"; exit 1; }
cmp "$work/cuda_bf16/model.safetensors" "$work/again_bf16/model.safetensors" \
  || { echo "FAIL: two identical cuda runs wrote different weights"; exit 1; }
echo "bf16 cuda run repeated: bitwise the same losses and weights"
echo "PASS"
