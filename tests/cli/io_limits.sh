#!/usr/bin/env bash
# Inputs that never end and outputs that cannot be written (issue 23): data files that are not regular
# files are refused at once (hashing /dev/zero never ended); a SIGTERM or SIGINT while a large file is
# hashed ends the process promptly; `llmt tokenize` bounds a line read from a stream; every output
# llmt writes (standard output, metrics.jsonl) fails with an error naming it when the disk is full
# (/dev/full stands in for one). Issue 33: SIGINT saves as SIGTERM does; tokenize takes bytes and
# refuses --bench of a device; a single process's error is its one line; an unusable token cache is
# not reported as written.
# Usage: io_limits.sh path/to/llmt path/to/tokenizer_dir
set -uo pipefail
set -m  # background jobs keep SIGINT (a non-interactive shell would start them with it ignored)
llmt=$1
tok=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
for i in $(seq 2000); do echo "the quick brown fox $i jumps over the lazy dog"; done > "$work/corpus.txt"
common=(--model_config gpt2-tiny --tokenizer_name_or_path bytes --block_size 32 --max_steps 2 --threads 1
        --save_strategy no --per_device_train_batch_size 4 --cache_dir "$work/cache")

# 1. a data file that is a device, a pipe or a directory: refused at once, naming it
for src in "--train_file /dev/zero" "--data_path /dev/zero" "--train_file $work"; do
  # shellcheck disable=SC2086
  if timeout -k 5 20 "$llmt" train "${common[@]}" $src --output_dir "$work/o1" > "$work/e1.log" 2>&1; then
    fail "$src was accepted"
  fi
  [ $? -ne 124 ] || fail "$src: still running after 20 s"
  grep -q "not a regular file" "$work/e1.log" || { cat "$work/e1.log"; fail "$src: no clear error"; }
done
mkfifo "$work/fifo"
if timeout -k 5 20 "$llmt" train "${common[@]}" --train_file "$work/fifo" --output_dir "$work/o2" > "$work/e2.log" 2>&1; then
  fail "a pipe was accepted"
fi
grep -q "fifo is a pipe, not a regular file" "$work/e2.log" || { cat "$work/e2.log"; fail "a pipe: no clear error"; }
echo "/dev/zero, a directory and a pipe as data: refused at once"

# 2. SIGTERM and SIGINT while a large file is hashed: the process ends within seconds (it took as long
# as the hash: minutes for this 64 GB sparse file)
truncate -s 64G "$work/huge.txt"
for sig in TERM INT; do
  "$llmt" train "${common[@]}" --train_file "$work/huge.txt" --output_dir "$work/o3" > "$work/e3.log" 2>&1 &
  job=$!
  sleep 1.5
  kill -0 $job 2> /dev/null || { cat "$work/e3.log"; fail "SIG$sig: the run ended before the signal"; }
  kill -$sig $job
  t0=$(date +%s%N)
  for _ in $(seq 100); do kill -0 $job 2> /dev/null || break; sleep 0.1; done
  if kill -0 $job 2> /dev/null; then kill -9 $job; fail "SIG$sig: still running 10 s after the signal"; fi
  wait $job
  rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  [ $rc -ne 0 ] || fail "SIG$sig: the interrupted run exited 0"
  if [ $sig = TERM ]; then
    grep -q "stopped by SIGTERM while hashing .*huge.txt" "$work/e3.log" || { cat "$work/e3.log"; fail "SIGTERM: no message"; }
  fi
  echo "SIG$sig while hashing a 64 GB file: ended in $ms ms (status $rc)"
done

# 3. llmt tokenize from an endless stream: a bounded line, a clear error, bounded memory
# (under a 4 GB address-space limit: it used to grow without bound)
(ulimit -v 4000000; /usr/bin/time -f "%M" -o "$work/rss.txt" timeout -k 5 30 "$llmt" tokenize \
  --tokenizer_name_or_path "$tok" < /dev/zero > /dev/null 2> "$work/e4.log")
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat "$work/e4.log"; fail "tokenize < /dev/zero: status $rc"; }
grep -q "stdin line 1 is longer than 16 MiB" "$work/e4.log" || { cat "$work/e4.log"; fail "tokenize < /dev/zero: no clear error"; }
rss=$(tail -n 1 "$work/rss.txt")
[ "$rss" -lt 600000 ] || fail "tokenize < /dev/zero peaked at $rss KiB"
echo "tokenize < /dev/zero: refused at a 16 MiB line, peak RSS $((rss / 1024)) MiB"

