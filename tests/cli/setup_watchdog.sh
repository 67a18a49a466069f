#!/usr/bin/env bash
# The collective watchdog covers the whole run from MPI_Init on, not just training: a rank that stops
# (SIGSTOP, as a hung node would) before MPI_Init, while tokenizing, or before the FSDP store splits its
# communicators ends the job with the watchdog's message and status 3 within about --ddp_timeout;
# before, rank 0 waited forever in MPI_Init, MPI_Comm_split or MPI_Comm_dup. Ranks running different
# subcommands are told so at once instead of hanging in mismatched collectives.
# The stops come from LLMT_TEST_STOP=RANK:WHERE (the rank raises SIGSTOP itself at that point).
# Usage: setup_watchdog.sh path/to/llmt
set -uo pipefail
llmt=$1
work=$(mktemp -d)
cleanup() {
  pkill -KILL -f "llmt.*$work/" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
for i in $(seq 300); do echo "line $i of a corpus that only needs to be long enough"; done > "$work/corpus.txt"
mpirun=(mpirun)
[ "$(id -u)" -ne 0 ] || mpirun+=(--allow-run-as-root)
[ "$(nproc)" -ge 2 ] || mpirun+=(--oversubscribe)
mpi=("${mpirun[@]}" -np 2)
timeout_s=3
bound=20  # seconds after the timeout by which every rank must be gone
train=(train --model_config gpt2-tiny --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" --block_size 64
       --per_device_train_batch_size 2 --max_steps 2 --save_strategy no --threads 1 --fsdp "full_shard auto_wrap"
       --ddp_timeout $timeout_s)

# stop_at WHERE WANT: rank 1 stops itself at WHERE; the job must end with status 3, saying WANT
stop_at() {
  local where=$1 want=$2 out="$work/$1"
  local start
  start=$(date +%s)
  LLMT_TEST_STOP=1:$where OMP_NUM_THREADS=1 timeout 120 "${mpi[@]}" -x LLMT_TEST_STOP "$llmt" "${train[@]}" \
    --output_dir "$out" > "$out.log" 2>&1
  local rc=$?
  local took=$(( $(date +%s) - start ))
  echo "rank 1 stopped at $where: exit $rc after ${took}s (--ddp_timeout $timeout_s)"
  grep -q "stopping itself at $where" "$out.log" || { echo "FAIL: $where: rank 1 never reached it"; tail "$out.log"; exit 1; }
  [ $rc -eq 3 ] || { echo "FAIL: $where: expected the watchdog's status 3, got $rc"; tail -20 "$out.log"; exit 1; }
  [ $took -le $((timeout_s + bound)) ] || { echo "FAIL: $where: took ${took}s to end"; exit 1; }
  grep -q "rank 0: $want.*did not finish within $timeout_s s (--ddp_timeout)" "$out.log" \
    || { echo "FAIL: $where: no watchdog message naming '$want'"; tail -20 "$out.log"; exit 1; }
  grep "did not finish within" "$out.log" | head -1
}
stop_at init "MPI_Init"
stop_at data "all_gather"           # the ranks' data check, the first collective after tokenizing
stop_at store "comm_split over 2"   # the FSDP store's communicators

# different subcommands on different ranks: an error naming both, at once
out="$work/mixed"
timeout 120 "${mpirun[@]}" -np 1 "$llmt" "${train[@]}" --output_dir "$out" : -np 1 "$llmt" export "$work/nockpt" "$work/x" \
  > "$out.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "FAIL: mixed commands: exit $rc"; tail -20 "$out.log"; exit 1; }
grep -q "the ranks disagree on their command.*llmt train on rank 0; llmt export on rank 1" "$out.log" \
  || { echo "FAIL: mixed commands: no message naming them"; tail -20 "$out.log"; exit 1; }
echo "mixed commands: exit $rc: $(grep -m1 'disagree on their command' "$out.log")"
echo PASS
