#!/usr/bin/env bash
# llmt bench --sweep through the executable: one JSON line per point appended to --results, each with
# what ran (commit, host, CPU, libraries) and an MFU against the measured matmul peak; a point that
# cannot fit the node's memory is recorded as out of memory and the sweep goes on. Not a speed test:
# no figure is compared with anything. Usage: bench_sweep.sh path/to/llmt
set -uo pipefail
llmt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo '{"already": "here"}' > "$work/results.jsonl"  # --results appends
OMP_NUM_THREADS=1 "$llmt" bench --model gpt2-tiny --steps 2 --warmup 1 --threads 1 \
  --sweep per_device_train_batch_size=2,500000 --sweep seq_len=32,64 --results "$work/results.jsonl" \
  > "$work/out.jsonl" 2> "$work/err.log" || { echo "FAIL: llmt bench"; cat "$work/err.log"; exit 1; }
python3 - "$work/results.jsonl" "$work/out.jsonl" << 'PY' || exit 1
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert lines[0] == {"already": "here"}, "FAIL: --results did not append"
points = lines[1:]
assert len(points) == 4, f"FAIL: {len(points)} points, expected 4"
assert [p["point"] for p in points] == [1, 2, 3, 4]
assert [(p["batch"], p["seq_len"]) for p in points] == [(2, 32), (2, 64), (500000, 32), (500000, 64)]
for p in points[:2]:
    # the MFU is against a peak measured once at start: on a shared, busy host the peak can be measured
    # in a slow moment and the steps in a quick one, so only an absurd ratio is a failure
    assert not p.get("oom") and p["tokens_per_s"] > 0 and 0 < p["mfu"] < 20, f"FAIL: {p}"
    for k in ("step_ms_median", "step_ms_p10", "step_ms_p90", "tokens_per_s_per_rank", "achieved_gflops",
              "peak_gflops_per_rank", "memory_gib", "comm_bytes_per_step_per_rank"):
        assert k in p, f"FAIL: no {k}"
    # the backend's counters over the measured steps: one launch per op on the CPU, and at least
    # the loss read back each step
    assert p["launches_per_step"] > 50 and p["host_syncs_per_step"] >= 1, f"FAIL: counters {p}"
for p in points[2:]:
    assert p.get("oom") is True and "out of memory: llmt plan needs" in p["error"], f"FAIL: {p}"
m = points[0]["machine"]
assert m["commit"] and m["host"] and m["cpu"] and "oneDNN" in m["libraries"]["matmul"], f"FAIL: {m}"
assert len([json.loads(l) for l in open(sys.argv[2])]) == 4, "FAIL: stdout lines"
print(f"4 points: 2 measured ({points[0]['tokens_per_s']:.0f}, {points[1]['tokens_per_s']:.0f} tok/s), 2 out of memory; "
      f"commit {m['commit']}")
PY
grep -q "matmul peak here: .* GFLOP/s per rank" "$work/err.log" || { echo "FAIL: the peak is not printed"; exit 1; }
[ "$(grep -c "matmul peak here" "$work/err.log")" -eq 1 ] || { echo "FAIL: the peak was printed more than once"; exit 1; }
echo PASS
