#!/usr/bin/env bash
# Resume through the executable: a run resumed from its step-10 checkpoint gives the uninterrupted
# run's loss at every later step, bitwise at the same world size and strategy, and within 1e-5 at
# another (3 ranks, no_shard); kill -9 during saves never leaves `latest` pointing at a partial
# checkpoint. Usage: resume_test.sh path/to/llmt
set -uo pipefail
llmt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 3000); do echo "resume test line $i: the quick brown fox jumps over the lazy dog"; done > "$work/corpus.txt"
mpi=(mpirun --oversubscribe)
[ "$(id -u)" -ne 0 ] || mpi+=(--allow-run-as-root)
common=(--model_config gpt2-tiny --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" --block_size 64
        --per_device_train_batch_size 4 --learning_rate 3e-3 --lr_scheduler_type cosine
        --warmup_steps 3 --weight_decay 0.1 --logging_steps 1 --threads 1 --cache_dir none)
losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/.*"loss":\([^,}]*\).*"step":\([0-9]*\).*/\2 \1/' | sort -n; }

"${mpi[@]}" -np 2 "$llmt" train "${common[@]}" --max_steps 30 --gradient_accumulation_steps 3 \
  --fsdp "full_shard auto_wrap" --save_steps 10 --output_dir "$work/a" \
  > "$work/a.log" 2>&1 || { echo "FAIL: the uninterrupted run"; tail "$work/a.log"; exit 1; }
[ -f "$work/a/checkpoint-10/state.h5" ] && [ -f "$work/a/checkpoint-10/manifest.json" ] \
  || { echo "FAIL: checkpoint-10 lacks state.h5 or manifest.json"; ls "$work/a/checkpoint-10"; exit 1; }

[ "$(losses "$work/a" | wc -l)" -eq 30 ] || { echo "FAIL: expected 30 logged losses"; exit 1; }

# export from the exact state: the same bytes as the checkpoint's own Hugging Face export
"$llmt" export "$work/a/checkpoint-10" "$work/e" > "$work/e.log" 2>&1 || { echo "FAIL: export"; cat "$work/e.log"; exit 1; }
cmp "$work/a/checkpoint-10/model.safetensors" "$work/e/model.safetensors" || { echo "FAIL: export differs"; exit 1; }
cp -r "$work/a/checkpoint-10" "$work/bad"
printf 'X' | dd of="$work/bad/state.h5" bs=1 seek=5000 conv=notrunc 2> /dev/null
if "$llmt" export "$work/bad" "$work/e2" > "$work/e2.log" 2>&1; then echo "FAIL: a damaged state exported"; exit 1; fi
grep -q "state.h5" "$work/e2.log" || { echo "FAIL: the error does not name state.h5"; cat "$work/e2.log"; exit 1; }
echo "export: identical to the checkpoint's weights; a damaged state.h5 is refused"

# same world size and strategy: bitwise
"${mpi[@]}" -np 2 "$llmt" train "${common[@]}" --max_steps 30 --gradient_accumulation_steps 3 \
  --fsdp "full_shard auto_wrap" --save_strategy no --output_dir "$work/b" \
  --resume_from_checkpoint "$work/a/checkpoint-10" > "$work/b.log" 2>&1 || { echo "FAIL: resume"; tail "$work/b.log"; exit 1; }
# metrics.jsonl of the resumed run: the checkpoint's history (steps 1..10), then steps 11..30
[ "$(losses "$work/b" | wc -l)" -eq 30 ] || { echo "FAIL: expected steps 1..30 logged once each"; losses "$work/b" | head; exit 1; }
diff <(losses "$work/a") <(losses "$work/b") > /dev/null \
  || { echo "FAIL: resumed losses differ"; paste <(losses "$work/a") <(losses "$work/b") | head -20; exit 1; }
echo "resume at 2 ranks full_shard: steps 11..30 bitwise equal"

# 3 ranks, no_shard: the global batch must stay the same, so 2 x 4 x 3 = 3 x 4 x 2
"${mpi[@]}" -np 3 "$llmt" train "${common[@]}" --max_steps 30 --gradient_accumulation_steps 2 --fsdp no_shard --save_strategy no \
  --output_dir "$work/c" --resume_from_checkpoint "$work/a/checkpoint-10" > "$work/c.log" 2>&1 \
  || { echo "FAIL: resume at 3 ranks"; tail "$work/c.log"; exit 1; }
[ "$(losses "$work/c" | wc -l)" -eq 30 ] || { echo "FAIL: expected steps 1..30 logged once each"; exit 1; }
paste <(losses "$work/a" | awk '$1 > 10') <(losses "$work/c" | awk '$1 > 10') | \
  awk '{ d = $2 - $4; if (d < 0) d = -d; if (d > 1e-5 * $2) { print "FAIL: step " $1 ": " $2 " vs " $4; bad = 1 } } END { exit bad }' \
  || exit 1
echo "resume at 3 ranks no_shard: steps 11..30 within 1e-5"

