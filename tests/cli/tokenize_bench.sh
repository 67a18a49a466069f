#!/usr/bin/env bash
# llmt tokenize --bench measures the bytes of a real file; a directory, an empty or a missing file is
# an error naming it (a directory opened as a stream read as nothing: "bytes": 0 and exit 0).
# Usage: tokenize_bench.sh path/to/llmt path/to/a/tokenizer/dir
set -uo pipefail
llmt=$1
tok=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 500); do echo "line $i of a text to encode"; done > "$work/text.txt"
size=$(stat -c %s "$work/text.txt")
out=$("$llmt" tokenize --tokenizer_name_or_path "$tok" --bench "$work/text.txt" --bench_repeats 1) ||
  { echo "FAIL: --bench of a file failed"; exit 1; }
echo "$out" | grep -q "\"bytes\": $size," || { echo "FAIL: expected \"bytes\": $size in: $out"; exit 1; }
echo "ok   a file of $size bytes is measured as $size bytes"

refused() {  # refused NAME PATH TEXT: --bench PATH must fail and say TEXT
  if out=$("$llmt" tokenize --tokenizer_name_or_path "$tok" --bench "$2" 2>&1); then
    echo "FAIL: --bench of $1 exited 0: $out"; exit 1
  fi
  echo "$out" | grep -qF -- "$3" || { echo "FAIL: --bench of $1 should say '$3', said: $out"; exit 1; }
  echo "ok   $1: $out"
}
mkdir "$work/dir"
refused "a directory" "$work/dir" "--bench $work/dir: is a directory"
: > "$work/empty.txt"
refused "an empty file" "$work/empty.txt" "--bench $work/empty.txt: the file is empty"
refused "a missing file" "$work/missing.txt" "--bench $work/missing.txt: No such file"
echo PASS