# 4. outputs to a full disk: standard output and metrics.jsonl
printf 'hello\nworld\n' | "$llmt" tokenize --tokenizer_name_or_path "$tok" > "$work/ok.txt" || fail "tokenize to a file"
[ "$(wc -l < "$work/ok.txt")" -eq 2 ] || fail "tokenize wrote $(wc -l < "$work/ok.txt") lines for 2"
if printf 'hello\n' | "$llmt" tokenize --tokenizer_name_or_path "$tok" > /dev/full 2> "$work/e5.log"; then
  fail "tokenize > /dev/full exited 0"
fi
grep -q "writing standard output failed: No space left on device" "$work/e5.log" || { cat "$work/e5.log"; fail "tokenize > /dev/full: no clear error"; }
if seq 200000 | "$llmt" tokenize --tokenizer_name_or_path "$tok" > /dev/full 2> "$work/e6.log"; then
  fail "tokenize of many lines > /dev/full exited 0"
fi
grep -q "writing standard output failed at input line" "$work/e6.log" || { cat "$work/e6.log"; fail "no line named"; }
if "$llmt" plan --model gpt2-tiny --seq_len 64 --json > /dev/full 2> "$work/e7.log"; then fail "plan --json > /dev/full exited 0"; fi
grep -q "writing standard output failed" "$work/e7.log" || { cat "$work/e7.log"; fail "plan > /dev/full: no clear error"; }
mkdir -p "$work/m"
ln -s /dev/full "$work/m/metrics.jsonl"
if "$llmt" train "${common[@]}" --train_file "$work/corpus.txt" --output_dir "$work/m" > "$work/e8.log" 2>&1; then
  fail "a run whose metrics.jsonl cannot be written exited 0"
fi
grep -q "writing $work/m/metrics.jsonl failed: No space left on device" "$work/e8.log" \
  || { cat "$work/e8.log"; fail "metrics.jsonl on a full disk: no clear error"; }
echo "tokenize, plan and metrics.jsonl on a full disk: errors naming the output"

# 5. (issue 33) SIGINT (Ctrl-C) during training saves a checkpoint and exits 0, as SIGTERM and SIGUSR1
# do (it ended the run with nothing saved); a second SIGINT exits at once
long=(--model_config gpt2-tiny --tokenizer_name_or_path bytes --block_size 32 --max_steps 100000 --threads 1
      --save_strategy no --per_device_train_batch_size 4 --cache_dir "$work/cache" --logging_steps 1
      --train_file "$work/corpus.txt")
"$llmt" train "${long[@]}" --output_dir "$work/int" > "$work/int.log" 2>&1 &
job=$!
for _ in $(seq 300); do grep -q "step .*10/" "$work/int.log" && break; sleep 0.1; done
kill -INT $job
wait $job
rc=$?
[ $rc -eq 0 ] || { tail -5 "$work/int.log"; fail "SIGINT during training: status $rc"; }
ls "$work/int" | grep -q '^checkpoint-[0-9]*$' || { tail -5 "$work/int.log"; fail "SIGINT: no checkpoint"; }
grep -q "stopped at step [0-9]* of 100000 by a signal" "$work/int.log" || fail "SIGINT: no stop line"
"$llmt" train "${long[@]}" --output_dir "$work/int2" > "$work/int2.log" 2>&1 &
job=$!
for _ in $(seq 300); do grep -q "step .*10/" "$work/int2.log" && break; sleep 0.1; done
kill -INT $job
sleep 0.05
kill -INT $job
wait $job
rc=$?
[ $rc -eq 130 ] && grep -q "a second SIGINT: exiting now" "$work/int2.log" ||
  { tail -5 "$work/int2.log"; fail "a second SIGINT: status $rc"; }
