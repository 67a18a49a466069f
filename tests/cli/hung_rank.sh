#!/usr/bin/env bash
# A rank that stops without dying (SIGSTOP: a hung node, a stuck driver) ends the whole job through
# the collective watchdog: the ranks waiting for it exit non-zero within --ddp_timeout plus a
# bound, naming the collective, the step and the rank that did not arrive. Also an asynchronous NCCL error (the emulated build's
# stand-in, LLMT_SIMT_NCCL_FAIL) ends the job at once, before the timeout.
# Usage: hung_rank.sh path/to/llmt [path/to/llmt_simt]
#   with llmt_simt, the same again with --device cuda --ddp_backend nccl (the NCCL communicator)
set -uo pipefail
llmt=$1
simt=${2:-}
work=$(mktemp -d)
cleanup() {
  pkill -KILL -f "train.*$work/" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
for i in $(seq 3000); do echo "line $i of a corpus that only needs to be long enough"; done > "$work/corpus.txt"
mpi=(mpirun -np 2)
[ "$(id -u)" -ne 0 ] || mpi+=(--allow-run-as-root)
[ "$(nproc)" -ge 2 ] || mpi+=(--oversubscribe)
timeout_s=4
bound=30  # seconds after the timeout by which every rank must be gone

# stop_one <program> <name> [flags...]: train, SIGSTOP one rank at step 3, expect the job to end
stop_one() {
  local prog=$1 name=$2
  shift 2
  local out="$work/$name"
  OMP_NUM_THREADS=1 timeout 120 "${mpi[@]}" "$prog" train --model_config gpt2-tiny --tokenizer_name_or_path bytes \
    --train_file "$work/corpus.txt" --block_size 64 --per_device_train_batch_size 4 --max_steps 100000 \
    --logging_steps 1 --save_strategy no --fsdp "full_shard auto_wrap" --threads 1 --ddp_timeout $timeout_s \
    --output_dir "$out" "$@" > "$out.log" 2>&1 &
  local job=$!
  for _ in $(seq 400); do grep -q "step .*3/" "$out.log" 2>/dev/null && break; sleep 0.3; done
  grep -q "step .*3/" "$out.log" || { echo "FAIL: $name: training did not start"; tail "$out.log"; exit 1; }
  local victim
  victim=$(pgrep -f "^$prog train.*$out" | tail -n 1)  # a rank, not mpirun or timeout
  [ -n "$victim" ] || { echo "FAIL: $name: no rank to stop"; cat "$out.log"; exit 1; }
  local start
  start=$(date +%s)
  kill -STOP "$victim"
  wait $job
  local rc=$?
  local took=$(( $(date +%s) - start ))
  echo "$name: SIGSTOP of pid $victim: exit $rc after ${took}s (--ddp_timeout $timeout_s)"
  [ $rc -eq 3 ] || { echo "FAIL: $name: expected the watchdog's exit status 3, got $rc"; tail -20 "$out.log"; exit 1; }
  # the waiting rank's collective may have started a moment before the stop
  [ $took -ge $((timeout_s - 1)) ] || { echo "FAIL: $name: ended before the timeout"; tail -20 "$out.log"; exit 1; }
  [ $took -le $((timeout_s + bound)) ] || { echo "FAIL: $name: took ${took}s to end"; exit 1; }
  grep -q "did not finish within $timeout_s s (--ddp_timeout)" "$out.log" \
    || { echo "FAIL: $name: no watchdog message"; tail -20 "$out.log"; exit 1; }
  grep "did not finish within" "$out.log" | head -1
  grep -q "step [0-9]*) did not finish within" "$out.log" || { echo "FAIL: $name: the message names no step"; exit 1; }
  # the ranks left waiting name the stopped one (from the progress records under output_dir)
  grep -q "that did not arrive: [0-9]* ([^ ]* pid $victim; its last record" "$out.log" \
    || { echo "FAIL: $name: the message does not name the stopped rank (pid $victim)"; tail -5 "$out.log"; exit 1; }
  if pgrep -f "^$prog train.*$out" > /dev/null; then echo "FAIL: $name: ranks left running"; exit 1; fi
}

stop_one "$llmt" mpi
if [ -n "$simt" ]; then
  stop_one "$simt" nccl --device cuda --ddp_backend nccl

  # an asynchronous NCCL error on rank 1 (its 40th collective): reported at once, not after the timeout
  out="$work/async"
  start=$(date +%s)
  LLMT_SIMT_NCCL_FAIL=1:40 OMP_NUM_THREADS=1 timeout 120 "${mpi[@]}" -x LLMT_SIMT_NCCL_FAIL "$simt" train \
    --device cuda --ddp_backend nccl --model_config gpt2-tiny --tokenizer_name_or_path bytes \
    --train_file "$work/corpus.txt" --block_size 64 --per_device_train_batch_size 4 --max_steps 100000 \
    --logging_steps 1 --save_strategy no --fsdp "full_shard auto_wrap" --threads 1 --ddp_timeout 600 \
    --output_dir "$out" > "$out.log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  echo "async NCCL error on rank 1: exit $rc after ${took}s (--ddp_timeout 600)"
  [ $rc -eq 3 ] || { echo "FAIL: async: expected the watchdog's exit status 3, got $rc"; tail -20 "$out.log"; exit 1; }
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "FAIL: async: the job did not end by itself (rc $rc)"; tail -20 "$out.log"; exit 1; }
  [ $took -le 60 ] || { echo "FAIL: async: took ${took}s"; exit 1; }
  grep -q "rank 1: NCCL reported an error .*injected failure" "$out.log" \
    || { echo "FAIL: async: no message naming the NCCL error"; tail -20 "$out.log"; exit 1; }
  grep "NCCL reported an error" "$out.log" | head -1
fi
echo PASS
