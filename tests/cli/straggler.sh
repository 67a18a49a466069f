#!/usr/bin/env bash
# The slow rank, named: under mpirun, LLMT_TEST_SLOW_RANK=1:MS makes rank 1 sleep MS in each step
# (a slow node); the log names rank 1 and no other from the second logging window on (a rank is
# named when it is slow two windows in a row), and metrics.jsonl carries every rank's step, compute
# and wait times with slow_ranks [] then [1], [1]. With no delay nothing is named at a threshold of
# 0.5 (below: the host's noise on a 2-vCPU VM exceeds the default 0.15).
# Then the same on the emulated CUDA backend with NCCL's stand-in (llmt_simt beside llmt), whose
# collectives the device clock times (kernels/cuda/nccl_comm.cu).
# Usage: straggler.sh path/to/llmt
set -uo pipefail
llmt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 2000); do echo "straggler test line $i: the quick brown fox jumps over the lazy dog"; done > "$work/corpus.txt"
mpi=(mpirun --oversubscribe -np 2)
[ "$(id -u)" -ne 0 ] || mpi+=(--allow-run-as-root)
common=(--model_config gpt2-tiny --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" --block_size 128
        --per_device_train_batch_size 16 --max_steps 12 --logging_steps 4 --save_strategy no --threads 1
        --cache_dir none --fsdp "full_shard auto_wrap")

LLMT_TEST_SLOW_RANK=1:150 "${mpi[@]}" "$llmt" train "${common[@]}" --output_dir "$work/slow" --report_to tensorboard \
  > "$work/slow.log" 2>&1 ||
  { echo "FAIL: the run with a slow rank"; tail "$work/slow.log"; exit 1; }
named=$(grep -c "slow rank 1 (host $(hostname))" "$work/slow.log")
[ "$named" -eq 2 ] || { echo "FAIL: rank 1 named $named times, expected at the 2nd and 3rd logging steps"; cat "$work/slow.log"; exit 1; }
! grep -q "slow rank 0" "$work/slow.log" || { echo "FAIL: rank 0 named too"; cat "$work/slow.log"; exit 1; }
python3 - "$work/slow/metrics.jsonl" << 'PY' || exit 1
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert len(recs) == 3, f"FAIL: {len(recs)} records"
assert [r["slow_ranks"] for r in recs] == [[], [1], [1]], f"FAIL: slow_ranks {[r['slow_ranks'] for r in recs]}"
for r in recs:
    c, w = r["compute_ms_per_rank"], r["comm_wait_ms_per_rank"]
    assert len(c) == 2 and len(w) == 2 and len(r["step_ms_per_rank"]) == 2, f"FAIL: {r}"
    # rank 1 computes at least its 150 ms sleep; rank 0 spends most of that waiting for it
    assert c[1] >= 150 and w[0] >= 100 and c[1] > 1.15 * c[0], f"FAIL: times {r}"
print(f"slow rank named: compute {recs[-1]['compute_ms_per_rank']}, waits {recs[-1]['comm_wait_ms_per_rank']} ms a step")
PY
# TensorBoard: one scalar per rank for each per-rank figure (read by TensorBoard's own reader)
if python3 -c "import tensorboard" 2> /dev/null; then
  python3 - "$work/slow/runs" << 'PY' || exit 1
import glob, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(glob.glob(sys.argv[1] + "/*")[0])
ea.Reload()
tags = set(ea.Tags()["scalars"])
for key in ("compute_ms_per_rank", "comm_wait_ms_per_rank", "step_ms_per_rank"):
    for r in (0, 1):
        assert f"train/{key}/rank_{r}" in tags, f"FAIL: no train/{key}/rank_{r} in {sorted(tags)}"
        assert len(ea.Scalars(f"train/{key}/rank_{r}")) == 3, f"FAIL: {key} rank {r}"
print("tensorboard: per-rank scalars for both ranks")
PY
else
  echo "tensorboard not installed: its per-rank scalars unchecked"
fi

# Without a delay the ranks do the same work, but on a shared 2-vCPU VM the host's noise alone has
# put one rank 17-26% above the median for two windows in a row, twice in one CI run; five runs here
# showed windows of 62 ms against 40 ms, with either rank the slower. The default 0.15 is for
# dedicated nodes, so these runs ask for $even_threshold: still well under the 1.5x or more that the
# delayed runs show, and a detector that named the wrong rank or any rank regardless would still be
# caught. A second run that names a rank too is a real failure.
even_threshold=0.5
for attempt in 1 2; do
  rm -rf "$work/even"
  "${mpi[@]}" "$llmt" train "${common[@]}" --straggler_threshold $even_threshold --output_dir "$work/even" > "$work/even.log" 2>&1 ||
    { echo "FAIL: the run without a delay"; tail "$work/even.log"; exit 1; }
  grep -q "slow rank" "$work/even.log" || break
  [ "$attempt" = 1 ] || { echo "FAIL: a rank named with no delay, twice"; grep "slow rank\|step " "$work/even.log"; exit 1; }
  echo "no delay, first run: a rank named ($(grep -o 'slow rank [0-9]*.*median [0-9]* ms' "$work/even.log" | head -1)); running again"
done
python3 - "$work/even/metrics.jsonl" << 'PY' || exit 1
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert len(recs) == 3 and all(r["slow_ranks"] == [] for r in recs), f"FAIL: {[r['slow_ranks'] for r in recs]}"
print(f"no delay: nothing named; compute {recs[-1]['compute_ms_per_rank']} ms a step")
PY
simt="$(dirname "$llmt")/llmt_simt"
if [ -x "$simt" ]; then
  nccl=(--device cuda --ddp_backend nccl --model_config gpt2-tiny --tokenizer_name_or_path bytes
        --train_file "$work/corpus.txt" --block_size 32 --per_device_train_batch_size 2 --max_steps 12
        --logging_steps 4 --save_strategy no --threads 1 --cache_dir none --fsdp "full_shard auto_wrap")
  for delay in 150 0; do
    threshold=0.15; [ "$delay" = 0 ] && threshold=$even_threshold  # as above: the host's noise
    LLMT_TEST_SLOW_RANK=1:$delay OMP_NUM_THREADS=1 "${mpi[@]}" "$simt" train "${nccl[@]}" --straggler_threshold $threshold \
      --output_dir "$work/nccl$delay" \
      > "$work/nccl$delay.log" 2>&1 || { echo "FAIL: the emulated NCCL run, delay $delay"; tail "$work/nccl$delay.log"; exit 1; }
    python3 - "$work/nccl$delay/metrics.jsonl" "$delay" << 'PY' || { cat "$work/nccl$delay.log"; exit 1; }
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
want = [[], [1], [1]] if sys.argv[2] != "0" else [[], [], []]
assert [r["slow_ranks"] for r in recs] == want, f"FAIL: nccl, delay {sys.argv[2]}: {[r['slow_ranks'] for r in recs]}"
print(f"emulated NCCL, delay {sys.argv[2]} ms: slow_ranks {want}; compute {[round(c) for c in recs[-1]['compute_ms_per_rank']]} ms")
PY
  done
else
  echo "no llmt_simt beside llmt: the emulated NCCL case is skipped"
fi
echo PASS
