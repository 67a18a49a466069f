#!/usr/bin/env bash
# Issue 23, through the executable: counts derived from flags are range-checked with a clear error
# and no model written (--num_train_epochs 1e17 overflowed the step count, trained nothing, saved the
# untrained model and exited 0; --preprocessing_num_workers 100000 crashed in OpenMP; --threads -1
# was silently 0; --block_size -1 was the default); an --output_dir with missing parents is created,
# as the Hugging Face Trainer does; --per_device_eval_batch_size above the training batch is allowed
# and gives the same eval_loss; an evaluation is timed on its own; plan, bench, generate and netcheck
# name their own bad values before any work. Usage: flag_limits.sh path/to/llmt
set -uo pipefail
llmt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 400); do echo "limits test line $i: the quick brown fox jumps over the lazy dog"; done > "$work/corpus.txt"
common=(--model_config gpt2-tiny --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" --block_size 64
        --threads 1 --cache_dir none --save_strategy no --per_device_train_batch_size 2)

refused() {  # refused <name> <expected message> flags...: exits non-zero, says why, writes no model
  local name=$1 want=$2
  shift 2
  if "$llmt" train "${common[@]}" --output_dir "$work/$name" "$@" > "$work/$name.log" 2>&1; then
    echo "FAIL: $name: exit 0"; tail -5 "$work/$name.log"; exit 1
  fi
  grep -qF -- "$want" "$work/$name.log" || { echo "FAIL: $name: no \"$want\""; tail -5 "$work/$name.log"; exit 1; }
  [ ! -e "$work/$name/model.safetensors" ] || { echo "FAIL: $name: a model was written"; exit 1; }
  grep -q "Segmentation\|fatal signal" "$work/$name.log" && { echo "FAIL: $name: crashed"; exit 1; }
  echo "refused: $name: $want"
}
refused epochs "--num_train_epochs 1e+17 x" --num_train_epochs 1e17
refused workers "--preprocessing_num_workers 100000: expected 0" --preprocessing_num_workers 100000
refused threads "--threads -1: expected 0" --threads -1
refused block "--block_size -1: expected a positive number of tokens" --block_size -1
refused logits_chunk "--logits_chunk_tokens -3: expected 0" --logits_chunk_tokens -3
# issue 35: processes another launcher started as several, each alone in its MPI world, ran N whole
# jobs racing for one output directory (the second failed only on its lock): refused, saying how
WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
  refused torchrun "rank 1 of 2 by torchrun (WORLD_SIZE, RANK), but llmt's ranks meet through MPI" --max_steps 1
SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=2 refused srun_no_mpi "task 2 of 4 that srun started" --max_steps 1
# a run_clm .jsonl: its "text" field is trained on (the JSON syntax was, before); a .parquet is refused
# with the command that converts it
while read -r line; do printf '{"id": 1, "text": "%s\\n"}\n' "$line"; done < "$work/corpus.txt" > "$work/corpus.jsonl"
nofile=(--model_config gpt2-tiny --tokenizer_name_or_path bytes --block_size 64 --threads 1 --cache_dir none
        --save_strategy no --per_device_train_batch_size 2)
"$llmt" train "${nofile[@]}" --train_file "$work/corpus.jsonl" --output_dir "$work/jsonl" --max_steps 2 \
  > "$work/jsonl.log" 2>&1 || { echo "FAIL: --train_file .jsonl"; tail -5 "$work/jsonl.log"; exit 1; }
"$llmt" train "${common[@]}" --output_dir "$work/txt" --max_steps 2 > "$work/txt.log" 2>&1 ||
  { echo "FAIL: the same lines as .txt"; tail -5 "$work/txt.log"; exit 1; }
tokens() { grep -o "lines -> [0-9]* blocks of 64 tokens ([0-9]* tokens dropped" "$1"; }
[ -n "$(tokens "$work/txt.log")" ] && [ "$(tokens "$work/jsonl.log")" = "$(tokens "$work/txt.log")" ] ||
  { echo "FAIL: .jsonl and .txt blocks differ: $(tokens "$work/jsonl.log") / $(tokens "$work/txt.log")"; exit 1; }
echo "a .jsonl of the .txt file's lines: $(tokens "$work/jsonl.log")"
: > "$work/data.parquet"
"$llmt" train "${nofile[@]}" --train_file "$work/data.parquet" --output_dir "$work/parquet" > "$work/parquet.log" 2>&1 &&
  { echo "FAIL: a .parquet --train_file: exit 0"; exit 1; }
grep -qF "datasets.load_dataset('parquet', data_files='$work/data.parquet', split='train')" "$work/parquet.log" ||
  { echo "FAIL: a .parquet --train_file: no datasets command"; tail -3 "$work/parquet.log"; exit 1; }
echo "refused: a .parquet --train_file, with the datasets command that converts it"