# kill -9 at several moments of a run that saves every step: every checkpoint-N left is complete
# (its checksums verify and it exports), and `latest` resumes
for delay in 0.2 0.9 1.6; do
  d="$work/k"
  rm -rf "$d"
  "${mpi[@]}" -np 2 "$llmt" train "${common[@]}" --max_steps 1000 --save_steps 1 --save_total_limit 2 --output_dir "$d" \
    > "$work/k.log" 2>&1 &
  job=$!
  # wait for the first checkpoint (however slow the machine), then kill somewhere in the saves that follow
  for _ in $(seq 600); do ls "$d" 2> /dev/null | grep -qE '^checkpoint-[0-9]+$' && break; sleep 0.1; done
  sleep "$delay"
  pkill -9 -f "^$llmt train.*$d" ; wait $job 2> /dev/null
  n=0
  for c in "$d"/checkpoint-*; do
    case "$c" in *.tmp-*) continue ;; esac
    "$llmt" export "$c" "$work/x" > "$work/x.log" 2>&1 || { echo "FAIL: $c is not complete"; cat "$work/x.log"; exit 1; }
    n=$((n + 1))
  done
  [ $n -ge 1 ] || { echo "FAIL: no complete checkpoint after kill at ${delay}s"; ls "$d"; exit 1; }
  # resume from latest until it has loaded and trained a step, then stop it
  "${mpi[@]}" -np 2 "$llmt" train "${common[@]}" --max_steps 1000 --save_strategy no --output_dir "$d" \
    --resume_from_checkpoint latest > "$work/r.log" 2>&1 &
  job=$!
  for _ in $(seq 300); do grep -q '"step"' "$d/metrics.jsonl" 2> /dev/null && grep -q "step .*/1000" "$work/r.log" && break
                          kill -0 $job 2> /dev/null || break; sleep 0.2; done
  pkill -9 -f "^$llmt train.*$d"; wait $job 2> /dev/null
  grep -q "resume .*checkpoint-" "$work/r.log" || { echo "FAIL: resuming from latest after kill"; tail "$work/r.log"; exit 1; }
  echo "kill -9 ${delay}s after the first save: $n complete checkpoint(s); $(grep -o 'resume [^:]*' "$work/r.log")"
done

# `latest` with a corrupt newest checkpoint and one renamed to another step: each is said, moved
# aside as .corrupt (never overwritten), and the run resumes from the newest good one. Before, the
# run quietly took the older one and then overwrote the corrupt one, and trusted the renamed one.
c="$work/latest"
cp -r "$work/a" "$c"
printf 'X' | dd of="$c/checkpoint-30/state.h5" bs=1 seek=5000 conv=notrunc 2> /dev/null
mv "$c/checkpoint-20" "$c/checkpoint-25"
"${mpi[@]}" -np 2 "$llmt" train "${common[@]}" --max_steps 30 --gradient_accumulation_steps 3 \
  --fsdp "full_shard auto_wrap" --save_steps 10 --output_dir "$c" --resume_from_checkpoint latest > "$work/latest.log" 2>&1 \
  || { echo "FAIL: resume past a corrupt checkpoint"; grep -E "error|warning" "$work/latest.log" | head; exit 1; }
grep -q "warning .*checkpoint-30 failed its checks: .*state.h5: CRC-32C .*moved aside to .*checkpoint-30.corrupt" "$work/latest.log" \
  || { echo "FAIL: the corrupt checkpoint was not reported and moved aside"; cat "$work/latest.log"; exit 1; }
grep -q "warning .*checkpoint-25 failed its checks: .*records step 20, but the directory is named checkpoint-25" "$work/latest.log" \
  || { echo "FAIL: the renamed checkpoint was trusted"; cat "$work/latest.log"; exit 1; }
grep -q "resume .*checkpoint-10:" "$work/latest.log" || { echo "FAIL: did not resume from checkpoint-10"; cat "$work/latest.log"; exit 1; }
[ -d "$c/checkpoint-30.corrupt" ] && [ -d "$c/checkpoint-25.corrupt" ] || { echo "FAIL: not kept aside"; ls "$c"; exit 1; }
cmp "$work/a/checkpoint-30/manifest.json" "$c/checkpoint-30.corrupt/manifest.json" || { echo "FAIL: the corrupt one changed"; exit 1; }
# when every checkpoint fails, say so
d2="$work/d2"
mkdir -p "$d2" && cp -r "$work/a/checkpoint-10" "$d2/"
printf 'X' | dd of="$d2/checkpoint-10/state.h5" bs=1 seek=5000 conv=notrunc 2> /dev/null
if "${mpi[@]}" -np 2 "$llmt" train "${common[@]}" --max_steps 30 --gradient_accumulation_steps 3 --output_dir "$d2" \
     --fsdp "full_shard auto_wrap" --resume_from_checkpoint latest \
     > "$work/d2.log" 2>&1; then echo "FAIL: resumed from nothing"; exit 1; fi
grep -q "holds 1 checkpoint and every one failed its checks" "$work/d2.log" \
  || { echo "FAIL: no 'every one failed' message"; cat "$work/d2.log"; exit 1; }
echo "latest: a corrupt and a renamed checkpoint reported, moved aside, resumed from checkpoint-10"
echo "PASS"
