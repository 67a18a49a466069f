#!/usr/bin/env bash
# Ranks check at start that they run the same job: one rank given another learning rate, train file,
# output dir, model, max_steps or fsdp, or a train file of the same name with other content (a
# node-local copy), ends the whole job at once with an error naming the field and the ranks; before,
# these ran to exit 0, aborted inside MPI, or ended in the watchdog blaming the network.
# Usage: rank_agreement.sh path/to/llmt
set -uo pipefail
llmt=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")  # absolute: the ranks start in other folders
work=$(mktemp -d)
cleanup() {
  pkill -KILL -f "llmt.*$work/" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/a" "$work/b"
for i in $(seq 300); do echo "line $i of a corpus that only needs to be long enough"; done > "$work/a/corpus.txt"
sed 's/line/LINE/' "$work/a/corpus.txt" > "$work/b/corpus.txt"  # the same size, other content
mpirun=(mpirun)
[ "$(id -u)" -ne 0 ] || mpirun+=(--allow-run-as-root)
[ "$(nproc)" -ge 2 ] || mpirun+=(--oversubscribe)
common=(--tokenizer_name_or_path bytes --block_size 64 --per_device_train_batch_size 2 --save_strategy no --threads 1
        --ddp_timeout 5 --cache_dir "$work/cache")
failures=0

# differ NAME WANT RANK0_ARGS -- RANK1_ARGS: the two ranks get different flags; the job must fail
# within seconds, saying WANT
differ() {
  local name=$1 want=$2
  shift 2
  local r0=() r1=()
  while [ "$1" != -- ]; do r0+=("$1"); shift; done
  shift
  r1=("$@")
  local log="$work/$name.log" start rc
  start=$(date +%s)
  OMP_NUM_THREADS=1 timeout 60 "${mpirun[@]}" -np 1 -wdir "$work/a" "$llmt" train "${common[@]}" "${r0[@]}" \
    : -np 1 -wdir "$work/b" "$llmt" train "${common[@]}" "${r1[@]}" > "$log" 2>&1
  rc=$?
  local took=$(( $(date +%s) - start ))
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $rc -eq 3 ] || ! grep -qF -- "$want" "$log"; then
    echo "FAIL $name: exit $rc after ${took}s; the error should say: $want"
    grep -m3 "error" "$log" | sed 's/^/  /'
    failures=$((failures + 1))
  else
    echo "ok   $name: exit $rc after ${took}s: $(grep -m1 -o 'disagree on .*' "$log")"
  fi
}
base=(--model_config gpt2-tiny --train_file "$work/a/corpus.txt" --max_steps 2 --output_dir "$work/out")
differ learning_rate "--learning_rate: 0.001 on rank 0; 0.002 on rank 1" \
  "${base[@]}" --learning_rate 1e-3 -- "${base[@]}" --learning_rate 2e-3
differ train_file "--train_file: $work/a/corpus.txt on rank 0; $work/b/corpus.txt on rank 1" \
  "${base[@]}" -- "${base[@]}" --train_file "$work/b/corpus.txt"
differ output_dir "--output_dir: $work/out on rank 0; $work/out2 on rank 1" \
  "${base[@]}" -- "${base[@]}" --output_dir "$work/out2"
differ model "--model_config: gpt2-tiny on rank 0; llama-tiny on rank 1" \
  "${base[@]}" -- "${base[@]}" --model_config llama-tiny
differ max_steps_and_fsdp "--max_steps: 2 on rank 0; 3 on rank 1 | --fsdp: full_shard on rank 0; \"\" on rank 1" \
  "${base[@]}" --fsdp full_shard -- "${base[@]}" --max_steps 3
# one relative name, a file of other content on each rank (mpirun -wdir): caught by the data check
same=(--model_config gpt2-tiny --train_file corpus.txt --max_steps 2 --output_dir "$work/out")
differ data_content "the ranks disagree on their data (every rank must run the same job): train data: 256 examples, 16384 tokens, CRC-32C" \
  "${same[@]}" -- "${same[@]}"

# and ranks that agree still train
OMP_NUM_THREADS=1 timeout 60 "${mpirun[@]}" -np 2 "$llmt" train "${common[@]}" "${base[@]}" > "$work/agree.log" 2>&1 \
  && grep -q "step *2/2" "$work/agree.log" && echo "ok   ranks that agree train" \
  || { echo "FAIL ranks that agree did not train"; tail "$work/agree.log"; failures=$((failures + 1)); }

if [ $failures -ne 0 ]; then echo "$failures FAILED"; exit 1; fi
echo PASS
