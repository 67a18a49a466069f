#!/usr/bin/env bash
# A rank that dies mid-training, by an error, kill -9 or a crash, ends the whole job promptly with a
# non-zero status: no rank is left waiting in a collective, and a crashing rank names itself.
# Usage: rank_failure.sh path/to/llmt
set -uo pipefail
llmt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 3000); do echo "line $i of a corpus that only needs to be long enough"; done > "$work/corpus.txt"
mpi=(mpirun --oversubscribe -np 3)
[ "$(id -u)" -ne 0 ] || mpi+=(--allow-run-as-root)
train=("$llmt" train --model_config gpt2-tiny --tokenizer_name_or_path bytes --train_file "$work/corpus.txt"
       --block_size 64 --per_device_train_batch_size 4 --max_steps 100000 --logging_steps 1 --save_strategy no
       --fsdp "full_shard auto_wrap" --threads 1)

# 1. an error on one rank (the fault-injection switch LLMT_FAIL_AT_STEP=rank:step)
start=$(date +%s)
LLMT_FAIL_AT_STEP=1:5 timeout 60 "${mpi[@]}" -x LLMT_FAIL_AT_STEP "${train[@]}" --output_dir "$work/a" > "$work/a.log" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
echo "error on rank 1: exit $rc after ${took}s"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "FAIL: the job did not end with an error (rc $rc)"; cat "$work/a.log"; exit 1; }
[ "$(grep -c 'injected failure' "$work/a.log")" -eq 1 ] || { echo "FAIL: the failing rank's message should appear once"; cat "$work/a.log"; exit 1; }

# 2. kill -9 of one rank while the others train
timeout 90 "${mpi[@]}" "${train[@]}" --output_dir "$work/b" > "$work/b.log" 2>&1 &
job=$!
for _ in $(seq 300); do grep -q "step .*10/" "$work/b.log" 2>/dev/null && break; sleep 0.3; done
grep -q "step .*10/" "$work/b.log" || { echo "FAIL: training did not start"; tail "$work/b.log"; exit 1; }
victim=$(pgrep -f "^$llmt train.*$work/b" | tail -n 1)  # a rank, not mpirun or timeout
[ -n "$victim" ] || { echo "FAIL: no rank to kill"; cat "$work/b.log"; exit 1; }
start=$(date +%s)
kill -9 "$victim"
wait $job
rc=$?
took=$(( $(date +%s) - start ))
echo "kill -9 of pid $victim: exit $rc after ${took}s"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "FAIL: the job did not end (rc $rc)"; tail -20 "$work/b.log"; exit 1; }
[ $took -le 30 ] || { echo "FAIL: took ${took}s to end"; exit 1; }
if pgrep -f "^$llmt train.*$work/b" > /dev/null; then echo "FAIL: ranks left running"; exit 1; fi
# 3. SIGUSR1 (Slurm's warning before the time limit) to the ranks: save a checkpoint, exit 0
timeout 120 "${mpi[@]}" "${train[@]}" --output_dir "$work/c" > "$work/c.log" 2>&1 &
job=$!
for _ in $(seq 300); do grep -q "step .*10/" "$work/c.log" 2>/dev/null && break; sleep 0.3; done
grep -q "step .*10/" "$work/c.log" || { echo "FAIL: training did not start"; tail "$work/c.log"; exit 1; }
pkill -USR1 -f "^$llmt train.*$work/c"
wait $job
rc=$?
echo "SIGUSR1: exit $rc"
[ $rc -eq 0 ] || { echo "FAIL: a signalled run should stop cleanly"; tail -20 "$work/c.log"; exit 1; }
ls "$work/c" | grep -q '^checkpoint-[0-9]*$' || { echo "FAIL: no checkpoint after SIGUSR1"; exit 1; }

