#!/usr/bin/env bash
# The crash report (engine/core/crash.h) of one process, in llmt and in llmt_simt, whose emulator
# chains its own SIGSEGV handler to it: a SIGSEGV mid-training prints exactly one report naming the
# pid, then the process dies of the signal (status 139). llmt_simt used to report the crash again
# and again, forever. (A rank of an MPI job: rank_failure.sh part 5.)
# Usage: crash_report.sh path/to/llmt path/to/llmt_simt
set -uo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 3000); do echo "line $i of a corpus that only needs to be long enough"; done > "$work/corpus.txt"
for run in "$1 cpu" "$2 cuda"; do  # llmt on the CPU; llmt_simt with its emulated GPU
  read -r prog device <<< "$run"
  name=$(basename "$prog")-$device
  timeout -k 5 60 "$prog" train --device $device --model_config gpt2-tiny --tokenizer_name_or_path bytes \
    --train_file "$work/corpus.txt" --block_size 64 --per_device_train_batch_size 2 --max_steps 100000 \
    --logging_steps 1 --save_strategy no --threads 1 --output_dir "$work/$name" > "$work/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do grep -q "^step .*2/" "$work/$name.log" 2> /dev/null && break; sleep 0.1; done
  grep -q "^step .*2/" "$work/$name.log" || { echo "FAIL: $name: training did not start"; tail "$work/$name.log"; exit 1; }
  victim=$(pgrep -P $pid)  # the program, under timeout
  kill -SEGV "$victim"
  wait $pid
  rc=$?
  reports=$(grep -ac "fatal signal" "$work/$name.log")
  echo "$name: SIGSEGV to pid $victim: exit $rc, $reports report(s)"
  [ $rc -eq 139 ] || { echo "FAIL: $name should die of the signal (139), not $rc"; tail -c 2000 "$work/$name.log"; exit 1; }
  [ "$reports" -eq 1 ] || { echo "FAIL: $name printed $reports reports, expected one"; tail -c 2000 "$work/$name.log"; exit 1; }
  grep -aqE "^llmt on $(hostname), pid $victim: fatal signal SIGSEGV \\(invalid memory access\\) sent by pid [0-9]+; backtrace:$" \
    "$work/$name.log" || { echo "FAIL: $name: the report does not name pid $victim"; grep -a -A3 "fatal signal" "$work/$name.log"; exit 1; }
  # frames follow; how many depends on where the signal found the process (unwinding stops at code
  # oneDNN generated at run time, which has no unwind tables)
  frames=$(grep -a -A 64 "fatal signal" "$work/$name.log" | grep -acE '\[0x[0-9a-f]+\]$')
  [ "$frames" -ge 2 ] || { echo "FAIL: $name: no backtrace"; grep -a -A 8 "fatal signal" "$work/$name.log"; exit 1; }
done
echo "PASS"
