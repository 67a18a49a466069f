#!/usr/bin/env bash
# The Hugging Face Trainer flags that used to be refused, through the executable: when lines are
# logged (--logging_strategy, --logging_first_step), --save_only_model checkpoints (no state: resuming
# one says so), run_clm's --validation_split_percentage, --overwrite_cache,
# --preprocessing_num_workers, a repeated flag (the last wins), and the layout line naming the bf16
# matmul kernels. Usage: trainer_flags.sh path/to/llmt
set -uo pipefail
llmt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 3000); do echo "flags test line $i: the quick brown fox jumps over the lazy dog"; done > "$work/corpus.txt"
common=(--model_config gpt2-tiny --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" --block_size 64
        --threads 1 --cache_dir "$work/cache" --save_strategy no)
steps() { grep '"loss"' "$1/metrics.jsonl" | sed 's/.*"step":\([0-9]*\).*/\1/' | tr '\n' ' ' | sed 's/ $//'; }
run() {  # run <name> flags...: train into $work/<name>, log in $work/<name>.log
  local name=$1
  shift
  "$llmt" train "${common[@]}" --output_dir "$work/$name" "$@" > "$work/$name.log" 2>&1 \
    || { echo "FAIL: $name"; tail -20 "$work/$name.log"; exit 1; }
}
expect() {  # expect <what> <got> <want>
  [ "$2" = "$3" ] || { echo "FAIL: $1: got '$2', want '$3'"; exit 1; }
  echo "$1: $2"
}

# 3000 lines: about 3000 blocks of 64 tokens; 256 sequences a step: about 12 steps an epoch
run epoch --per_device_train_batch_size 256 --max_steps 30 --logging_strategy epoch
e=$(sed -n 's/^train .*(\([0-9]*\) per epoch).*/\1/p' "$work/epoch.log")
expect "--logging_strategy epoch, $e steps an epoch, 30 steps: logged steps" "$(steps "$work/epoch")" "$e $((2 * e)) 30"
run first --per_device_train_batch_size 2 --max_steps 20 --logging_steps 10 --logging_first_step True
expect "--logging_first_step, --logging_steps 10: logged steps" "$(steps "$work/first")" "1 10 20"
run none --per_device_train_batch_size 2 --max_steps 5 --logging_strategy no
expect "--logging_strategy no: logged steps" "$(steps "$work/none")" ""

# a repeated flag: the last value wins, and the log says so
run twice --per_device_train_batch_size 2 --max_steps 3 --logging_steps 1 --max_steps 2
expect "--max_steps 3 ... --max_steps 2: logged steps" "$(steps "$work/twice")" "1 2"
grep -q 'flags  --max_steps is given more than once: the last value, "2", wins (was "3")' "$work/twice.log" \
  || { echo "FAIL: no line about the repeated flag"; head "$work/twice.log"; exit 1; }

# --save_only_model: the checkpoint holds the model, not the state, and resuming it says why it cannot
run model_only --per_device_train_batch_size 2 --max_steps 4 --save_strategy steps --save_steps 4 --save_only_model True
[ -f "$work/model_only/checkpoint-4/model.safetensors" ] && [ ! -e "$work/model_only/checkpoint-4/state.h5" ] \
  || { echo "FAIL: --save_only_model checkpoint"; ls "$work/model_only/checkpoint-4"; exit 1; }
if "$llmt" train "${common[@]}" --per_device_train_batch_size 2 --max_steps 8 --output_dir "$work/model_only" \
     --resume_from_checkpoint latest > "$work/resume.log" 2>&1; then echo "FAIL: resumed a model-only checkpoint"; exit 1; fi
grep -q "checkpoint-4 holds no training state (it was saved with --save_only_model), so it cannot be resumed" \
  "$work/resume.log" || { echo "FAIL: no reason given"; tail -3 "$work/resume.log"; exit 1; }
echo "--save_only_model: checkpoint-4 without state.h5; resuming it is refused with the reason"

# run_clm's --validation_split_percentage: the first 10% of the lines evaluate, the rest train
run split --per_device_train_batch_size 2 --max_steps 2 --do_eval True --validation_split_percentage 10 \
  --preprocessing_num_workers 1
grep -q "data   train (after the first 10%): tokenizing 2700 lines .*(1 thread, --preprocessing_num_workers)" \
  "$work/split.log" || { echo "FAIL: train split"; grep data "$work/split.log"; exit 1; }
grep -q "data   validation (the first 10% of train): 300 lines" "$work/split.log" \
  || { echo "FAIL: validation split"; grep data "$work/split.log"; exit 1; }
grep -q "eval_loss" "$work/split.log" || { echo "FAIL: no evaluation"; exit 1; }
echo "--validation_split_percentage 10: 2700 lines train, 300 evaluate"

# --overwrite_cache: the cached file is removed and written again
run cached --per_device_train_batch_size 2 --max_steps 1
grep -q "from the token cache" "$work/cached.log" || { echo "FAIL: the cache was not used"; grep data "$work/cached.log"; exit 1; }
run overwrite --per_device_train_batch_size 2 --max_steps 1 --overwrite_cache True
grep -q -- "--overwrite_cache: removed .*text-corpus.txt-" "$work/overwrite.log" && grep -q "token cache written" "$work/overwrite.log" \
  || { echo "FAIL: --overwrite_cache"; grep data "$work/overwrite.log"; exit 1; }
echo "--overwrite_cache: the cache file was removed and written again"

# --bf16 on the CPU: after the first step, a layout line names the kernel each bf16 matmul shape class ran
LLMT_CPU_BF16_MATMUL=fp32 run bf16 --per_device_train_batch_size 2 --max_steps 1 --bf16 True
grep -q "layout bf16 matmul kernels by shape class .*NT s.s.s: fp32 (forced by LLMT_CPU_BF16_MATMUL=fp32)" \
  "$work/bf16.log" || { echo "FAIL: the bf16 kernels' layout line"; grep layout "$work/bf16.log"; exit 1; }
echo "--bf16 True: $(grep -o 'layout bf16 matmul kernels.*' "$work/bf16.log" | cut -c1-120)..."
echo PASS
