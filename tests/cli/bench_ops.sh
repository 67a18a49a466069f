#!/usr/bin/env bash
# llmt bench --ops: attention forward and backward, the memory-bound kernels (norm, loss, AdamW) and
# the three products of each of a block's matmuls and the LM head, one JSON line each, on the CPU and on the CUDA backend (in ctest the
# emulator, whose device has no known peak). Not a speed test: no figure is compared with anything.
# Usage: bench_ops.sh path/to/llmt path/to/llmt_simt
set -uo pipefail
llmt=$1
simt=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(bench --ops True --model llama-tiny --seq_len 16 --per_device_train_batch_size 2 --steps 2 --warmup 1 --threads 1)
OMP_NUM_THREADS=1 "$llmt" "${args[@]}" --bf16 True > "$work/cpu.jsonl" 2> "$work/cpu.err" ||
  { echo "FAIL: llmt bench --ops on the cpu"; cat "$work/cpu.err"; exit 1; }
OMP_NUM_THREADS=1 "$simt" "${args[@]}" --device cuda > "$work/cuda.jsonl" 2> "$work/cuda.err" ||
  { echo "FAIL: llmt_simt bench --ops --device cuda"; cat "$work/cuda.err"; exit 1; }
python3 - "$work/cpu.jsonl" "$work/cuda.jsonl" << 'PY' || exit 1
import json, sys
memory = ["rmsnorm.forward", "rmsnorm.backward", "cross_entropy", "adamw.block"]  # llama-tiny: no biases
attention = ["attention.forward", "attention.backward", "attention.forward.packed", "attention.backward.packed"]
names = attention + memory + [
    f"{m}.{p}" for m in ("qkv", "attn_proj", "mlp_in", "mlp_out", "lm_head") for p in ("forward", "backward_input", "backward_weight")]
for path, device, dtype in ((sys.argv[1], "cpu", "bf16"), (sys.argv[2], "cuda", "f32")):
    lines = [json.loads(l) for l in open(path)]
    assert [l["name"] for l in lines] == names, f"FAIL: {device}: ops {[l['name'] for l in lines]}"
    compute = [l for l in lines if l["op"] != "memory"]
    for l in lines:
        assert l["device"] == device and l["compute_dtype"] == dtype and l["ms_median"] > 0, f"FAIL: {l}"
        if l["op"] == "memory":  # bytes moved, GB/s; no known bandwidth on the CPU or the emulator
            assert l["bytes"] > 0 and l["gb_per_s"] > 0 and l["fraction_of_bandwidth"] is None, f"FAIL: {l}"
            continue
        assert l["tflops"] > 0, f"FAIL: {l}"
        if l["op"] == "matmul":
            assert abs(l["gflop"] * 1e9 - 2 * l["M"] * l["N"] * l["K"]) < 1, f"FAIL: FLOPs of {l}"
    by_name = {l["name"]: l for l in lines}
    # T = 16 in four documents of 4 tokens a row, 2 rows: 8 documents, a quarter of the causal FLOPs of
    # whole rows (2 sum of L^2 over 2 T^2)
    packed, whole = by_name["attention.forward.packed"], by_name["attention.forward"]
    assert packed["documents"] == 8, f"FAIL: {packed}"
    assert abs(packed["gflop"] * 4 - whole["gflop"]) < 1e-12, f"FAIL: packed FLOPs {packed['gflop']} vs {whole['gflop']}"
    qkv = by_name["qkv.forward"]
    assert (qkv["M"], qkv["N"], qkv["K"]) == (32, 64 + 2 * 2 * 16, 64), f"FAIL: the qkv shape {qkv}"
    # an rmsnorm forward over [32, 64] reads x and writes y (2 bytes each in bf16, 4 in f32) and rstd
    norm = by_name["rmsnorm.forward"]
    assert norm["bytes"] == 32 * 64 * 2 * (2 if dtype == "bf16" else 4) + 32 * 4, f"FAIL: the norm's bytes {norm}"
    if device == "cpu":
        assert all(0 < l["fraction_of_peak"] for l in compute), "FAIL: no fraction of the measured peak"
    else:
        assert all(l["peak_tflops"] == 0 and l["fraction_of_peak"] is None for l in compute), "FAIL: the emulator has a peak"
    print(f"{device}: {len(lines)} ops, attention backward {lines[1]['ms_median']:.3f} ms")
PY
# and one training step on the emulated CUDA backend: its counters in the JSON (kernel launches
# counted where kernels launch) beside the op breakdown
OMP_NUM_THREADS=1 "$simt" bench --model gpt2-tiny --seq_len 16 --per_device_train_batch_size 2 --steps 2 --warmup 1 \
  --threads 1 --device cuda > "$work/step.jsonl" 2> "$work/step.err" ||
  { echo "FAIL: llmt_simt bench --device cuda"; cat "$work/step.err"; exit 1; }
python3 - "$work/step.jsonl" << 'PY' || exit 1
import json, sys
p = json.loads(open(sys.argv[1]).readline())
assert p["device"] == "cuda" and p["launches_per_step"] > 50, f"FAIL: counters {p}"
# a step that logs nothing waits for the device once: the read of its loss and gradient norm
assert p["host_syncs_per_step"] == 1, f"FAIL: {p['host_syncs_per_step']} host syncs a step, expected 1"
assert p["allocs_per_step"] == 0, f"FAIL: a step allocates device memory (a device-wide wait): {p['allocs_per_step']}"
assert {"matmul", "attention", "norms", "loss", "adamw"} <= set(p["breakdown_ms"]), f"FAIL: {p['breakdown_ms']}"
print(f"cuda step: {p['launches_per_step']:.0f} launches, {p['host_syncs_per_step']:.0f} host syncs, no allocation")
PY
echo PASS
