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
    # the loss read back each step; and no allocation inside a step
    assert p["launches_per_step"] > 50 and p["host_syncs_per_step"] >= 1, f"FAIL: counters {p}"
    assert p["allocs_per_step"] == 0, f"FAIL: a step allocates: {p['allocs_per_step']}"
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
# --bf16 on the CPU: the JSON says which kernel each shape class of the bf16 matmuls ran, measured
# the first time and read from the cache file (in $LLMT_CACHE) the next; LLMT_CPU_BF16_MATMUL forces one
for run in measured cache fp32; do
  mode=auto
  [ "$run" = fp32 ] && mode=fp32
  LLMT_CACHE="$work/cache" LLMT_CPU_BF16_MATMUL=$mode OMP_NUM_THREADS=1 "$llmt" bench --model gpt2-tiny --steps 1 \
    --warmup 0 --threads 1 --bf16 True > "$work/bf16_$run.json" 2> "$work/bf16_$run.log" \
    || { echo "FAIL: llmt bench --bf16 True ($run)"; cat "$work/bf16_$run.log"; exit 1; }
  python3 - "$work/bf16_$run.json" "$run" << 'PY' || exit 1
import json, sys
p = json.loads(open(sys.argv[1]).read())
run = sys.argv[2]
k = p["cpu_bf16_matmul_kernels"]
assert {"NT s.s.s", "NN s.s.s", "TN+= s.s.s ->f32"} <= set(k), f"FAIL: the shape classes: {sorted(k)}"
for cls, c in k.items():
    assert c["kernel"] in ("bf16", "fp32"), f"FAIL: {cls}: {c}"
    if run == "fp32":
        assert c["kernel"] == "fp32" and c["source"] == "forced by LLMT_CPU_BF16_MATMUL=fp32", f"FAIL: {cls}: {c}"
    else:
        assert c["source"] == run and c["fp32_ms"] > 0 and c["bf16_ms"] > 0, f"FAIL ({run}): {cls}: {c}"
        assert c["kernel"] == ("bf16" if c["bf16_ms"] < c["fp32_ms"] else "fp32"), f"FAIL: not the faster: {cls}: {c}"
print(f"bf16 matmul kernels ({run}): " + ", ".join(f"{cls}: {c['kernel']}" for cls, c in sorted(k.items())))
PY
done
ls "$work"/cache/cpu-bf16-matmul-*.txt > /dev/null || { echo "FAIL: no cache file in $work/cache"; exit 1; }
echo PASS