echo "SIGINT during training: a checkpoint and status 0; a second SIGINT: status 130 at once"
# the same when the output's reader is gone first, as Ctrl-C under `llmt train | tee log` ends tee:
# the next log line into the closed pipe raised SIGPIPE and killed the rank before it saved
mkfifo "$work/pipe"
"$llmt" train "${long[@]}" --output_dir "$work/int3" > "$work/pipe" 2>&1 &
job=$!
head -c 100 "$work/pipe" > /dev/null  # reads a little, then closes the pipe
for _ in $(seq 300); do [ "$(cat "$work/int3/metrics.jsonl" 2> /dev/null | wc -l)" -ge 3 ] && break; sleep 0.1; done
kill -INT $job 2> /dev/null
wait $job
rc=$?
# (status 1 is right: its standard output was lost, which main reports at the end)
[ $rc -ne 141 ] || fail "SIGINT after the output's reader was gone: killed by SIGPIPE before it saved"
ls "$work/int3" | grep -q '^checkpoint-[0-9]*$' || fail "SIGINT after the output's reader was gone: no checkpoint"
echo "SIGINT after the output's reader was gone: a checkpoint (status $rc)"

# 6. llmt tokenize takes bytes as train and generate do; --bench of a device is refused at once (it grew
# to 3.5 GiB in 6 s from /dev/zero), naming it
[ "$(printf 'hi\n' | "$llmt" tokenize --tokenizer_name_or_path bytes)" = "104 105" ] || fail "tokenize with bytes"
[ "$(printf '104 105\n' | "$llmt" tokenize --tokenizer_name_or_path bytes --decode)" = "hi" ] || fail "decode with bytes"
(ulimit -v 4000000; timeout -k 5 30 "$llmt" tokenize --tokenizer_name_or_path "$tok" --bench /dev/zero > /dev/null \
  2> "$work/e9.log")
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat "$work/e9.log"; fail "tokenize --bench /dev/zero: status $rc"; }
grep -q "llmt tokenize --bench /dev/zero: is a character device, not a regular file" "$work/e9.log" ||
  { cat "$work/e9.log"; fail "tokenize --bench /dev/zero: no clear error"; }
echo "tokenize: bytes accepted; --bench /dev/zero refused at once"

# 7. a single process's error is its one line: Open MPI's 8-line MPI_ABORT banner (and, after
# MPI_Abort, ORTE_ERROR_LOG lines) followed it
for cmd in "export $work/none $work/out" "generate --model_name_or_path $work/none --prompt x"; do
  # shellcheck disable=SC2086
  if "$llmt" $cmd > "$work/e10.out" 2> "$work/e10.log"; then fail "llmt $cmd exited 0"; fi
  [ "$(wc -l < "$work/e10.log")" -eq 1 ] && grep -q "^error: " "$work/e10.log" ||
    { cat "$work/e10.log"; fail "llmt $cmd: more than its error line"; }
done
if "$llmt" train "${common[@]}" --train_file "$work/none.txt" --output_dir "$work/o10" > "$work/e11.log" 2>&1; then
  fail "a missing train file was accepted"
fi
! grep -q "MPI_ABORT\|ORTE_ERROR_LOG" "$work/e11.log" || { cat "$work/e11.log"; fail "train: MPI's abort noise"; }
echo "single-process errors: the error line alone"

# 8. a token cache directory that cannot be made (a path under a file): tokenized from memory, and the
# data line says so (it said "token cache written <path>" of a file that does not exist)
"$llmt" train "${common[@]}" --train_file "$work/corpus.txt" --cache_dir "$work/corpus.txt/cache" --output_dir "$work/o12" \
  > "$work/e12.log" 2>&1 || { tail -5 "$work/e12.log"; fail "training with an unusable cache directory"; }
grep -q "tokenized without a token cache ($work/corpus.txt/cache/.* could not be written)" "$work/e12.log" &&
  ! grep -q "token cache written" "$work/e12.log" || { cat "$work/e12.log"; fail "the data line claims a cache file"; }
echo "an unusable cache directory: the data line says nothing was written"
