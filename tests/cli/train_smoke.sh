#!/usr/bin/env bash
# End to end through the executable: train a tiny GPT-2 on licence text, check the loss falls and
# a Hugging Face directory is written, train on from that directory, and check bad flags fail
# with the flag named. Usage: train_smoke.sh path/to/llmt [path/to/llmt_simt]
set -euo pipefail
llmt=$1
simt=${2:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat /usr/share/common-licenses/* > "$work/corpus.txt" 2>/dev/null || true
[ -s "$work/corpus.txt" ] || { for i in $(seq 2000); do echo "the quick brown fox $i jumps over the lazy dog"; done > "$work/corpus.txt"; }

"$llmt" train --model_config gpt2-tiny --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" \
  --output_dir "$work/run1" --save_strategy steps --save_steps 20 --save_total_limit 2 --block_size 64 --per_device_train_batch_size 8 --learning_rate 3e-3 --max_steps 60 --logging_steps 10 \
  --lr_scheduler_type constant --threads 2
for f in config.json model.safetensors metrics.jsonl checkpoint-40/model.safetensors checkpoint-60/config.json; do
  [ -s "$work/run1/$f" ] || { echo "FAIL: $f was not written"; exit 1; }
done
[ ! -e "$work/run1/checkpoint-20" ] || { echo "FAIL: save_total_limit 2 kept checkpoint-20 beside 40 and 60"; exit 1; }
ls "$work/run1" | grep -q tmp && { echo "FAIL: a temporary checkpoint was left behind"; exit 1; }
first=$(head -n 1 "$work/run1/metrics.jsonl" | sed 's/.*"loss":\([0-9.]*\).*/\1/')
last=$(grep "\"loss\"" "$work/run1/metrics.jsonl" | tail -n 1 | sed 's/.*"loss":\([0-9.]*\).*/\1/')
echo "loss over the first 10 steps $first, over the last 10 $last"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }' || { echo "FAIL: the loss did not fall"; exit 1; }

# continue from the saved Hugging Face directory
"$llmt" train --model_name_or_path "$work/run1" --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" \
  --output_dir "$work/run2" --save_strategy no --block_size 64 --per_device_train_batch_size 8 --max_steps 2 --logging_steps 1 --threads 2

# bad input fails, naming what is wrong
if "$llmt" train --model_config gpt2-tiny --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" --output_dir "$work/run3" \
     --no_such_flag 1 2> "$work/err.txt"; then echo "FAIL: an unknown flag was accepted"; exit 1; fi
grep -q -- "--no_such_flag" "$work/err.txt" || { echo "FAIL: the error does not name the flag"; cat "$work/err.txt"; exit 1; }
if "$llmt" train --model_config gpt2-tiny --tokenizer_name_or_path bytes --train_file "$work/missing.txt" --output_dir "$work/run4" 2> "$work/err.txt"; then
  echo "FAIL: a missing train file was accepted"; exit 1
fi
grep -q "missing.txt" "$work/err.txt" || { echo "FAIL: the error does not name the file"; exit 1; }

# a second run into an output_dir in use is refused, naming the first; kill -9 frees the directory
"$llmt" train --model_config gpt2-tiny --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" --output_dir "$work/run6" \
  --save_strategy no --block_size 64 --max_steps 100000 --logging_steps 1 --threads 1 > "$work/first.txt" 2>&1 &
first=$!
for _ in $(seq 200); do grep -q "^step" "$work/first.txt" 2>/dev/null && break; sleep 0.05; done
if "$llmt" train --model_config gpt2-tiny --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" \
     --output_dir "$work/run6" --max_steps 1 --threads 1 2> "$work/err.txt" > /dev/null; then
  echo "FAIL: a second run into a busy output_dir was accepted"; kill -9 $first; exit 1
fi
grep -q "run6 is in use by another llmt run (host .* pid $first)" "$work/err.txt" \
  || { echo "FAIL: the refusal does not name the first run"; cat "$work/err.txt"; kill -9 $first; exit 1; }
kill -9 $first
wait $first 2>/dev/null || true  # killed: 137
"$llmt" train --model_config gpt2-tiny --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" --output_dir "$work/run6" \
  --overwrite_output_dir True --save_strategy no --block_size 64 --max_steps 1 --threads 1 > "$work/third.txt" 2>&1 \
  || { echo "FAIL: the directory stayed locked after kill -9"; cat "$work/third.txt"; exit 1; }

# a run that cannot fit is refused before anything large is allocated, with the plan's figures
# (a 160B-parameter config: 2.5 TB of state on one rank)
echo '{"model_type": "gpt2", "vocab_size": 256, "n_positions": 64, "n_layer": 200, "n_head": 64, "n_embd": 8192}' \
  > "$work/huge.json"
if "$llmt" train --model_config "$work/huge.json" --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" \
     --output_dir "$work/run7" --block_size 64 --max_steps 1 --threads 1 2> "$work/err.txt" > /dev/null; then
  echo "FAIL: a run that cannot fit was started"; exit 1
fi
grep -q "this run needs .* GiB per rank (llmt plan: .* persistent.*) and this node has .* GiB available" "$work/err.txt" \
  || { echo "FAIL: no memory refusal"; cat "$work/err.txt"; exit 1; }
# and on a GPU, against the device's free memory (the emulator's device reports 16 GiB), before any
# allocation: it used to be left to the first cudaMalloc that failed, part way through loading
if [ -n "$simt" ]; then
  if "$simt" train --device cuda --model_config "$work/huge.json" --tokenizer_name_or_path bytes \
       --train_file "$work/corpus.txt" --output_dir "$work/run8" --block_size 64 --max_steps 1 2> "$work/err.txt" > /dev/null; then
    echo "FAIL: a run that cannot fit the GPU was started"; exit 1
  fi
  grep -q "this run needs .* GiB per rank (llmt plan: .*) and its GPU (cuda:0) has 16.00 GiB free of 16.00 GiB: lower" \
    "$work/err.txt" || { echo "FAIL: no GPU memory refusal"; cat "$work/err.txt"; exit 1; }
fi

# a diverging run (lr 10, no clipping) is said to diverge, once, with its step
"$llmt" train --model_config gpt2-tiny --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" --output_dir "$work/run5" \
  --save_strategy no --block_size 64 --per_device_train_batch_size 8 --max_steps 12 --learning_rate 10 --max_grad_norm 0 \
  --threads 2 > "$work/diverge.txt" 2>&1 || { echo "FAIL: the diverging run failed"; cat "$work/diverge.txt"; exit 1; }
[ "$(grep -c "warning step [0-9]*: .*training is diverging" "$work/diverge.txt")" -eq 1 ] \
  || { echo "FAIL: no single divergence warning"; cat "$work/diverge.txt"; exit 1; }
echo "PASS"