# --output_dir a/b/c: the parents are made
"$llmt" train "${common[@]}" --output_dir "$work/new/parents/out" --max_steps 1 > "$work/parents.log" 2>&1 \
  || { echo "FAIL: --output_dir with missing parents"; tail -5 "$work/parents.log"; exit 1; }
[ -f "$work/new/parents/out/model.safetensors" ] || { echo "FAIL: no model in new/parents/out"; exit 1; }
echo "--output_dir with missing parents: created"

# an evaluation batch larger than the training batch (2): 5 and 2 give the same eval_loss
eval_loss() {
  "$llmt" train "${common[@]}" --output_dir "$work/eval$1" --max_steps 1 --do_eval True \
    --validation_file "$work/corpus.txt" --per_device_eval_batch_size "$1" > "$work/eval$1.log" 2>&1 \
    || { echo "FAIL: --per_device_eval_batch_size $1"; tail -5 "$work/eval$1.log" >&2; return 1; }
  sed -n 's/.*"eval_loss":\([-0-9.e+]*\).*/\1/p' "$work/eval$1/metrics.jsonl" | tail -1
}
a=$(eval_loss 2) || exit 1
b=$(eval_loss 5) || exit 1
[ -n "$a" ] && [ -n "$b" ] || { echo "FAIL: no eval_loss recorded ($a, $b)"; exit 1; }
awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-6 * a) }' \
  || { echo "FAIL: eval_loss with eval batch 5 ($b) differs from batch 2 ($a)"; exit 1; }
echo "--per_device_eval_batch_size 5 over a training batch of 2: eval_loss $b (batch 2: $a)"

# An evaluation is timed on its own (eval_runtime), out of the next logging window: the step after one
# logged "15192 ms/step, 17 tok/s" against a median of 8,550 tok/s. Step 3's window (one step of 128
# tokens) must take less than half the evaluation of the 400-line file before it.
"$llmt" train "${common[@]}" --output_dir "$work/evaltime" --max_steps 4 --logging_steps 1 --evaluation_strategy steps \
  --eval_steps 2 --validation_file "$work/corpus.txt" > "$work/evaltime.log" 2>&1 \
  || { echo "FAIL: evaluation every 2 steps"; tail -5 "$work/evaltime.log"; exit 1; }
python3 - "$work/evaltime/metrics.jsonl" <<'PY' || exit 1
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
ev = [r for r in recs if "eval_loss" in r]
step3 = [r for r in recs if r.get("step") == 3 and "loss" in r][0]
assert len(ev) == 2 and all(r["eval_runtime"] > 0 for r in ev), ev
window_s = 128 / step3["tokens_per_s"]
assert window_s < ev[0]["eval_runtime"] / 2, f"step 3 took {window_s:.3f} s, the evaluation {ev[0]['eval_runtime']:.3f} s"
print(f"evaluation timed on its own: {ev[0]['eval_runtime']:.3f} s, the step after it {1000 * window_s:.1f} ms")
PY

# the other commands' limits, each named before any work: llmt plan --world_size 0 said "0 ranks do
# not fill nodes of 0"; bench --seq_len past the context said "llmt plan: ..."; bench --sweep with a
# bad model ran the points before it; generate --threads -5 ran; netcheck --bench --max_bytes
# 99999999999999 ended in "internal error: std::bad_alloc"
other() {  # other <name> <expected message> command...
  local name=$1 want=$2
  shift 2
  if "$llmt" "$@" > "$work/$name.log" 2>&1; then echo "FAIL: $name: exit 0"; tail -5 "$work/$name.log"; exit 1; fi
  grep -qF -- "$want" "$work/$name.log" || { echo "FAIL: $name: no \"$want\""; tail -5 "$work/$name.log"; exit 1; }
  ! grep -q "^step \|internal error\|MPI_ABORT" "$work/$name.log" || { echo "FAIL: $name"; cat "$work/$name.log"; exit 1; }
  echo "refused: $name: $want"
}
other plan_world "llmt plan: --world_size 0: expected at least 1 rank" plan --model gpt2-tiny --world_size 0
other plan_nodes "llmt plan: --world_size 6 does not fill nodes of --ranks_per_node 4" plan --model gpt2-tiny \
  --world_size 6 --ranks_per_node 4
other bench_seq "llmt bench: --seq_len 100000 exceeds the context of gpt2-tiny (256 tokens)" bench --model gpt2-tiny \
  --seq_len 100000 --threads 1
other bench_sweep "llmt bench --model bogus (--sweep model=bogus): unknown model preset" bench --threads 1 --steps 1 \
  --warmup 0 --seq_len 16 --sweep model=gpt2-tiny,bogus
other gen_threads "--threads -5: expected 0" generate --model_name_or_path "$work/evaltime" \
  --tokenizer_name_or_path bytes --prompt x --threads -5
other netcheck_bytes "llmt netcheck --bench: --max_bytes 99999999999999 needs" netcheck --bench --max_bytes 99999999999999
echo PASS
