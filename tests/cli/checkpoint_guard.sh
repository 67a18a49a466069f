#!/usr/bin/env bash
# What a checkpoint accepts and refuses, end to end (issue 23): a manifest that leaves files out
# (edited to "files": {} beside another run's state.h5) is refused by export and resume; `llmt
# export` never writes into a checkpoint; a resume with other data (train file, block size) is
# refused naming what differs, unless --ignore_data_skip True.
# Usage: checkpoint_guard.sh path/to/llmt
set -uo pipefail
llmt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 2000); do echo "the quick brown fox $i jumps over the lazy dog"; done > "$work/corpus.txt"
for i in $(seq 2000); do echo "another text, line $i, of other words"; done > "$work/other.txt"
common=(--model_config gpt2-tiny --tokenizer_name_or_path bytes --per_device_train_batch_size 4 --threads 1
        --cache_dir none --logging_steps 1)
fail() { echo "FAIL: $*"; exit 1; }
expect_refusal() {  # expect_refusal LOG PATTERN WHAT -- command...
  local log=$1 pattern=$2 what=$3
  shift 4
  if "$@" > "$log" 2>&1; then fail "$what was accepted"; fi
  grep -q -- "$pattern" "$log" || { echo "FAIL: $what: the error does not say \"$pattern\""; cat "$log"; exit 1; }
}

"$llmt" train "${common[@]}" --train_file "$work/corpus.txt" --block_size 32 --max_steps 4 --save_steps 4 \
  --output_dir "$work/a" > "$work/a.log" 2>&1 || { cat "$work/a.log"; fail "training run a"; }
"$llmt" train "${common[@]}" --train_file "$work/corpus.txt" --block_size 32 --max_steps 4 --save_steps 4 \
  --seed 7 --output_dir "$work/b" > "$work/b.log" 2>&1 || { cat "$work/b.log"; fail "training run b"; }
ck="$work/a/checkpoint-4"

# 1. a manifest edited to list no files, beside another run's state.h5
cp -r "$ck" "$work/edited"
python3 - "$work/edited/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
m["files"] = {}
json.dump(m, open(sys.argv[1], "w"))
EOF
cp "$work/b/checkpoint-4/state.h5" "$work/edited/state.h5"
expect_refusal "$work/e1.log" "not listed in the manifest" "export of a checkpoint whose manifest lists no files" \
  -- "$llmt" export "$work/edited" "$work/e1"
[ ! -e "$work/e1/model.safetensors" ] || fail "the refused export wrote a model"
expect_refusal "$work/r1.log" "not listed in the manifest" "resume from a checkpoint whose manifest lists no files" \
  -- "$llmt" train "${common[@]}" --train_file "$work/corpus.txt" --block_size 32 --max_steps 8 \
     --output_dir "$work/r1" --resume_from_checkpoint "$work/edited"
# the newest checkpoint in an output_dir, so edited, is not taken by `latest`
mkdir -p "$work/c"
cp -r "$ck" "$work/c/checkpoint-4"
cp -r "$work/edited" "$work/c/checkpoint-6"
python3 - "$work/c/checkpoint-6/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
m["step"] = 6
json.dump(m, open(sys.argv[1], "w"))
EOF
"$llmt" train "${common[@]}" --train_file "$work/corpus.txt" --block_size 32 --max_steps 5 --save_strategy no \
  --output_dir "$work/c" --resume_from_checkpoint latest > "$work/c.log" 2>&1 || { cat "$work/c.log"; fail "resume latest"; }
grep -q "checkpoint-6 failed its checks: .*state.h5, trainer_state.json not listed in the manifest" "$work/c.log" \
  || { cat "$work/c.log"; fail "latest took, or did not name, the edited checkpoint-6"; }
grep -q "resume .*checkpoint-4: step 4" "$work/c.log" || { cat "$work/c.log"; fail "latest did not fall back to checkpoint-4"; }
echo "an edited manifest: export and resume refuse it, naming the unlisted state.h5; latest falls back"

