#!/usr/bin/env bash
# scripts/plot.py renders its charts from fixtures (tests/reference/plot: llmt bench --results lines,
# one of them out of memory, and a run's metrics.jsonl with a checkpoint): each PNG is a real image
# of the expected size, the sweep charts with the step time's p10-p90 spread as error bars, a
# two-rank run with its per-rank row. Skipped (77) without matplotlib. Usage: plot_test.sh SOURCE_DIR
set -uo pipefail
src=$1
python3 -c "import matplotlib" 2> /dev/null || { echo "plot_test.sh: skipped: no matplotlib (pip install -r scripts/requirements-plot.txt)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$src/tests/reference/plot/run" "$work/run"
python3 "$src/scripts/plot.py" bench "$src/tests/reference/plot/bench_results.jsonl" --out "$work/charts" \
  > "$work/bench.out" || { echo "FAIL: plot.py bench"; exit 1; }
# every point that ran carries its p10-p90 error bars (counted from the drawn figure); a line without
# the spread (older results) has none, and the rest still do
for chart in bench_batch bench_seq_len; do
  grep -q "^plot.py: $chart.png: error bars on 8 tokens/s and 8 MFU points of 8$" "$work/bench.out" \
    || { echo "FAIL: $chart's error bars"; cat "$work/bench.out"; exit 1; }
done
python3 -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
del rows[0]['step_ms_p10'], rows[0]['step_ms_p90']
open(sys.argv[2], 'w').write(''.join(json.dumps(r) + '\n' for r in rows))" \
  "$src/tests/reference/plot/bench_results.jsonl" "$work/no_spread.jsonl"
python3 "$src/scripts/plot.py" bench "$work/no_spread.jsonl" --out "$work/charts2" > "$work/bench2.out" &&
  grep -q "^plot.py: bench_batch.png: error bars on 7 tokens/s and 7 MFU points of 8$" "$work/bench2.out" \
  || { echo "FAIL: a line without its spread"; cat "$work/bench2.out"; exit 1; }
python3 "$src/scripts/plot.py" run "$work/run" > "$work/run.out" || { echo "FAIL: plot.py run"; exit 1; }
# the title names the run by its directory's name, never the machine's absolute path
grep -q "^plot.py: title: run; checkpoints at" "$work/run.out" || { echo "FAIL: the title"; cat "$work/run.out"; exit 1; }
python3 "$src/scripts/plot.py" run "$work/run" --title "my sweep" --out "$work/titled.png" > "$work/titled.out" &&
  grep -q "title: my sweep" "$work/titled.out" || { echo "FAIL: --title"; cat "$work/titled.out"; exit 1; }
# a two-rank run with rank 1 slowed (LLMT_TEST_SLOW_RANK): the third row, each rank's compute and
# waits, with the two logging steps that named rank 1 marked (the second and third)
cp -r "$src/tests/reference/plot/ranks" "$work/ranks"
python3 "$src/scripts/plot.py" run "$work/ranks" > "$work/ranks.out" &&
  grep -q "^plot.py: per-rank times of 2 ranks at 3 steps, 2 slow-rank marks$" "$work/ranks.out" \
  || { echo "FAIL: the per-rank row"; cat "$work/ranks.out"; exit 1; }
# width x height from the PNG header (IHDR), and the signature
for png in "$work/charts/bench_batch.png" "$work/charts/bench_seq_len.png" "$work/run/curves.png" "$work/ranks/curves.png"; do
  size=$(python3 -c "
import struct, sys
b = open(sys.argv[1], 'rb').read(24)
assert b[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG'
print('%dx%d' % struct.unpack('>II', b[16:24]))" "$png") || { echo "FAIL: $png is not a PNG"; exit 1; }
  echo "$(basename "$png"): $size"
  case "$size" in 1320x495|1210x770|1210x1155) ;; *) echo "FAIL: $png is $size"; exit 1 ;; esac
done
# a broken line names the file and the line
printf '{"model": "x"}\nnot json\n' > "$work/bad.jsonl"
if python3 "$src/scripts/plot.py" bench "$work/bad.jsonl" --out "$work/x" 2> "$work/err"; then echo "FAIL: a broken file plotted"; exit 1; fi
grep -q "bad.jsonl line 2: not JSON" "$work/err" || { echo "FAIL: the error"; cat "$work/err"; exit 1; }
echo PASS