# 3b. SIGINT delivered to the ranks themselves (Ctrl-C reaching them; mpirun's own Ctrl-C is its abort,
#     README "Stopping"): the same checkpoint and exit 0 (it killed them, nothing saved)
timeout 120 "${mpi[@]}" "${train[@]}" --output_dir "$work/c2" > "$work/c2.log" 2>&1 &
job=$!
for _ in $(seq 300); do grep -q "step .*10/" "$work/c2.log" 2>/dev/null && break; sleep 0.3; done
grep -q "step .*10/" "$work/c2.log" || { echo "FAIL: training did not start"; tail "$work/c2.log"; exit 1; }
pkill -INT -f "^$llmt train.*$work/c2"
wait $job
rc=$?
echo "SIGINT to the ranks: exit $rc"
[ $rc -eq 0 ] || { echo "FAIL: SIGINT should stop the run cleanly"; tail -20 "$work/c2.log"; exit 1; }
ls "$work/c2" | grep -q '^checkpoint-[0-9]*$' || { echo "FAIL: no checkpoint after SIGINT"; exit 1; }

# 4. SIGUSR1 while the data is still being tokenized (Slurm's warning can come that early): it used to
#    kill every rank by signal 10; now the run stops before the first step, exit 0, nothing saved
for _ in $(seq 5); do cat "$work/corpus.txt"; done > "$work/part.txt"
for _ in $(seq 120); do cat "$work/part.txt"; done > "$work/big.txt"  # ~60 MB: seconds of tokenizing
LLMT_CACHE="$work/cache" timeout 120 "${mpi[@]}" -x LLMT_CACHE "${train[@]/$work\/corpus.txt/$work/big.txt}" \
  --output_dir "$work/d" > "$work/d.log" 2>&1 &
job=$!
for _ in $(seq 300); do grep -q "tokenizing" "$work/d.log" 2>/dev/null && break; sleep 0.05; done
grep -q "tokenizing" "$work/d.log" || { echo "FAIL: tokenizing did not start"; cat "$work/d.log"; exit 1; }
pkill -USR1 -f "^$llmt train.*$work/d"
wait $job
rc=$?
echo "SIGUSR1 while tokenizing: exit $rc"
[ $rc -eq 0 ] || { echo "FAIL: a signal during loading should stop cleanly"; tail -20 "$work/d.log"; exit 1; }
grep -q "stopped before the first step by a signal; nothing to save" "$work/d.log" \
  || { echo "FAIL: no 'stopped before the first step' line"; tail -20 "$work/d.log"; exit 1; }
if ls "$work/d" | grep -q '^checkpoint-'; then echo "FAIL: a checkpoint was written before any step"; exit 1; fi

# 5. a rank that crashes (SIGSEGV, here sent by kill): before it dies it names itself (rank, host,
#    pid, the signal) and prints a backtrace; the job still ends with the launcher's report of
#    signal 11
timeout 90 "${mpi[@]}" "${train[@]}" --output_dir "$work/e" > "$work/e.log" 2>&1 &
job=$!
for _ in $(seq 300); do grep -q "step .*10/" "$work/e.log" 2>/dev/null && break; sleep 0.3; done
grep -q "step .*10/" "$work/e.log" || { echo "FAIL: training did not start"; tail "$work/e.log"; exit 1; }
victim=$(pgrep -f "^$llmt train.*$work/e" | tail -n 1)
kill -SEGV "$victim"
wait $job
rc=$?
echo "SIGSEGV to pid $victim: exit $rc"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "FAIL: the job did not end (rc $rc)"; tail -20 "$work/e.log"; exit 1; }
grep -qE "^llmt rank [0-9] of 3 on $(hostname), pid $victim: fatal signal SIGSEGV \(invalid memory access\) sent by pid [0-9]+; backtrace:" \
  "$work/e.log" || { echo "FAIL: no crash report naming pid $victim"; grep -v '^step' "$work/e.log" | tail -30; exit 1; }
frames=$(grep -a -A 64 "pid $victim: fatal signal" "$work/e.log" | grep -acE '\[0x[0-9a-f]+\]$')
[ "$frames" -ge 2 ] || { echo "FAIL: no backtrace"; grep -a -A 8 "fatal signal" "$work/e.log"; exit 1; }
grep -A 3 "pid $victim: fatal signal" "$work/e.log" | sed 's/^/   /'
echo "PASS"