# 2. export into the checkpoint, inside it, or into a directory holding a manifest
cp -r "$ck" "$work/d"
sum_before=$(cat "$work/d"/* | md5sum)
expect_refusal "$work/x1.log" "is the checkpoint" "export into the checkpoint itself" -- "$llmt" export "$work/d" "$work/d"
expect_refusal "$work/x2.log" "lies inside the checkpoint" "export into a new folder inside the checkpoint" \
  -- "$llmt" export "$work/d" "$work/d/sub/hf"
expect_refusal "$work/x3.log" "is the checkpoint" "export through ./d/../d" -- "$llmt" export "$work/d" "$work/./d/../d"
ln -s "$work/d" "$work/link"
expect_refusal "$work/x4.log" "the checkpoint" "export through a link to the checkpoint" \
  -- "$llmt" export "$work/d" "$work/link"
expect_refusal "$work/x5.log" "holds a checkpoint manifest" "export into another checkpoint" \
  -- "$llmt" export "$work/d" "$work/b/checkpoint-4"
expect_refusal "$work/x6.log" "holds a checkpoint manifest" "export inside another checkpoint" \
  -- "$llmt" export "$work/d" "$work/b/checkpoint-4/x"
[ "$(cat "$work/d"/* | md5sum)" = "$sum_before" ] || fail "a refused export changed the checkpoint's files"
"$llmt" export "$work/d" "$work/hf" > "$work/x7.log" 2>&1 || { cat "$work/x7.log"; fail "export to a fresh directory"; }
"$llmt" export "$work/d" "$work/a" > "$work/x8.log" 2>&1 || { cat "$work/x8.log"; fail "export to the run's output_dir"; }
"$llmt" train "${common[@]}" --train_file "$work/corpus.txt" --block_size 32 --max_steps 5 --save_strategy no \
  --output_dir "$work/d2" --resume_from_checkpoint "$work/d" > "$work/d2.log" 2>&1 \
  || { cat "$work/d2.log"; fail "resume from the checkpoint after the refused exports"; }
echo "export: refused into, inside, or through a link to a checkpoint, and into another one; the checkpoint resumes"

# 3. a resume with other data: refused, naming what differs, unless --ignore_data_skip True
resume() {  # resume OUT_DIR flags...
  local out=$1
  shift
  "$llmt" train "${common[@]}" --max_steps 6 --save_strategy no --output_dir "$out" --resume_from_checkpoint "$ck" "$@"
}
expect_refusal "$work/s1.log" 'source "--train_file .*corpus.txt", now "--train_file .*other.txt"' \
  "a resume on another --train_file" -- resume "$work/s1" --train_file "$work/other.txt" --block_size 32
grep -q "ignore_data_skip True" "$work/s1.log" || { cat "$work/s1.log"; fail "the refusal does not name the way out"; }
expect_refusal "$work/s2.log" "block_size 32, now 16" "a resume with another --block_size" \
  -- resume "$work/s2" --train_file "$work/corpus.txt" --block_size 16
cp "$work/corpus.txt" "$work/saved.txt"
sed -i '5s/fox/cat/' "$work/corpus.txt"
expect_refusal "$work/s3.log" "its content or the tokenizer's files changed" "a resume on an edited train file" \
  -- resume "$work/s3" --train_file "$work/corpus.txt" --block_size 32
cp "$work/saved.txt" "$work/corpus.txt"
mkdir -p "$work/moved" && cp "$work/corpus.txt" "$work/moved/corpus.txt"
resume "$work/s4" --train_file "$work/moved/corpus.txt" --block_size 32 > "$work/s4.log" 2>&1 \
  || { cat "$work/s4.log"; fail "a resume on the same data under another path"; }
resume "$work/s5" --train_file "$work/other.txt" --block_size 32 --ignore_data_skip True > "$work/s5.log" 2>&1 \
  || { cat "$work/s5.log"; fail "--ignore_data_skip True did not let the data change"; }
grep -q "warning .* was trained on other data: .*(--ignore_data_skip True)" "$work/s5.log" \
  || { cat "$work/s5.log"; fail "--ignore_data_skip True: no warning"; }
grep -q "step      6/6" "$work/s5.log" || { cat "$work/s5.log"; fail "--ignore_data_skip True: the run did not train on"; }
echo "resume with another train file, block size or edited content: refused naming it; the same content moved resumes; --ignore_data_skip True continues"
