#!/usr/bin/env bash
# Every path a command writes is checked against what it reads and every checkpoint before any work
# (train/output_path.h). llmt train --output_dir run/checkpoint-4 (or a --logging_dir or --cache_dir
# there) exited 0 having written its files into the checkpoint, and the first run's next resume set
# checkpoint-4 aside as corrupt and went back to checkpoint-2; --output_dir over the model it reads,
# --overwrite_output_dir removing the checkpoint it reads, bench --results and netcheck --write-env
# into a checkpoint were not refused either. (generate's --output: tests/cli/generate.sh; export's
# OUT_DIR: checkpoint_guard.sh.) Usage: output_paths.sh path/to/llmt
set -uo pipefail
llmt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
for i in $(seq 2000); do echo "the quick brown fox $i jumps over the lazy dog"; done > "$work/corpus.txt"
common=(--tokenizer_name_or_path bytes --per_device_train_batch_size 4 --threads 1 --cache_dir none --logging_steps 1
        --train_file "$work/corpus.txt" --block_size 32)
tiny=(--model_config gpt2-tiny)
"$llmt" train "${common[@]}" "${tiny[@]}" --max_steps 4 --save_steps 2 --output_dir "$work/run" > "$work/run.log" 2>&1 ||
  { tail -5 "$work/run.log"; fail "the first run"; }
ck="$work/run/checkpoint-4"
sum() { (cd "$1" && ls -A && cat ./*) | md5sum; }
before=$(sum "$ck")

refused() {  # refused <name> <expected message> command...: exits non-zero, says why, changes no checkpoint
  local name=$1 want=$2
  shift 2
  if "$llmt" "$@" > "$work/$name.log" 2>&1; then fail "$name: exit 0"; fi
  grep -qF -- "$want" "$work/$name.log" || { cat "$work/$name.log"; fail "$name: no \"$want\""; }
  [ "$(sum "$ck")" = "$before" ] || fail "$name: changed $ck: $(ls -A "$ck")"
  echo "refused: $name: $want"
}
refused output_dir "--output_dir $ck is the checkpoint $ck (it holds a checkpoint manifest" \
  train "${common[@]}" "${tiny[@]}" --max_steps 2 --output_dir "$ck"
refused inside "--output_dir $ck/more lies inside the checkpoint $ck" \
  train "${common[@]}" "${tiny[@]}" --max_steps 2 --output_dir "$ck/more"
refused logging_dir "--logging_dir $ck/runs lies inside the checkpoint" \
  train "${common[@]}" "${tiny[@]}" --max_steps 2 --output_dir "$work/other" --report_to tensorboard --logging_dir "$ck/runs"
[ ! -e "$work/other" ] || fail "the refused run made its output_dir"
refused cache_dir "--cache_dir $ck/cache lies inside the checkpoint" \
  train "${common[@]}" "${tiny[@]}" --max_steps 2 --output_dir "$work/other" --cache_dir "$ck/cache"
refused model_dir "--output_dir $work/run is --model_name_or_path $work/run, which it would overwrite" \
  train "${common[@]}" --max_steps 2 --model_name_or_path "$work/run" --output_dir "$work/run"
refused overwrite "--overwrite_output_dir would remove the checkpoint $ck, which --model_name_or_path" \
  train "${common[@]}" --max_steps 2 --model_name_or_path "$ck" --output_dir "$work/run" \
  --overwrite_output_dir True
refused bench_results "--results $ck/bench.jsonl lies inside the checkpoint" \
  bench --model gpt2-tiny --threads 1 --steps 1 --warmup 0 --seq_len 16 --results "$ck/bench.jsonl"
refused write_env "--write-env $ck/.llmt_env lies inside the checkpoint" netcheck --write-env "$ck/.llmt_env"

# what is not a checkpoint: another project's manifest.json (a web app's, $HOME's) above the output
mkdir -p "$work/webapp"
echo '{"name": "my app", "version": "1.0"}' > "$work/webapp/manifest.json"
"$llmt" train "${common[@]}" "${tiny[@]}" --max_steps 1 --save_strategy no --output_dir "$work/webapp/run" \
  > "$work/webapp.log" 2>&1 || { tail -5 "$work/webapp.log"; fail "an output under another project's manifest.json"; }
echo "accepted: an output under a manifest.json that is not a checkpoint's"
# an output file that exists and is writable, in a directory that is not (/dev/null; a shared file)
"$llmt" bench --model gpt2-tiny --threads 1 --steps 1 --warmup 0 --seq_len 16 --results /dev/null \
  > "$work/devnull.log" 2>&1 || { tail -5 "$work/devnull.log"; fail "bench --results /dev/null"; }
echo "accepted: bench --results /dev/null"

# the first run resumes from checkpoint-4, untouched
"$llmt" train "${common[@]}" "${tiny[@]}" --max_steps 6 --save_steps 2 --output_dir "$work/run" --resume_from_checkpoint latest \
  > "$work/resume.log" 2>&1 || { tail -5 "$work/resume.log"; fail "the resume"; }
grep -q "resume .*checkpoint-4: step 4" "$work/resume.log" || { cat "$work/resume.log"; fail "did not resume from checkpoint-4"; }
! grep -q corrupt "$work/resume.log" || { cat "$work/resume.log"; fail "a checkpoint was set aside"; }
echo "the first run resumes from its untouched checkpoint-4"
echo PASS
